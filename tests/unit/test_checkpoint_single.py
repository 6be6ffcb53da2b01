"""The Checkpointer in one plain process: round trip, RNG, security, damaged files, bad input.

Multi-process cases (ddp/zero1/zero3 exact resume, resharding, kills during save) are in
tests/multiproc/test_checkpoint_multiproc.py.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import marker_checksums, reference_blocks, reference_checksum, reseal

import scaletrain
from scaletrain.checkpoint import safeio
from scaletrain.checkpoint.errors import CheckpointError
from scaletrain.errors import UsageError

PWNED = "scaletrain-ckpt-pwned"


class Evil:
    """Unpickling this would create a file - the test fails if it ever exists."""

    def __init__(self, target: Path) -> None:
        self.target = str(target)

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def _objects(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    return model, opt, sched


def _train(model, opt, sched, steps=3):
    for _ in range(steps):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def _state(model, opt, sched, **values):
    return {"model": model, "optimizer": opt, "scheduler": sched, **values}


@pytest.fixture
def saved(tmp_path):
    model, opt, sched = _objects()
    _train(model, opt, sched)
    ckpt = scaletrain.Checkpointer(tmp_path / "ck", keep=2)
    state = _state(model, opt, sched, epoch=3, history=[1.0, 2.0], table={"a": torch.ones(2)})
    for step in (10, 20, 30):
        ckpt.save(step, state)
    ckpt.close()
    return tmp_path / "ck", model, opt, sched


def _marker(folder: Path) -> dict:
    return json.loads((folder / "COMMIT.json").read_text())


def _rewrite(folder: Path, name: str, data: bytes) -> None:
    """Replace a file and fix its size and checksum in the marker, as an attacker would."""
    reseal(folder, name, data)


def test_round_trip_restores_everything(saved):
    directory, model, opt, sched = saved
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000020", "step-00000030"]
    marker = _marker(directory / "step-00000030")
    assert marker["step"] == 30 and marker["world_size"] == 1
    assert set(marker["files"]) == {"replicated.pt", "rank-00000.pt"}
    assert marker["torch_version"] == torch.__version__
    expected_draws = (random.random(), np.random.rand(), torch.rand(3))  # right after the save

    model2, opt2, sched2 = _objects(seed=1)
    state = _state(model2, opt2, sched2, epoch=0, history=[], table={})
    ckpt = scaletrain.Checkpointer(directory)
    assert ckpt.load_latest(state) == 30
    draws = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[0] == expected_draws[0] and draws[1] == expected_draws[1]
    assert torch.equal(draws[2], expected_draws[2])
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[i]["exp_avg_sq"], s2[i]["exp_avg_sq"]) for i in s1)
    assert sched2.state_dict() == sched.state_dict()
    assert state["epoch"] == 3 and state["history"] == [1.0, 2.0]
    assert torch.equal(state["table"]["a"], torch.ones(2))
    ckpt.close()


def test_fresh_directory_returns_none(tmp_path):
    model, opt, sched = _objects()
    ckpt = scaletrain.Checkpointer(tmp_path / "none")
    assert ckpt.load_latest(_state(model, opt, sched)) is None
    assert ckpt.latest_step is None


def test_pickled_object_is_refused_not_run(saved, tmp_path):
    directory = saved[0]
    target = tmp_path / PWNED
    folder = directory / "step-00000030"
    for name in ("replicated.pt", "rank-00000.pt"):
        payload = torch.load(folder / name, weights_only=True)
        payload["evil"] = Evil(target)
        import io

        buf = io.BytesIO()
        torch.save(payload, buf)
        good = (folder / name).read_bytes()
        _rewrite(folder, name, buf.getvalue())
        model, opt, sched = _objects()
        with pytest.raises(CheckpointError, match="refused without running it") as info:
            scaletrain.Checkpointer(directory).load_latest(
                _state(model, opt, sched, epoch=0, history=[], table={}))
        assert "step 30" in str(info.value) and name in str(info.value)
        assert "posix.system" in str(info.value)
        assert not target.exists()
        _rewrite(folder, name, good)


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _damage(folder: Path, damage: str, name: str = "replicated.pt") -> None:
    data = (folder / name).read_bytes()
    if damage == "forged":  # size and checksum fixed in the marker: only torch.load can tell
        _rewrite(folder, name, os.urandom(len(data)))
    elif damage == "truncated":
        (folder / name).write_bytes(data[: len(data) // 2])  # marker size now wrong
    elif damage == "flipped":  # one bit of a weight, size unchanged: torch.load would succeed
        _flip_byte(folder / name, len(data) // 2)
    else:
        (folder / name).unlink()


@pytest.mark.parametrize("damage", ["forged", "truncated", "missing", "flipped"])
def test_damaged_file_gives_one_line_error_when_strict(saved, damage):
    directory = saved[0]
    _damage(directory / "step-00000030", damage)
    model, opt, sched = _objects()
    with pytest.raises(CheckpointError) as info:
        scaletrain.Checkpointer(directory, strict=True).load_latest(
            _state(model, opt, sched, epoch=0, history=[], table={}))
    text = info.value.render()
    assert "step-00000030" in text or "checkpoint step 30" in text
    assert "replicated.pt" in text
    assert "step 20" in info.value.hint
    assert len(info.value.message.splitlines()) == 1
    assert (directory / "step-00000030").is_dir()  # strict: left where it is


@pytest.mark.parametrize("damage", ["truncated", "missing", "flipped"])
@pytest.mark.parametrize("name", ["replicated.pt", "rank-00000.pt"])
def test_damaged_newest_falls_back_and_is_kept(saved, damage, name):
    directory = saved[0]
    _damage(directory / "step-00000030", damage, name)
    model, opt, sched = _objects(seed=1)
    ckpt = scaletrain.Checkpointer(directory)
    with pytest.warns(UserWarning, match=r"step-00000030 is damaged \(" + name) as record:
        assert ckpt.load_latest(_state(model, opt, sched, epoch=0, history=[], table={})) == 20
    assert "resuming from step 20" in str(record[0].message)
    kept = [p.name for p in directory.iterdir() if p.name.startswith("damaged-step-00000030-")]
    assert len(kept) == 1 and kept[0] in str(record[0].message)
    assert ckpt.latest_step == 20  # the damaged folder no longer counts
    if damage == "flipped":
        assert "checksum" in str(record[0].message)
    ckpt.close()


def test_flipped_byte_in_every_position_class_is_caught(saved):
    """A flipped byte anywhere (zip header, pickle, tensor data, the end) never loads."""
    directory = saved[0]
    folder = directory / "step-00000030"
    size = (folder / "replicated.pt").stat().st_size
    good = (folder / "replicated.pt").read_bytes()
    for offset in (0, 40, size // 3, size // 2, size - 1):
        _flip_byte(folder / "replicated.pt", offset)
        model, opt, sched = _objects()
        with pytest.raises(CheckpointError, match="checksum"):
            scaletrain.Checkpointer(directory, strict=True).load_latest(
                _state(model, opt, sched, epoch=0, history=[], table={}))
        (folder / "replicated.pt").write_bytes(good)


def test_checksum_is_taken_while_writing(saved, monkeypatch):
    """The marker's CRCs are those of the files, and a save never reads its files back."""
    directory = saved[0]
    folder = directory / "step-00000030"
    marker = _marker(folder)
    algorithm, crcs = marker_checksums(marker)
    assert set(crcs) == set(marker["files"])
    for name, crc in crcs.items():
        assert crc == reference_checksum(algorithm, (folder / name).read_bytes())
    from scaletrain.checkpoint import verified

    def no_reading(*args, **kwargs):
        raise AssertionError(f"a save read {args} back")

    monkeypatch.setattr(verified, "VerifiedFile", no_reading)
    model, opt, sched = _objects()
    ckpt = scaletrain.Checkpointer(directory / "again")
    ckpt.save(1, _state(model, opt, sched))
    ckpt.close()


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(saved):
    directory = saved[0]
    _damage(directory / "step-00000030", "flipped")
    _damage(directory / "step-00000020", "truncated")
    model, opt, sched = _objects()
    with pytest.raises(CheckpointError, match="no older intact one is left") as info:
        scaletrain.Checkpointer(directory).load_latest(
            _state(model, opt, sched, epoch=0, history=[], table={}))
    assert "step-00000030" in info.value.message and "checksum" in info.value.message


