"""setup() on a real GPU, one process: precisions and offload (skipped without CUDA/ROCm)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import scaletrain  # noqa: E402
from scaletrain.parallel.precision import state_of  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]


@pytest.fixture
def env():
    env = scaletrain.init()
    yield env
    scaletrain.shutdown()


@pytest.mark.parametrize("strategy,precision", [("none", "tf32"), ("none", "bf16"),
                                                ("none", "fp16"), ("offload", "bf16"),
                                                ("zero3", "fp16")])
def test_one_gpu_step(env, strategy, precision):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = scaletrain.setup(model, opt, strategy=strategy, precision=precision, env=env,
                                  min_params=1000)
    x = torch.randn(32, 64, device=env.device)
    y = torch.randint(0, 8, (32,), device=env.device)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        assert loss.dtype == torch.float32
        scaletrain.backward(loss, model)
        opt.step()
        opt.zero_grad()
    assert torch.isfinite(loss)
    if precision == "tf32":
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    if precision == "fp16":
        assert state_of(model).scaler.get_scale() > 0
