"""The scale harness (benchmarks/scale_*.py, docs/scale.md) at small N: every step runs, and its
growth exponent is measured from the sizes it ran at. Counts are checked where they are exact
(requests, bytes, files); times only for being measured, never against a bound."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from workers import REPO

pytestmark = pytest.mark.multiproc
sys.path.insert(0, str(REPO / "benchmarks"))

import scale_after  # noqa: E402
import scale_checkpoint  # noqa: E402
import scale_script  # noqa: E402
import scale_startup  # noqa: E402
import scale_steps  # noqa: E402
from scale_common import exponent  # noqa: E402


def _k(sizes, values) -> float:
    k = exponent(sizes, values)
    assert k is not None and math.isfinite(k), (sizes, values)
    return k


def test_startup_templates_match_the_recording_and_replay_against_both_store_backends():
    assert scale_startup.check_against_recording() == []
    sizes = [16, 32, 64]
    # what the templates ask of the store, counted: the lazy checkpoint group grows with N, the
    # eager one (39e04f3) with N^2 (its values with N too: N^3 bytes)
    lazy = [scale_startup.model_counts("srun-nccl-lazy", n)["requests"] for n in sizes]
    eager = [scale_startup.model_counts("srun-nccl-eager", n)["reply_mb"] for n in sizes]
    assert 0.9 < _k(sizes, lazy) < 1.3 and 2.3 < _k(sizes, eager) < 3.1
    for backend in ("libuv", "legacy"):
        rows = [scale_startup.replay("srun-nccl-lazy", n, backend) for n in sizes]
        assert all(r["requests"] >= lazy[i] for i, r in enumerate(rows))   # rank 0 polls as long as it waits
        _k(sizes, [r["wall_s"] for r in rows])


def test_monitor_exchange_and_stop_agreement_at_n_ranks():
    sizes = [16, 64, 256]
    root = [scale_steps.measure_exchange(n, 0, repeat=1) for n in sizes]
    other = [scale_steps.measure_exchange(n, 1, repeat=1) for n in sizes]
    assert all(r["slowed"] in r["stragglers"] for r in root)           # the slowed rank is found
    assert 0.9 < _k(sizes, [r["recv_bytes"] for r in root]) < 1.1       # rank 0: N records
    assert [r["recv_bytes"] for r in other] == [32] * 3   # the others: two float64 through a ring all-reduce
    _k(sizes, [r["cpu_s"] for r in root])
    for n in (8, 64):
        got = scale_steps.agreement_delay(n)
        assert got["agreed_s"] is not None and got["periods"] <= 2.0


def test_checkpoint_steps_at_n_rank_files():
    sizes = [8, 32, 128]
    rows = [scale_checkpoint.measure(n, repeat=1) for n in sizes]
    assert 0.9 < _k(sizes, [r["marker_bytes"] for r in rows]) < 1.1    # a file entry per file
    for key in ("commit_s", "choose_sizes_s", "status_s", "report_s", "resume_walk_s", "retention_s"):
        _k(sizes, [r[key] for r in rows])
    dcp = [scale_checkpoint.dcp_metadata(n, 8) for n in (8, 32)]
    assert 0.9 < _k([8, 32], [r["gathered_bytes"] for r in dcp]) < 1.2
    _k([8, 32], [r["plan_s"] + r["finish_s"] for r in dcp])


def test_after_the_job_verbs_on_generated_run_folders(tmp_path):
    nodes = [2, 8, 32]
    times = []
    for count in nodes:
        run = tmp_path / f"run{count}"
        scale_after.generate(run, count, 0.02)
        out = scale_after.measure(run, "report")
        assert out["result"]["gpus"] == count * 4 and out["result"]["resume"] == 200
        times.append(out["s"])
        assert scale_after.measure(run, "status")["result"]["step"] == 72
    _k(nodes, times)


def test_the_batch_script_at_6000_nodes():
    for nodes in (16, 6000):
        row = scale_script.measure(nodes, "scaletrain-run")
        assert row["plan_rc"] == 0 and row["bash_n"] and row["lint_rc"] == 0
        if "batch_rc" in row:           # Slurm's scontrol is here: the script ran with stand-ins
            assert row["batch_rc"] == 0 and row["sruns"] == 1 and row["task_rc"] == 0
