"""Async-save staging: plain copies on the CPU; on a GPU, buffers reused from save to save."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scaletrain.checkpoint import staging  # noqa: E402
from scaletrain.checkpoint.staging import Stager, on_accelerator  # noqa: E402


def _state():
    return {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)},
            "opt": [torch.zeros(4, dtype=torch.float64), 7, "adam"], "step": (3, torch.tensor(5))}


def test_cpu_state_is_copied_plainly_and_never_pinned():
    state = _state()
    stager = Stager()
    staged = stager.stage(state)
    assert not on_accelerator(state) and stager.allocated == 0 and stager.for_dcp(state) is None
    state["model"]["w"].add_(100)               # training goes on changing the originals
    assert staged["model"]["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert staged["opt"][1:] == [7, "adam"] and staged["step"][0] == 3


def test_accelerator_state_reuses_its_buffers_from_save_to_save(monkeypatch):
    """The bookkeeping of the GPU path, on the CPU: every tensor goes into a buffer kept for the
    next save; a tensor whose shape changed gets a new one; the copies are independent."""
    monkeypatch.setattr(staging, "on_accelerator", lambda obj: True)
    stager = Stager(pin=False)                  # a CPU-only torch cannot pin
    state = _state()
    first = stager.stage(state)
    assert stager.allocated == 4
    buffers = [first["model"]["w"], first["model"]["b"], first["opt"][0], first["step"][1]]
    state["model"]["w"].mul_(2)
    assert first["model"]["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    second = stager.stage(state)
    assert stager.allocated == 4                # nothing new: the same buffers, refilled
    assert second["model"]["w"] is buffers[0] and second["opt"][0] is buffers[2]
    assert second["model"]["w"].tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert second["opt"][0].dtype == torch.float64 and second["step"][1].item() == 5
    state["model"]["b"] = torch.ones(5)         # a different shape: a new buffer for it alone
    stager.stage(state)
    assert stager.allocated == 5
    stager.close()
    assert stager._buffers == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_state_is_staged_into_pinned_memory():
    stager = Stager()
    state = {"w": torch.randn(64, 64, device="cuda")}
    staged = stager.stage(state)
    assert staged["w"].is_pinned() and torch.equal(staged["w"], state["w"].cpu())
    assert stager.for_dcp(state) is stager.for_dcp(state)   # DCP's stager kept between saves
    stager.close()


def test_an_async_save_whose_payload_and_local_state_line_up_keeps_both(tmp_path, monkeypatch):
    """A save stages two trees (the replicated payload, then this rank's RNG and local state).
    Buffers are matched by position, so when the payload's first tensor has the shape and dtype
    of the local tree's first one (Python's RNG state: 625 int64), staging the second tree must
    not refill the first tree's buffer. Staged like a GPU save, on the CPU."""
    import functools

    import scaletrain
    from scaletrain.checkpoint import checkpointer

    monkeypatch.setattr(staging, "on_accelerator", lambda obj: True)
    monkeypatch.setattr(checkpointer, "Stager", functools.partial(Stager, pin=False))
    ckpt = scaletrain.Checkpointer(tmp_path / "ck", async_save=True, keep=5)
    for step in (1, 2, 3):
        # the same shape and dtype as the Python RNG state, values it never holds
        value = torch.full((625,), step * 1_000_003, dtype=torch.int64)
        weights = torch.randn(8, dtype=torch.float64)
        expected = (value.clone(), weights.clone())
        ckpt.save(step, {"lined_up": value, "weights": weights})
        value.fill_(7)                       # training goes on changing the originals
        weights.fill_(7.0)
        ckpt.wait()
        state = {"lined_up": torch.zeros(625, dtype=torch.int64), "weights": torch.zeros(8)}
        assert ckpt.load_latest(state) == step
        assert torch.equal(state["lined_up"], expected[0])
        assert torch.equal(state["weights"].view(torch.int64), expected[1].view(torch.int64))
    stager = ckpt._stager
    assert stager is not None
    # the payload's 2 tensors and the local tree's 3 (Python, torch and NumPy RNG), made once
    assert stager.allocated == 5
    ckpt.close()
