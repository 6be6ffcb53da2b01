"""Hostile and damaged checkpoints (issue 22, items 5 and 7): one line, the right words.

Markers with fields of the wrong shape, a file list that leaves the folder, rank files
without their RNG states, a replicated file whose content is not what the marker lists, two
jobs saving into one folder, and a hypothesis fuzz of markers: every case ends in a
CheckpointError with one line (or a fall-back to the previous step), never a traceback.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import marker_checksums, reseal

import scaletrain
from scaletrain.checkpoint.errors import CheckpointError


def _objects():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hostile") / "ck"
    model, opt = _objects()
    ckpt = scaletrain.Checkpointer(directory, keep=2)
    for step in (20, 30):
        ckpt.save(step, {"model": model, "optimizer": opt, "epoch": 1})
    ckpt.close()
    return directory


@pytest.fixture
def ck(pristine, tmp_path) -> Path:
    import shutil

    shutil.copytree(pristine, tmp_path / "ck")
    return tmp_path / "ck"


def _load(directory: Path, strict: bool = True) -> int | None:
    model, opt = _objects()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return scaletrain.Checkpointer(directory, strict=strict).load_latest(
            {"model": model, "optimizer": opt, "epoch": 0})


def _edit_marker(folder: Path, **fields) -> None:
    marker = json.loads((folder / "COMMIT.json").read_text())
    marker.update(fields)
    (folder / "COMMIT.json").write_text(json.dumps(marker))


def _forge(folder: Path, name: str, obj) -> None:
    """Replace a file with ``obj`` torch-saved, size and checksum fixed in the marker."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    reseal(folder, name, buf.getvalue())


def _one_line(err: CheckpointError) -> str:
    assert len(err.message.splitlines()) == 1 and err.hint
    return err.message


@pytest.mark.parametrize("objects, kind", [(5, "int"), (["model", "optimizer"], "list"),
                                           ({"model": 3}, None)])
def test_marker_objects_of_the_wrong_shape(ck, objects, kind):
    _edit_marker(ck / "step-00000030", objects=objects)
    with pytest.raises(CheckpointError) as info:
        _load(ck)
    text = _one_line(info.value)
    assert "step-00000030" in text and "'objects'" in text
    if kind:
        assert f"is a {kind}" in text
    assert _load(ck, strict=False) == 20  # without strict: the previous step, as for damage


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "sharded/../../x"])
def test_marker_listing_a_path_outside_is_refused(ck, name):
    folder = ck / "step-00000030"
    marker = json.loads((folder / "COMMIT.json").read_text())
    marker["files"][name] = 10
    (folder / "COMMIT.json").write_text(json.dumps(marker))
    with pytest.raises(CheckpointError) as info:
        _load(ck)
    text = _one_line(info.value)
    assert "outside the checkpoint folder: refused" in text and name in text
    assert "move" not in text


def test_symlink_out_of_the_folder_is_refused(ck, tmp_path):
    folder = ck / "step-00000030"
    outside = tmp_path / "elsewhere.pt"
    outside.write_bytes((folder / "rank-00000.pt").read_bytes())
    (folder / "rank-00000.pt").unlink()
    (folder / "rank-00000.pt").symlink_to(outside)
    with pytest.raises(CheckpointError, match="leads outside the checkpoint folder"):
        _load(ck)


@pytest.mark.parametrize("payload", [{"local": {}}, {"rng": "garbage", "local": {}},
                                     {"rng": {"python": {"version": 3}}, "local": {}}, [1, 2]])
def test_rank_file_without_usable_rng_is_one_line(ck, payload):
    _forge(ck / "step-00000030", "rank-00000.pt", payload)
    with pytest.raises(CheckpointError) as info:
        _load(ck)
    text = _one_line(info.value)
    assert "rank-00000.pt" in text and "random-number generator" in text


