"""Reading and writing checkpoint files without ever running a pickled object.

- ``torch.save`` files are read with ``torch.load(weights_only=True)``: tensors, numbers,
  strings, lists, tuples and dicts only. Anything else is refused with a CheckpointError that
  names the file, before any of it runs.
- ``torch.distributed.checkpoint`` (DCP) has two unsafe spots in torch 2.13: its ``.metadata``
  file is read with a bare ``pickle.load`` (``FileSystemReader.read_metadata``), and non-tensor
  entries ("bytes") with ``torch.load(weights_only=False)`` (``DefaultLoadPlanner.load_bytes``).
  :class:`SafeReader` reads the metadata with an unpickler that admits only DCP's own metadata
  classes, dtypes and ``torch.Size``; :func:`safe_planner` loads bytes entries with
  ``weights_only=True``.
- Truncated or garbage files become one-line CheckpointErrors (which step, which file, a hint).
"""

from __future__ import annotations

import enum
import gc
import io
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scaletrain.checkpoint.errors import CheckpointError, unreadable, unsafe
from scaletrain.fileio import check_regular, open_regular

# What DCP's .metadata may name, (module, name); dtypes are checked separately.
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


def save_file(obj: Any, path: Path) -> tuple[int, tuple[str, str]]:
    """``torch.save`` into ``path``, then fsync; returns the size in bytes and the checksums
    (the whole file's, its blocks', as the marker spells them).

    The checksums are taken from the buffers on their way to the file (:mod:`checksum`), so the
    file is never read back. torch writes a tensor's storage in one call, so the Python calls per
    file are a few per tensor, not one per byte.
    """
    import torch

    from scaletrain.checkpoint.checksum import ChecksumWriter, hex_crc, our_crc_only

    with ChecksumWriter(open(path, "wb")) as stream, our_crc_only():
        torch.save(obj, stream)  # type: ignore[arg-type]  # a binary file object
        stream.flush()
        os.fsync(stream.fileno())
    return stream.size, (hex_crc(stream.crc), stream.block_hex())


def _is_weights_only_refusal(err: BaseException) -> bool:
    """torch refused a global (a class or function the file wants to call)."""
    return _refused_global(err) is not None


def _refused_global(err: BaseException) -> str | None:
    for line in str(err).splitlines():
        low = line.lower()
        if "unsupported global" in low or "unsupported class" in low or \
                ("global" in low and "blocked" in low):
            return line.strip()
    return None


def load_file(path: Path, *, step: int | None, map_location: Any = None,
              fallback: int | None = None, source: Any = None) -> Any:
    """``torch.load(weights_only=True)`` with one-line errors for unsafe or damaged files.

    ``source``: the open file to read ``path``'s bytes from (a ``verified.VerifiedFile``, which
    checks each byte it hands over); its mismatch is raised as such, whatever torch made of it.
    Not memory-mapped on purpose: ``Optimizer.load_state_dict`` keeps CPU tensors as given,
    so mapped ones would stay backed by the checkpoint file (deleted by retention later, or
    replaced on a shared file system: a SIGBUS in the middle of training).
    """
    import torch

    try:
        if source is None:
            check_regular(path)   # a pipe or device in the folder: refused, not waited on for ever
        return torch.load(path if source is None else source, map_location=map_location,
                          weights_only=True)
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError,
            IndexError, AttributeError, TypeError) as err:
        if getattr(source, "problem", None):   # torch wrapped our reader's refusal in its own
            from scaletrain.checkpoint.verified import Damaged

            raise Damaged(source.problem) from None
        if isinstance(err, FileNotFoundError):
            raise unreadable(step, path, "the file is missing", fallback=fallback) from None
        if _is_weights_only_refusal(err):
            raise unsafe(step, path, _refused_global(err) or "") from None
        what = "not a torch file" if isinstance(err, pickle.UnpicklingError) else "truncated or corrupt"
        raise unreadable(step, path, f"{what} ({_detail(err)})", fallback=fallback) from None