def test_dcp_metadata_with_code_is_refused(tmp_path):
    folder = tmp_path / "sharded"
    folder.mkdir()
    target = tmp_path / PWNED
    (folder / ".metadata").write_bytes(pickle.dumps(Evil(target)))
    with pytest.raises(CheckpointError, match="refused without running it"):
        safeio.read_dcp_metadata(folder, step=4)
    assert not target.exists()
    (folder / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(CheckpointError, match="cannot read"):
        safeio.read_dcp_metadata(folder, step=4)


def test_dcp_bytes_entry_with_code_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    from scaletrain.torch_features import dcp_parameters

    target = tmp_path / PWNED
    folder = tmp_path / "sharded"
    one = {"no_dist": True} if "no_dist" in dcp_parameters("save") else {}  # torch 2.6 infers it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(2), "extra": Evil(target)}, checkpoint_id=str(folder), **one)
        assert not target.exists()
        # DCP's own loader would run it (weights_only=False); ours refuses. Where the object lands
        # differs between builds of one release (2.13.0+cpu: the data file; +cu130: the metadata,
        # which scaletrain reads itself before DCP's load, as sharded.load does)
        from scaletrain.checkpoint.reader import _scaletrain_cause

        try:
            meta = safeio.read_dcp_metadata(folder, step=4)
        except CheckpointError as err:
            cause: object = err
        else:
            dest = {"w": torch.zeros(2), "extra": None}
            with pytest.raises(BaseException) as info:  # DCP's CheckpointException
                dcp.load(dest, storage_reader=safeio.safe_reader(folder, step=4, metadata=meta),
                         planner=safeio.safe_planner(step=4, path=folder), **one)
            cause = _scaletrain_cause(info.value)  # DCP wraps each rank's error; the reader unwraps
    assert isinstance(cause, CheckpointError), cause
    assert "refused without running it" in cause.message and "step 4" in cause.message
    assert not target.exists()
    # and the metadata of a normal DCP checkpoint passes the allow-list
    plain = tmp_path / "plain"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(2)}, checkpoint_id=str(plain), **one)
    assert "w" in safeio.read_dcp_metadata(plain).state_dict_metadata