@pytest.mark.parametrize("payload, words", [
    ([1, 2, 3], "it holds a list"),
    ({"values": {"epoch": 1}, "objects": {}, "optimizers": {}, "groups": {}}, "no model"),
    ({"values": {"epoch": 1}, "objects": {}, "models": {"model": [1]}, "optimizers": {}},
     "not a state dict"),
])
def test_corrupt_replicated_file_is_not_blamed_on_the_architecture(ck, payload, words):
    _forge(ck / "step-00000030", "replicated.pt", payload)
    with pytest.raises(CheckpointError) as info:
        _load(ck)
    text = _one_line(info.value) + info.value.hint
    assert words in text and "corrupt" in text
    assert "architecture" not in text


def test_a_real_architecture_change_is_still_named(ck):
    model = torch.nn.Linear(4, 5)  # another shape than saved
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(CheckpointError, match="does not fit") as info:
        scaletrain.Checkpointer(ck).load_latest({"model": model, "optimizer": opt, "epoch": 0})
    assert "architecture" in info.value.hint


def test_two_jobs_saving_into_one_folder_are_told_so(ck):
    """Another process's save in progress (its lock held) in the same folder."""
    other = ck / ".partial-step-00000040-deadbeef"
    other.mkdir()
    fd = os.open(other / ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a second open file: as another process
    try:
        model, opt = _objects()
        ckpt = scaletrain.Checkpointer(ck)
        with pytest.raises(CheckpointError) as info:
            ckpt.save(50, {"model": model, "optimizer": opt, "epoch": 2})
        text = _one_line(info.value)
        assert "another job or process is saving checkpoints into" in text
        assert "own checkpoint directory" in info.value.hint
        assert "free space" not in text + info.value.hint
        assert other.is_dir() and ckpt.latest_step == 30
    finally:
        os.close(fd)
    ckpt.save(50, {"model": model, "optimizer": opt, "epoch": 2})  # the other one is gone
    ckpt.close()
    assert ckpt.latest_step == 50


def test_two_writers_racing_for_the_same_step_name_the_other_writer(ck, monkeypatch):
    """The step folder appears between our check and our rename (the other job won)."""
    from scaletrain.checkpoint import stepfolder

    real_replace = os.replace

    def racing(src, dst):
        if Path(dst).name == "step-00000060" and Path(src).name.startswith(".partial-"):
            (Path(dst) / "x").mkdir(parents=True)  # the other job's folder, not empty
        return real_replace(src, dst)

    monkeypatch.setattr(stepfolder.os, "replace", racing)
    model, opt = _objects()
    ckpt = scaletrain.Checkpointer(ck)
    with pytest.raises(CheckpointError) as info:
        ckpt.save(60, {"model": model, "optimizer": opt, "epoch": 2})
    assert "another job or process" in info.value.message
    assert "free space" not in info.value.hint
    ckpt.close()


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() |
                     st.text(max_size=12),
                     lambda inner: st.lists(inner, max_size=3) |
                     st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
_FIELDS = ("step", "files", "objects", "crc32c", "crc32", "format", "world_size")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_FIELDS), value=_JSON, strict=st.booleans())
def test_fuzzed_marker_fields_never_escape_as_a_traceback(pristine, tmp_path_factory, field,
                                                          value, strict):
    import shutil

    ck = tmp_path_factory.mktemp("fuzz") / "ck"
    shutil.copytree(pristine, ck)
    folder = ck / "step-00000030"
    marker = json.loads((folder / "COMMIT.json").read_text())
    marker[field] = value
    (folder / "COMMIT.json").write_text(json.dumps(marker))
    try:
        step = _load(ck, strict=strict)
    except CheckpointError as err:
        assert len(err.message.splitlines()) == 1 and err.hint
    else:
        # loaded: either the edit kept the marker valid and intact, or step 20 was used
        assert step in (20, 30)
        if step == 30:
            assert json.loads((folder / "COMMIT.json").read_text())[field] == value
    finally:
        shutil.rmtree(ck.parent, ignore_errors=True)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.text(max_size=60).map(str.encode) | st.binary(max_size=60))
