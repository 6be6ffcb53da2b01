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
    """Replace a file and fix its size in the marker, as an attacker or bit rot would."""
    (folder / name).write_bytes(data)
    marker = _marker(folder)
    marker["files"][name] = len(data)
    (folder / "COMMIT.json").write_text(json.dumps(marker))


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


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_damaged_file_gives_one_line_error(saved, damage):
    directory = saved[0]
    folder = directory / "step-00000030"
    data = (folder / "replicated.pt").read_bytes()
    if damage == "garbage":
        _rewrite(folder, "replicated.pt", os.urandom(len(data)))
    elif damage == "truncated":
        (folder / "replicated.pt").write_bytes(data[: len(data) // 2])  # marker size now wrong
    else:
        (folder / "replicated.pt").unlink()
    model, opt, sched = _objects()
    with pytest.raises(CheckpointError) as info:
        scaletrain.Checkpointer(directory).load_latest(
            _state(model, opt, sched, epoch=0, history=[], table={}))
    text = info.value.render()
    assert "checkpoint step 30" in text and "replicated.pt" in text
    assert "previous checkpoint (step 20)" in info.value.hint
    assert len(info.value.message.splitlines()) == 1


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

    target = tmp_path / PWNED
    folder = tmp_path / "sharded"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(2), "extra": Evil(target)}, checkpoint_id=str(folder),
                 no_dist=True)
        assert not target.exists()
        # DCP's own loader would run it (weights_only=False); ours refuses
        dest = {"w": torch.zeros(2), "extra": None}
        with pytest.raises(BaseException) as info:  # DCP's CheckpointException
            dcp.load(dest, storage_reader=safeio.safe_reader(folder, step=4),
                     planner=safeio.safe_planner(step=4, path=folder), no_dist=True)
    from scaletrain.checkpoint.reader import _scaletrain_cause

    cause = _scaletrain_cause(info.value)  # DCP wraps each rank's error; the reader unwraps
    assert isinstance(cause, CheckpointError), info.value
    assert "refused without running it" in cause.message and "step 4" in cause.message
    assert not target.exists()
    # and the metadata of a normal DCP checkpoint passes the allow-list
    assert "w" in safeio.read_dcp_metadata(folder).state_dict_metadata


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
    ({"keep": 0}, "keep must be a positive integer"),
    ({"keep": 2.5}, "keep must be a positive integer"),
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
    with pytest.raises(UsageError, match="non-negative integer"):
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