def test_async_save_overlaps_and_commits(tmp_path):
    model, opt, sched = _objects()
    ckpt = scaletrain.Checkpointer(tmp_path / "a", async_save=True, keep=5)
    state = _state(model, opt, sched)
    ckpt.save(1, state)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _train(model, opt, sched, steps=2)  # changes the live tensors while the write may run
    ckpt.save(2, state)  # waits for save 1 first
    ckpt.close()
    model2, opt2, sched2 = _objects(seed=5)
    assert [p.name for p in sorted((tmp_path / "a").iterdir())] == ["step-00000001",
                                                                    "step-00000002"]
    folder = tmp_path / "a" / "step-00000001"
    saved = torch.load(folder / "replicated.pt", weights_only=True)["models"]["model"]
    for k, v in before.items():
        assert torch.equal(saved[k], v), k  # the staged copy, not the later values


def test_async_error_surfaces_on_next_call(tmp_path, monkeypatch):
    model, opt, sched = _objects()
    ckpt = scaletrain.Checkpointer(tmp_path / "e", async_save=True)
    state = _state(model, opt, sched)
    ckpt.save(1, state)
    ckpt.wait()

    def broken(obj, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("scaletrain.checkpoint.writer.save_file", broken)
    ckpt.save(2, state)
    with pytest.raises(CheckpointError, match="No space left"):
        ckpt.wait()
    assert ckpt.latest_step == 1
    assert not [p for p in (tmp_path / "e").iterdir() if p.name.startswith(".partial")]
    monkeypatch.undo()
    ckpt.save(3, state)
    ckpt.close()
    assert ckpt.latest_step == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"keep": 0}, "keep must be a whole number from 1"),
    ({"keep": 2.5}, "keep must be a whole number from 1"),
    ({"every_steps": -1}, "every_steps"),
    ({"every_minutes": 0}, "every_minutes"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(UsageError, match=match):
        scaletrain.Checkpointer(tmp_path, **kwargs)


def test_unknown_state_object_is_usage_error(tmp_path):
    ckpt = scaletrain.Checkpointer(tmp_path)
    with pytest.raises(UsageError, match="neither a plain value") as info:
        ckpt.save(1, {"thing": object()})
    assert "state_dict" in info.value.hint
    with pytest.raises(UsageError, match=r"save\(\): step must be a whole number from 0"):
        ckpt.save(-1, {})
    assert not list(tmp_path.iterdir())


def test_missing_name_in_checkpoint_is_clear(saved):
    model, opt, sched = _objects()
    with pytest.raises(CheckpointError, match="holds no 'ema'"):
        scaletrain.Checkpointer(saved[0]).load_latest(
            _state(model, opt, sched, epoch=0, history=[], table={}, ema=torch.zeros(1)))


def test_export_is_plain_state_dict(tmp_path, saved):
    model = saved[1]
    ckpt = scaletrain.Checkpointer(tmp_path / "x")
    path = ckpt.export(tmp_path / "out" / "model.pt", model)
    weights = torch.load(path, weights_only=True)
    fresh = _objects(seed=9)[0]
    fresh.load_state_dict(weights)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                 model.state_dict().values()))


