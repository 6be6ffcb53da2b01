"""Numbers a caller gives are checked for range before any arithmetic: init()'s timeouts through the
settings vocabulary (True became a 1-second timeout on every collective, "600" was taken, inf
and "abc" raised OverflowError/ValueError), a dataset whose len() is -1 or past an index, and
10**400 wherever a number is taken (an OverflowError in a dozen places)."""

from __future__ import annotations

import pytest
import torch

import scaletrain
from scaletrain.errors import DistEnvError, UsageError
from scaletrain.settings import SettingError

BIG = 10**400


@pytest.mark.parametrize("name", ["timeout_s", "step_timeout_s"])
@pytest.mark.parametrize("value", [True, "600", float("inf"), "abc", BIG, float("nan"), 0, -5, 400 * 86400])
def test_init_timeouts_speak_the_vocabulary_and_start_nothing(name, value):
    import torch.distributed as dist

    with pytest.raises(SettingError) as info:
        scaletrain.init(device="cpu", **{name: value})
    message = info.value.message
    assert message.startswith(f"init(): {name} must be a finite number above 0 and at most ") and "\n" not in message
    assert "(seconds)" in message and not dist.is_initialized()


@pytest.mark.parametrize("text", ["1e400", "abc", "inf", "-1", "nan"])
def test_the_step_timeout_variable_is_checked_as_the_argument_is(monkeypatch, text):
    import torch.distributed as dist

    monkeypatch.setenv("SCALETRAIN_TIMEOUT", text)
    with pytest.raises(DistEnvError, match="SCALETRAIN_TIMEOUT=.* is not a positive number of seconds"):
        scaletrain.init(device="cpu")
    assert not dist.is_initialized()


def test_a_good_timeout_still_starts():
    try:
        env = scaletrain.init(device="cpu", timeout_s=120, step_timeout_s=60.0)
        assert env.world_size == 1
    finally:
        scaletrain.shutdown()


class _Sized(torch.utils.data.Dataset):
    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("size", [-1, BIG])
def test_a_dataset_whose_len_is_not_a_count_is_one_line(size):
    with pytest.raises(UsageError, match=r"the dataset's len\(\) must be a whole number from 0") as info:
        scaletrain.loader(_Sized(size), batch_size=2, rank=0, world_size=1, num_workers=0)
    assert "\n" not in info.value.message and info.value.hint


@pytest.mark.parametrize("call, says", [
    (lambda tmp: scaletrain.Checkpointer(tmp / "c", every_steps=1).step("3", {}), "step(): step must be a whole number"),
    (lambda tmp: scaletrain.Checkpointer(tmp / "c", every_minutes=BIG), "Checkpointer: every_minutes must be a finite"),
    (lambda tmp: scaletrain.scale_lr(BIG, 32, 64), "scale_lr(): base_lr must be a finite number"),
    (lambda tmp: scaletrain.estimate_memory(BIG), "estimate_memory(): model_or_n_params must be from 1 to 1e+15"),
    (lambda tmp: scaletrain.estimate_memory(1000, strategy=None), "strategy must be a name, got None"),
    (lambda tmp: scaletrain.all_reduce_mean(BIG), "all_reduce_mean(): value must be a number or a tensor"),
    (lambda tmp: scaletrain.all_reduce_mean(1.0, weight=float("nan")), "all_reduce_mean(): weight must be a finite"),
    (lambda tmp: scaletrain.Monitor(console=False).step(samples=BIG), "Monitor.step: samples must be a count >= 0"),
    (lambda tmp: scaletrain.Monitor(console=False).step(samples=1, loss=BIG), "Monitor.step: loss must be a number"),
    (lambda tmp: scaletrain.backward(None), "backward(): loss must be a torch.Tensor"),
    (lambda tmp: scaletrain.accumulate("x", 2), "accumulate(): model must be a torch.nn.Module"),
    (lambda tmp: scaletrain.detect("x"), "detect(): environ must be a mapping of str to str"),
    (lambda tmp: scaletrain.Monitor(5), "Monitor: run_dir must be a path"),
    (lambda tmp: scaletrain.init(stop_signals=5), "init(): stop_signals must be a mapping of signal name"),
    (lambda tmp: scaletrain.Env(rank=-1), "Env: rank must be a whole number from 0"),
])
def test_a_bad_number_or_object_is_one_line_of_ours(tmp_path, call, says):
    with pytest.raises(UsageError) as info:
        call(tmp_path)
    assert info.value.message.startswith(says) and "\n" not in info.value.message