def test_fuzzed_marker_bytes_never_escape_as_a_traceback(pristine, tmp_path_factory, data):
    import shutil

    ck = tmp_path_factory.mktemp("fuzz") / "ck"
    shutil.copytree(pristine, ck)
    (ck / "step-00000030" / "COMMIT.json").write_bytes(data)
    try:
        with pytest.raises(CheckpointError) as info:
            _load(ck, strict=True)
        assert "step-00000030" in info.value.message and "COMMIT.json" in info.value.message
        assert _load(ck, strict=False) == 20  # and the damaged folder is set aside
        assert not (ck / "step-00000030").exists()
    finally:
        shutil.rmtree(ck.parent, ignore_errors=True)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _drop_entry(marker: dict) -> None:
    algorithm, crcs = marker_checksums(marker)
    del marker[algorithm]["replicated.pt"]


def _empty_table(marker: dict) -> None:
    algorithm, _ = marker_checksums(marker)
    marker[algorithm] = {}


def _rename_table(marker: dict) -> None:
    algorithm, _ = marker_checksums(marker)
    marker["crc64"] = marker.pop(algorithm)


def _remove_table(marker: dict) -> None:
    algorithm, _ = marker_checksums(marker)
    del marker[algorithm]


# Issue 29 item 5: a file whose checksum entry was removed, emptied or renamed loaded without
# verification, so a flipped byte in it loaded silently. Every listed file needs its checksum.
@pytest.mark.parametrize("edit", [_drop_entry, _empty_table, _rename_table, _remove_table],
                         ids=["entry-removed", "table-emptied", "table-renamed", "table-removed"])
def test_a_file_without_its_checksum_is_never_loaded_unverified(ck, edit):
    folder = ck / "step-00000030"
    marker = json.loads((folder / "COMMIT.json").read_text())
    assert marker["format"] >= 2
    edit(marker)
    (folder / "COMMIT.json").write_text(json.dumps(marker))
    _flip(folder / "replicated.pt", (folder / "replicated.pt").stat().st_size // 2)
    with pytest.raises(CheckpointError, match="checksum") as info:
        _load(ck, strict=True)
    assert "step-00000030" in info.value.message and len(info.value.message.splitlines()) == 1
    assert _load(ck, strict=False) == 20   # not strict: the previous intact checkpoint


def test_a_format_1_marker_without_checksums_still_loads_by_its_sizes(ck):
    """Checkpoints written before checksums existed keep loading (their sizes are checked)."""
    folder = ck / "step-00000030"
    marker = json.loads((folder / "COMMIT.json").read_text())
    _remove_table(marker)
    marker["format"] = 1
    (folder / "COMMIT.json").write_text(json.dumps(marker))
    assert _load(ck, strict=True) == 30


def test_dcp_metadata_enum_members_pickled_by_getattr_load_and_nothing_else_does():
    """Python 3.12 (and Debian's 3.11) pickle an enum member as getattr(EnumClass, "NAME"): DCP's
    .metadata then holds builtins.getattr, which the allow-list refused for every checkpoint."""
    import io
    import pickle

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from scaletrain.checkpoint.safeio import _MetadataUnpickler

    class ByName:
        def __init__(self, owner, name):
            self.owner, self.name = owner, name

        def __reduce__(self):
            return (getattr, (self.owner, self.name))

    member = _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    data = pickle.dumps(ByName(_MEM_FORMAT_ENCODING, member.name))
    assert _MetadataUnpickler(io.BytesIO(data)).load() is member
    for owner, name in ((int, "real"), (_MEM_FORMAT_ENCODING, "__class__"), (_MEM_FORMAT_ENCODING, "mro")):
        with pytest.raises(pickle.UnpicklingError):
            _MetadataUnpickler(io.BytesIO(pickle.dumps(ByName(owner, name)))).load()