# -- the loop helper: every_steps, every_minutes, stop -----------------------------------


@pytest.fixture
def no_stop_request():
    from scaletrain.runtime import preempt

    preempt._reset_for_tests()
    yield preempt
    preempt._reset_for_tests()


def test_step_saves_every_n_steps(tmp_path, no_stop_request):
    model, opt, sched = _objects()
    ckpt = scaletrain.Checkpointer(tmp_path / "s", keep=10, every_steps=3)
    state = _state(model, opt, sched)
    saved = [s for s in range(1, 11) if (ckpt.step(s, state), ckpt.latest_step)[1] == s]
    ckpt.close()
    assert saved == [3, 6, 9]


def test_step_every_minutes_is_applied_one_step_late(tmp_path, no_stop_request, monkeypatch):
    model, opt, sched = _objects()
    clock = [1000.0]
    monkeypatch.setattr("scaletrain.checkpoint.checkpointer.time.monotonic", lambda: clock[0])
    ckpt = scaletrain.Checkpointer(tmp_path / "m", keep=10, every_minutes=1)
    state = _state(model, opt, sched)
    saves = []
    for step in range(1, 10):
        clock[0] += 25.0  # 25 s per step: due at step 3 (75 s), agreed and saved at step 4
        ckpt.step(step, state)
        saves.append(ckpt.latest_step)
    ckpt.close()
    # then due again at step 7 (75 s after step 4's save), saved at step 8 - never twice
    assert saves == [None, None, None, 4, 4, 4, 4, 8, 8]


