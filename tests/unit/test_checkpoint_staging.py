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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_state_is_staged_into_pinned_memory():
    stager = Stager()
    state = {"w": torch.randn(64, 64, device="cuda")}
    staged = stager.stage(state)
    assert staged["w"].is_pinned() and torch.equal(staged["w"], state["w"].cpu())
    assert stager.for_dcp(state) is stager.for_dcp(state)   # DCP's stager kept between saves
    stager.close()
