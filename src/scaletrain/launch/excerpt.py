"""What a failed rank's stderr says: its lines without torch's prefix, the program's own line
that raised, the error, and which launcher variable the program missed.

Once a program has called ``init_process_group``, torch's exception hook writes every line of
a traceback as ``[rank0]: ...``; before it, the lines are Python's own. Everything here reads
both the same way (:func:`clean`). A traceback's frames are torch's, a library's or the
program's; the excerpt the launcher prints after a failure starts at the program's own frame
(the last one in its files, :func:`scaletrain.launch.frames.is_program_file`) and ends with
the error, so the user reads the line to fix rather than the frames above it.

The launcher-variable hint covers the shapes of a variable a launcher did not set:
``os.environ["SLURM_LOCALID"]`` (a ``KeyError``) and ``int(os.getenv("SLURM_LOCALID"))`` /
``os.environ.get("SLURM_NODEID").split()`` (a ``TypeError`` or ``AttributeError`` on
``NoneType``, where the program's line names the variable without a default).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from scaletrain.launch.frames import is_program_file, short_path

# torch's exception hook (distributed_c10d.init_process_group) and its C++ log lines:
# "[rank0]: Traceback ...", "[rank0]:[W1027 12:00:00.1 ProcessGroupNCCL.cpp:...] ..."
TORCH_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
# Python 3.11+'s markers under a frame's code: "    ^^^^^^", "    ~~~~~^^^^^"
_MARKERS = re.compile(r"^\s*[\^~]+\s*$")
# The last line of a traceback for ``os.environ["NAME"]`` of a variable that is not set
_KEY_ERROR = re.compile(r"^KeyError: '([A-Z][A-Z0-9_]*)'$")
# ``os.getenv("NAME")`` / ``os.environ.get("NAME")`` without a default: None when it is not set
_GET_WITHOUT_DEFAULT = re.compile(r"""(?:getenv|environ\.get)\(\s*["']([A-Z][A-Z0-9_]*)["']\s*\)""")
# a C++ log line of torch's after the traceback ("[W1027 12:00:00.1 ProcessGroup.cpp:9] ...")
_LOG_LINE = re.compile(r"^\[[WEIF]\d{4}")
_NONE_ERROR = re.compile(r"^(TypeError|AttributeError): .*\bNoneType\b")

# Who sets which variables: (name prefixes, names, the launcher, its --emulate mode or None)
_SETTERS = (
    (("SLURM_", "SRUN_"), (), "srun", "slurm"),
    (("OMPI_",), (), "Open MPI's mpirun", "mpi"),
    (("PMI_", "PMIX_", "MV2_", "PALS_", "MPI_LOCAL"), (), "an MPI launcher (mpirun, mpiexec)", None),
    (("TORCHELASTIC_",), ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                          "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT"), "torchrun", "torchrun"),
)


def clean(lines: Sequence[str]) -> list[str]:
    """``lines`` without torch's ``[rankN]:`` prefix."""
    return [TORCH_PREFIX.sub("", line, count=1) for line in lines]


@dataclass(frozen=True, kw_only=True)
class Excerpt:
    """The end of a traceback: the program's own frame that raised (None where none of the
    frames read is the program's) and the error's lines."""

    where: str | None     # "train.py:12 in setup"
    code: str | None      # that frame's line of code, stripped
    error: tuple[str, ...]


def traceback_excerpt(lines: Sequence[str]) -> Excerpt | None:
    """The excerpt of the last traceback in ``lines`` (torch's prefixes or not), or None where
    they hold no frame and error (a program that printed its own message and exited)."""
    text = clean(lines)
    frames = [i for i, line in enumerate(text) if _FRAME.match(line)]
    if not frames:
        return None
    last = frames[-1]
    error_at = next((i for i in range(last + 1, len(text))
                     if text[i].strip() and not text[i].startswith((" ", "\t"))), None)
    if error_at is None:
        return None
    error: list[str] = []
    for line in text[error_at:error_at + 4]:   # a message may take a few lines; not what follows
        if not line.strip() or (error and _LOG_LINE.match(line)):
            break
        error.append(line.rstrip())
    for i in reversed(frames):
        found = _FRAME.match(text[i])
        assert found is not None
        if not is_program_file(found.group("path")):
            continue
        code = text[i + 1].strip() if i + 1 < len(text) and not _FRAME.match(text[i + 1]) \
            and not _MARKERS.match(text[i + 1]) and text[i + 1].startswith((" ", "\t")) else None
        func = found.group("func")
        where = f"{short_path(found.group('path'))}:{found.group('line')}" + \
            (f" in {func}" if func else "")
        return Excerpt(where=where, code=code, error=tuple(error))
    return Excerpt(where=None, code=None, error=tuple(error))


def missing_variable_hint(stderr_tail: Sequence[str], emulate: str | None) -> str | None:
    """The hint for a rank that died on a variable a launcher sets (srun, mpirun, torchrun) and
    this run did not: ``KeyError: 'NAME'``, or an error on ``None`` where the program's line
    reads NAME without a default. Which launcher, and how to give it; None for any other
    failure (a KeyError of the program's own keys included)."""
    excerpt = traceback_excerpt(stderr_tail)
    last = clean(stderr_tail)
    names: list[str] = []
    error = excerpt.error if excerpt is not None else tuple(line.strip() for line in last[-1:])
    key = next((m.group(1) for line in error if (m := _KEY_ERROR.match(line.strip()))), None)
    if key is not None:
        names.append(key)
    elif excerpt is not None and excerpt.code and any(_NONE_ERROR.match(e) for e in error):
        names.extend(_GET_WITHOUT_DEFAULT.findall(excerpt.code))
    for name in names:
        hint = _hint_for(name, emulate)
        if hint is not None:
            return hint
    return None


def _hint_for(name: str, emulate: str | None) -> str | None:
    for prefixes, exact, launcher, mode in _SETTERS:
        if name.startswith(prefixes) or name in exact:
            break
    else:
        return None
    said = f"the program reads {name}, which {launcher} sets and this run did not"
    default = f"give it a default (os.environ.get('{name}', ...))"
    if mode == "torchrun":
        if emulate is None:  # scaletrain run sets every one of them
            return None
        return (f"{said}: --emulate {emulate} gives the program that launcher's view, without "
                f"torchrun's variables; export {name} before 'scaletrain run' as the batch "
                f"script would, or {default}")
    if mode is not None and mode == emulate:
        return (f"{said}: {launcher} sets it only when the job asks for it; export {name}=VALUE "
                f"before 'scaletrain run' as the job would have it, or {default}")
    if mode is not None:
        return (f"{said}: run it with 'scaletrain run --emulate {mode}' to give the program "
                f"{launcher}'s variables, or {default}")
    return f"{said}: {default}"