def test_step_stops_saves_and_exits_75(tmp_path, no_stop_request):
    model, opt, sched = _objects()
    ckpt = scaletrain.Checkpointer(tmp_path / "x", every_steps=100)
    state = _state(model, opt, sched)
    ckpt.step(1, state)
    no_stop_request.request("time_limit")  # as the USR1 handler would record it
    ckpt.step(2, state)  # the agreement reads the request one step late
    with pytest.raises(SystemExit) as info:
        ckpt.step(3, state)
    assert info.value.code == 75
    assert ckpt.latest_step == 3
    record = json.loads((tmp_path / "x" / "stop.json").read_text())
    assert record["reason"] == "time_limit" and record["step"] == 3


def test_step_stop_without_exit(tmp_path, no_stop_request):
    model, opt, sched = _objects()
    ckpt = scaletrain.Checkpointer(tmp_path / "y", exit_on_stop=False)
    state = _state(model, opt, sched)
    no_stop_request.request("preempted")
    assert ckpt.step(1, state) is False and not ckpt.should_stop()
    assert ckpt.step(2, state) is True and ckpt.should_stop()
    assert ckpt.latest_step == 2
    ckpt.close()


def test_strategy_report_decides_sharding(monkeypatch):
    """is_sharded asks scaletrain.parallel.describe (the Strategy interface) first."""
    import types

    import scaletrain.parallel as parallel
    from scaletrain.checkpoint import collect

    model, opt, _ = _objects()
    assert not collect.is_sharded(model) and not collect.is_sharded(opt, model)
    layouts = {id(opt): "partitioned"}

    def describe(obj):
        layout = layouts.get(id(obj))
        return None if layout is None else types.SimpleNamespace(layout_of=lambda o: layout)

    monkeypatch.setattr(parallel, "describe", describe, raising=False)
    assert collect.is_sharded(opt, model) and not collect.is_sharded(model)
    layouts[id(model)] = "replicated"
    assert not collect.is_sharded(model)


@pytest.mark.parametrize("spare", [True, False])
def test_checksum_writer_threaded_and_inline_agree(tmp_path, monkeypatch, spare):
    from scaletrain.checkpoint import checksum

    monkeypatch.setattr(checksum, "_SPARE", spare)
    data = {"big": torch.arange(600_000, dtype=torch.float32), "small": torch.ones(3)}
    size, (crc, blocks) = safeio.save_file(data, tmp_path / "f.pt")
    raw = (tmp_path / "f.pt").read_bytes()
    assert size == len(raw) and crc == reference_checksum(checksum.ALGORITHM, raw)
    assert blocks == reference_blocks(checksum.ALGORITHM, raw, checksum.BLOCK_BYTES)
    from scaletrain.checkpoint import verified

    marker = {"files": {"f.pt": size}, checksum.ALGORITHM: {"f.pt": crc}}
    assert verified.problem_of(tmp_path, marker, "f.pt") is None
    marker[checksum.ALGORITHM]["f.pt"] = "00000000"
    assert "checksum" in verified.problem_of(tmp_path, marker, "f.pt")


