"""The memory estimate matches measured per-rank tensor bytes after scaletrain.setup().

One launch on 2 ranks: for ddp, zero1, zero2, zero3 and pipeline, the worker measures each
rank's local bytes of parameters (local DTensor shards; the most held at once during a
step), gradients and Adam state after two steps, next to estimate_memory(...) for the
same model. Every row must be within 10% of the estimate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers import run_workers

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("memory_worker.py")
ROWS = ("params", "grads", "optimizer_state", "total")
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "pipeline")


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("memory") / "results.json"
    proc = run_workers(WORKER, nproc=2, args=["--out", str(out)], timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return json.loads(out.read_text())


def _within(measured_bytes: int, estimate: int, rel: float = 0.10) -> bool:
    return abs(measured_bytes - estimate) <= rel * estimate


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_estimate_within_ten_percent_on_every_rank(measured, strategy):
    ranks = measured["strategies"][strategy]
    assert len(ranks) == measured["world"] == 2
    for rank, m in enumerate(ranks):
        for row in ROWS:
            assert m[row] > 0, (strategy, rank, row)
            assert _within(m[row], m["estimate"][row]), (strategy, rank, row, m)


def test_zero3_holds_one_wth_of_the_parameters(measured):
    world = measured["world"]
    ranks = measured["strategies"]["zero3"]
    full = ranks[0]["full_param_bytes"]
    for m in ranks:
        assert _within(m["params_at_rest"], full / world), m
    assert sum(m["params_at_rest"] for m in ranks) == pytest.approx(full, rel=0.01)
    # and ddp really holds all of it: the comparison can tell the two apart
    assert all(m["params_at_rest"] == full for m in measured["strategies"]["ddp"])


def test_the_ten_percent_check_tells_strategies_apart(measured):
    """Checked against another strategy's estimate, some row fails: the test can fail."""
    for a in STRATEGIES:
        for b in STRATEGIES:
            ea = measured["strategies"][a][0]["estimate"]
            eb = measured["strategies"][b][0]["estimate"]
            if a == b or ea == eb:
                continue  # zero3 and 2-stage pipeline have the same layout on 2 ranks
            m = measured["strategies"][a][0]
            assert not all(_within(m[row], eb[row]) for row in ROWS), (a, b)
