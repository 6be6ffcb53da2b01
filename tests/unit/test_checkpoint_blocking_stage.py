"""A blocking save of GPU state stages rank 0's replicated payload into pinned buffers kept from
save to save, then writes it (issue 30: torch.save's own copies of GPU tensors were the gap to
DCP). The bookkeeping on the CPU, with the GPU check and the pinning stubbed out; the copy on a
real GPU is the GPU-marked test at the end."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import scaletrain  # noqa: E402
from scaletrain.checkpoint import replicated, staging  # noqa: E402
from scaletrain.checkpoint.staging import Stager  # noqa: E402


def _model(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))


def test_blocking_save_writes_through_reused_buffers_and_loads_back(tmp_path, monkeypatch):
    for module in (replicated, staging):  # "this state is on a GPU"
        monkeypatch.setattr(module, "on_accelerator", lambda obj: True)
    model = _model(0)
    ck = scaletrain.Checkpointer(tmp_path, keep=2, exit_on_stop=False)
    ck._stager = Stager(pin=False)  # a CPU-only torch cannot pin
    ck.save(1, {"model": model})
    assert ck._stager.allocated == 4               # two weights, two biases
    with torch.no_grad():
        model[0].weight.mul_(3)
    ck.save(2, {"model": model})
    assert ck._stager.allocated == 4               # the second save reused every buffer
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    ck.close()

    other = _model(1)
    fresh = scaletrain.Checkpointer(tmp_path, keep=2, exit_on_stop=False)
    assert fresh.load_latest({"model": other}) == 2  # checksums and sizes checked on the way
    fresh.close()
    for k, v in other.state_dict().items():
        assert torch.equal(v, expected[k]), k


def test_cpu_state_is_written_as_it_is():
    stager = Stager(pin=False)
    payload = {"models": {"m": {"w": torch.ones(3)}}, "values": {"x": 1}}
    assert replicated.staged(payload, stager) is payload and stager.allocated == 0
    assert replicated.staged(None, stager) is None


def test_a_host_that_cannot_pin_saves_unstaged(monkeypatch):
    monkeypatch.setattr(replicated, "on_accelerator", lambda obj: True)
    stager = Stager(pin=False)

    def refuse(obj):
        raise RuntimeError("CUDA error: out of memory (pinned host allocation)")

    monkeypatch.setattr(stager, "stage", refuse)
    payload = {"models": {"m": {"w": torch.ones(3)}}}
    assert replicated.staged(payload, stager) is payload


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_payload_is_staged_pinned():
    stager = Stager()
    payload = {"models": {"m": {"w": torch.randn(256, 256, device="cuda")}}}
    out = replicated.staged(payload, stager)
    w = out["models"]["m"]["w"]
    assert w.device.type == "cpu" and w.is_pinned() and torch.equal(w, payload["models"]["m"]["w"].cpu())
    stager.close()
