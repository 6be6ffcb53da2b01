"""FSDP2's gradients are the mean over ranks on every torch, or setup() refuses in one line.

torch 2.7.1 and 2.8.0 over gloo summed the zero3/zero2/offload gradients (twice too large at
world 2) and stopped hsdp with a traceback; ``scaletrain.parallel.fsdp_mean`` probes the
reduction at set-up and corrects it or refuses. One 4-rank launch of ``fsdp_mean_worker.py``
replays those releases' collectives on the installed torch (the range run,
scripts/test_torch_range.sh, also runs this on the real releases): each case's gradients
must equal one process's within 1e-5 (fp32), or the strategy is refused with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from workers import launch_json

from scaletrain.torch_features import fsdp_on_cpu

pytestmark = [pytest.mark.multiproc,
              pytest.mark.skipif(not fsdp_on_cpu(), reason="FSDP2 on the CPU needs torch 2.7")]

WORKER = Path(__file__).with_name("fsdp_mean_worker.py")
TOL = 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    data = launch_json(WORKER, 4, tmp_path_factory.mktemp("fsdp-mean"), timeout=420)
    assert data["world_size"] == 4
    return data["results"]


@pytest.mark.parametrize("case", ["native", "rs-sums", "rs-sums-old-fsdp"])
def test_zero3_gradients_are_the_mean(results, case):
    r = results[f"{case}/zero3"]
    assert "raised" not in r, r
    # a sum over 4 ranks would be off by up to 3x the largest gradient
    assert r["grad_max"] > 100 * TOL
    assert r["diff"] <= TOL, r


def _force_sum() -> bool:
    """Whether this torch's FSDP2 can be switched to sum-then-divide (from 2.8.0)."""
    from torch.distributed.fsdp import FSDPModule

    return hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


def _assert_refused(r: dict, strategy: str, cause: str) -> None:
    assert r.get("raised") == "StrategyError", r
    message = r["message"]
    assert "\n" not in message and "over gloo on torch " in message, message
    assert f"strategy {strategy!r}" in message and cause in message, message
    assert "ddp or zero1" in r["hint"]


@pytest.mark.parametrize("case", ["native", "rs-sums"])
def test_hsdp_gradients_are_the_mean(results, case):
    r = results[f"{case}/hsdp"]
    if not _force_sum() and "raised" in r:
        # torch 2.7.1 itself: gloo refuses the AVG all-reduce, and nothing can replace it
        _assert_refused(r, "hsdp", "Cannot use ReduceOp.AVG with Gloo")
        return
    assert "raised" not in r, r
    assert r["diff"] <= TOL, r


@pytest.mark.parametrize("key", ["rs-sums-old-fsdp/hsdp", "rs-sums-no-fix/hsdp"])
def test_hsdp_refused_in_one_line_where_all_reduce_cannot_average(results, key):
    _assert_refused(results[key], "hsdp", "Cannot use ReduceOp.AVG with Gloo")


def test_zero3_refused_in_one_line_where_the_sum_cannot_be_corrected(results):
    _assert_refused(results["rs-sums-no-fix/zero3"], "zero3", "4 times their mean over 4 ranks")