def test_crc_thread_only_with_a_spare_core_per_process(monkeypatch):
    from scaletrain.checkpoint import checksum

    monkeypatch.setattr(checksum.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert checksum._spare_core() is False  # 2 cores, 2 ranks: inline
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert checksum._spare_core() is True


def test_torch_zip_crc_is_off_only_while_we_write(tmp_path, monkeypatch):
    """Our CRC replaces torch's per-record one during our writes, and the setting is restored
    (nested and concurrent blocks counted)."""
    from torch.serialization import get_crc32_options

    from scaletrain.checkpoint import checksum

    seen = []
    real = checksum.ChecksumWriter.write

    def spy(self, data):
        seen.append(get_crc32_options())
        return real(self, data)

    monkeypatch.setattr(checksum.ChecksumWriter, "write", spy)
    assert get_crc32_options() is True
    safeio.save_file({"t": torch.ones(1000)}, tmp_path / "f.pt")
    assert seen and not any(seen)
    assert get_crc32_options() is True
    with checksum.our_crc_only():
        with checksum.our_crc_only():
            assert get_crc32_options() is False
        assert get_crc32_options() is False
    assert get_crc32_options() is True
    assert torch.equal(torch.load(tmp_path / "f.pt", weights_only=True)["t"], torch.ones(1000))


def test_in_place_load_is_recognised_only_for_the_live_tensors():
    """After DCP's in-place load no set_*_state_dict is needed when the state dict holds the
    live tensors; a copy (or a non-tensor leaf) still goes through set_*_state_dict."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, \
        get_optimizer_state_dict

    from scaletrain.checkpoint.collect import Entry
    from scaletrain.checkpoint.sharded import _aliases_live

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    msd, osd = get_model_state_dict(model), get_optimizer_state_dict(model, opt)
    as_model = Entry(name="model", obj=model, kind="model")
    as_opt = Entry(name="optimizer", obj=opt, kind="optimizer", model=model)
    assert _aliases_live(as_model, msd) and _aliases_live(as_opt, osd)
    assert not _aliases_live(as_model, {k: v.clone() for k, v in msd.items()})
    copied = {"state": {k: {n: v.clone() for n, v in s.items()} for k, s in osd["state"].items()},
              "param_groups": osd["param_groups"]}
    assert not _aliases_live(as_opt, copied)
    assert not _aliases_live(as_model, {**msd, "extra": 3})


def _resumed_run(folder: Path, *, raise_inside: bool = False) -> None:
    model, opt, sched = _objects()
    state = _state(model, opt, sched)
    try:
        with scaletrain.Checkpointer(folder, every_steps=2) as ckpt:
            ckpt.load_latest(state)
            for step in range(6, 11):
                ckpt.step(step, state)
                if raise_inside and step == 8:
                    raise RuntimeError("the program failed")
    except RuntimeError:
        pass


def test_a_later_run_that_ends_normally_marks_the_old_stop_superseded(tmp_path, clean_env):
    """stop.json described a stop at step 5 after a later run had trained to step 10 and ended."""
    from scaletrain.checkpoint import stoprecord

    folder = tmp_path / "ck"
    model, opt, sched = _objects()
    with scaletrain.Checkpointer(folder) as ckpt:
        ckpt.save(5, _state(model, opt, sched))
    stoprecord.write_stop_record(folder, reason="time_limit", step=5, log=False)
    _resumed_run(folder, raise_inside=True)          # a failure is not a normal end: untouched
    assert "superseded" not in json.loads((folder / "stop.json").read_text())
    _resumed_run(folder)
    record = json.loads((folder / "stop.json").read_text())
    assert (record["reason"], record["step"]) == ("time_limit", 5)      # the history is kept
    assert record["superseded"]["step"] == 10
    assert stoprecord.mark_superseded(folder, step=12) is None             # marked once


def test_checksum_algorithms_are_the_standard_ones():
    """The check values of the CRC catalogue ("123456789"): CRC-32 cbf43926, CRC-32C e3069283."""
    from scaletrain.checkpoint import checksum

    assert checksum.hex_crc(checksum._crc(b"123456789", 0, "crc32")) == "cbf43926"
    assert checksum.hex_crc(checksum._crc(b"123456789", 0, "crc32c")) == "e3069283"
    # running: two halves give the whole
    half = checksum._crc(b"1234", 0, "crc32c")
    assert checksum.hex_crc(checksum._crc(b"56789", half, "crc32c")) == "e3069283"


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c"])
def test_a_checkpoint_of_either_algorithm_loads_and_a_flipped_byte_is_caught(tmp_path, monkeypatch,
                                                                           algorithm):
    """A checkpoint saved with zlib's CRC-32 (before CRC-32C, or where the CPU has no CRC-32C
    instruction) is checked as such on a machine that would save CRC-32C, and the other way."""
    from scaletrain.checkpoint import checksum

    monkeypatch.setattr(checksum, "ALGORITHM", algorithm)
    model = torch.nn.Linear(4, 3)
    ckpt = scaletrain.Checkpointer(tmp_path / "ck")
    ckpt.save(1, {"model": model})
    ckpt.close()
    folder = tmp_path / "ck" / "step-00000001"
    marker = _marker(folder)
    assert marker_checksums(marker)[0] == algorithm
    assert not ({"crc32", "crc32c"} - {algorithm}) & set(marker)  # one algorithm per marker
    monkeypatch.setattr(checksum, "ALGORITHM", "crc32" if algorithm == "crc32c" else "crc32c")
    fresh = torch.nn.Linear(4, 3)
    assert scaletrain.Checkpointer(tmp_path / "ck").load_latest({"model": fresh}) == 1
    assert torch.equal(fresh.weight, model.weight)
    data = bytearray((folder / "replicated.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / "replicated.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        scaletrain.Checkpointer(tmp_path / "ck", strict=True).load_latest(
            {"model": torch.nn.Linear(4, 3)})


def test_crc32c_checkpoint_without_the_package_is_an_error_not_damage(tmp_path, monkeypatch):
    """Where crc32c is missing, a checkpoint saved with CRC-32C is not taken for damaged (never
    set aside, no fallback to an older step): one error naming the package."""
    from scaletrain.checkpoint import checksum

    monkeypatch.setattr(checksum, "ALGORITHM", "crc32c")
    ckpt = scaletrain.Checkpointer(tmp_path / "ck")
    for step in (1, 2):
        ckpt.save(step, {"model": torch.nn.Linear(4, 3)})
    ckpt.close()
    monkeypatch.delitem(checksum._FUNCTIONS, "crc32c")
    with pytest.raises(CheckpointError, match="crc32c package is missing") as info:
        scaletrain.Checkpointer(tmp_path / "ck").load_latest({"model": torch.nn.Linear(4, 3)})
    assert "pip install crc32c" in info.value.hint
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000001", "step-00000002"]


def test_a_load_pauses_the_garbage_collector_and_restores_it(saved, monkeypatch):
    """The collector is off during a load (full collections in a big process cost more than
    the checksum) and back as it was afterwards, also after a failed load."""
    import gc

    from scaletrain.checkpoint import safeio

    seen = []
    real = safeio.load_file

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr("scaletrain.checkpoint.reader.load_file", spy)
    directory = saved[0]
    model, opt, sched = _objects()
    state = _state(model, opt, sched, epoch=0, history=[], table={})
    assert gc.isenabled()
    assert scaletrain.Checkpointer(directory).load_latest(state) == 30
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        scaletrain.Checkpointer(directory).load_latest(state)
        assert not gc.isenabled()  # a program that had it off keeps it off
    finally:
        gc.enable()
    with pytest.raises(CheckpointError):
        scaletrain.Checkpointer(directory).load_latest({"unknown": torch.nn.Linear(2, 2)})
    assert gc.isenabled()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_pauses_the_collector_only_while_the_training_thread_waits(tmp_path, monkeypatch,
                                                                         async_save):
    import gc

    from scaletrain.checkpoint import writer

    seen: dict[str, bool] = {}
    prepare, run = writer.SaveJob.prepare, writer.SaveJob.run

    def spy_prepare(self):
        seen["prepare"] = gc.isenabled()
        return prepare(self)

    def spy_run(self):
        seen["run"] = gc.isenabled()
        return run(self)

    monkeypatch.setattr(writer.SaveJob, "prepare", spy_prepare)
    monkeypatch.setattr(writer.SaveJob, "run", spy_run)
    ckpt = scaletrain.Checkpointer(tmp_path / "ck", async_save=async_save)
    ckpt.save(1, {"model": torch.nn.Linear(3, 2)})
    ckpt.wait()
    ckpt.close()
    assert seen["prepare"] is False
    assert seen["run"] is async_save  # a background write leaves the program's collector on
    assert gc.isenabled()