def _detail(err: BaseException) -> str:
    """The informative line of torch's message (its first line is often boilerplate)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    for line in lines:
        if "Unsupported operand" in line or "failed" in line.lower() or "EOF" in line:
            return line[:200]
    return _first_line(err)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= 200 else line[:197] + "..."


@contextmanager
def gc_paused() -> Iterator[None]:
    """Within the block, Python's cyclic garbage collector does not run (as it was after).

    Unpickling DCP's metadata and planning a load create thousands of small objects, which
    trigger full collections; in a training process (a model, an optimizer, their tensors'
    Python objects) one full collection took 70-100 ms here, twice per sharded load of 1.2 GB -
    more than the checksum. Nothing a load creates needs the collector: its cycles, if any, are
    collected after the block.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _enum_member(cls: Any, name: str) -> Any:
    """``getattr(cls, name)`` for an enum class the allow-list let in, and a member's name only:
    Python 3.12 (and some 3.11 builds) pickle an enum member as ``getattr(EnumClass, "NAME")``
    (DCP's ``_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT`` in every ``.metadata``)."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls.__members__[name]
    raise pickle.UnpicklingError(f"getattr({getattr(cls, '__name__', type(cls).__name__)}, {name!r}) "
                                 "in DCP metadata is not an enum member")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) == ("builtins", "getattr"):   # only ever applied to an allowed class
            return _enum_member
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"Unsupported global {module}.{name} in DCP metadata")


def read_dcp_metadata(path: Path, *, step: int | None = None, fallback: int | None = None,
                      tracker: Any = None) -> Any:
    """DCP's ``.metadata`` of the folder ``path``, unpickled with the allow-list above; through
    ``tracker`` (a ``verified.Tracker``), its bytes are read once and checked before."""
    meta_path = path / ".metadata"
    try:
        if tracker is not None:
            with tracker.open(tracker.rel(meta_path)) as src:
                data = src.read()
            return _MetadataUnpickler(io.BytesIO(data)).load()
        with open_regular(meta_path) as fh:
            return _MetadataUnpickler(fh).load()
    except CheckpointError:
        raise
    except pickle.UnpicklingError as err:
        if "Unsupported global" in str(err):
            raise unsafe(step, meta_path, _first_line(err)) from None
        raise unreadable(step, meta_path, f"corrupt ({_first_line(err)})",
                         fallback=fallback) from None
    except FileNotFoundError:
        raise unreadable(step, meta_path, "the file is missing", fallback=fallback) from None
    except (EOFError, ValueError, OSError, TypeError, AttributeError, IndexError) as err:
        raise unreadable(step, meta_path, f"truncated or corrupt ({_first_line(err)})",
                         fallback=fallback) from None


def safe_reader(path: Path, *, step: int | None = None, fallback: int | None = None,
                metadata: Any = None, tracker: Any = None) -> Any:
    """A DCP ``FileSystemReader`` whose metadata goes through :func:`read_dcp_metadata`
    (or is ``metadata``, when the caller read it already: the file is unpickled once), and whose
    reads go through ``tracker`` (``verified.filesystem``: every byte checked as it is read)."""
    given = metadata
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("rank") is not None:
                raise CheckpointError("per-rank DCP metadata is not supported",
                                      hint="this is a bug in scaletrain; please report it")
            metadata = given if given is not None else \
                read_dcp_metadata(Path(self.path), step=step, fallback=fallback, tracker=tracker)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    reader = SafeReader(str(path))
    if tracker is not None:
        from scaletrain.checkpoint.verified import filesystem

        reader.fs = filesystem(tracker)   # DCP's own attribute (every supported torch has it)
    return reader


def safe_planner(*, step: int | None = None, path: Path | None = None, **kwargs: Any) -> Any:
    """A DCP ``DefaultLoadPlanner`` that loads non-tensor entries with ``weights_only=True``."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    where = path or Path("sharded")

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as err:
                if _is_weights_only_refusal(err):
                    raise unsafe(step, where, _refused_global(err) or "") from None
                raise unreadable(step, where, f"corrupt entry ({_first_line(err)})") from None
            except (RuntimeError, EOFError, ValueError) as err:
                raise unreadable(step, where, f"corrupt entry ({_first_line(err)})") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict,
                            self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafePlanner(**kwargs)
