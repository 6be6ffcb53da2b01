"""scale_lr numbers and errors; metric helpers in a single process (identity); the LR helper
does not import torch."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import scaletrain
from scaletrain.data.lr import check_global_batch, scale_lr
from scaletrain.errors import UsageError
from scaletrain.runtime.settle import destroy_group


@pytest.mark.parametrize("args,want", [
    ((0.1, 256, 1024), 0.4),
    ((0.1, 256, 1024, "sqrt"), 0.2),
    ((0.1, 256, 256), 0.1),
    ((0.1, 256, 64), 0.025),
    ((3e-4, 64, 256, "sqrt"), 6e-4),
    ((1, 8, 24), 3.0),
])
def test_scale_lr_numbers(args, want):
    got = scale_lr(*args)
    assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-12)


@pytest.mark.parametrize("args", [(0, 256, 512), (-0.1, 256, 512), (float("nan"), 1, 2),
                                  (0.1, 0, 512), (0.1, 256, 0), (0.1, 256.0, 512),
                                  (0.1, 256, 512, "cubic"), (True, 1, 2)])
def test_scale_lr_rejects_bad_input(args):
    with pytest.raises(UsageError):
        scale_lr(*args)


def test_scale_lr_is_public_and_torch_free():
    assert scaletrain.scale_lr is scale_lr
    code = ("import sys, scaletrain; scaletrain.scale_lr(0.1, 1, 2); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_check_global_batch_message_and_off_switch(monkeypatch):
    import scaletrain.data.lr as lr_mod

    monkeypatch.setattr(lr_mod, "_warned", set())
    assert check_global_batch(64, 1) is None
    assert check_global_batch(64, 4, base_world_size=None) is None
    with pytest.warns(lr_mod.GlobalBatchWarning):
        msg = check_global_batch(32, 8, base_world_size=2)
    assert msg is not None and "global batch is 256 = 32 x 8" in msg and "it was 64" in msg
    assert check_global_batch(32, 4, is_main=False) is not None  # told, but no warning off rank 0


def test_metrics_are_identities_without_a_process_group():
    assert scaletrain.all_reduce_mean(3) == 3.0 and isinstance(scaletrain.all_reduce_mean(3), float)
    assert scaletrain.all_reduce_mean(2.5, weight=7) == 2.5
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(scaletrain.all_reduce_mean(t), t)
    assert scaletrain.gather_objects({"a": 1}) == [{"a": 1}]


@pytest.mark.parametrize("bad", [{"value": "x"}, {"value": 1.0, "weight": -1},
                                 {"value": 1.0, "weight": True}])
def test_all_reduce_mean_rejects_bad_input(bad):
    with pytest.raises(UsageError):
        scaletrain.all_reduce_mean(bad.pop("value"), **bad)


def test_a_users_own_process_group_gives_the_env(tmp_path, monkeypatch):
    import torch.distributed as dist

    from torch.utils.data import TensorDataset

    from scaletrain.runtime import session as rt  # where init() leaves its Env

    monkeypatch.setattr(rt, "_ENV", None)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        ld = scaletrain.loader(TensorDataset(torch.arange(4)), batch_size=2, num_workers=0)
        assert (ld.env.rank, ld.env.world_size, ld.env.backend) == (0, 1, "gloo")
        assert scaletrain.all_reduce_mean(torch.tensor([2.0]), weight=3).tolist() == [2.0]
        assert scaletrain.gather_objects("x") == ["x"]
        sub = scaletrain.loader(TensorDataset(torch.arange(4)), batch_size=2, num_workers=0,
                                group=dist.group.WORLD, base_world_size=None)
        assert (sub.env.rank, sub.env.world_size) == (0, 1)
    finally:
        destroy_group()
