"""Every consumer of "who am I" follows a process group the program made itself.

Two launches of tests/multiproc/user_group_worker.py under ``scaletrain run --nproc-per-node 2``:
``plain`` (``dist.init_process_group("gloo")``, the Monitor bug's repro: both ranks believed
they were rank 0 of 1 and appended to one metrics.jsonl) and ``swapped`` (the group numbers
the ranks in reverse of the launcher's RANK, so reading the launcher's variables is wrong).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import free_port
from workers import run_workers

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("user_group_worker.py")
NPROC = 2
STEPS = 5


@pytest.fixture(scope="module", params=["plain", "swapped"])
def launched(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"user_group_{request.param}")
    extra = ["--swap-port", str(free_port())] if request.param == "swapped" else []
    proc = run_workers(WORKER, NPROC, [str(out), *extra], env={"SCALETRAIN_DEVICE": "cpu"},
                       timeout=150)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(NPROC)]
    return request.param, out, proc, records


def test_ranks_are_the_groups(launched):
    mode, _, _, records = launched
    for rank, rec in enumerate(records):
        expected_launcher = NPROC - 1 - rank if mode == "swapped" else rank
        assert rec["launcher_rank"] == expected_launcher
        assert rec["env"] == [rank, NPROC, "cpu", "gloo"]
        assert rec["collective_device"] == "cpu"
        assert rec["error_rank"] == str(rank)


def test_loader_shards_by_group_rank(launched):
    for rank, rec in enumerate(launched[3]):
        assert rec["loader"] == list(range(rank, 8, NPROC))


def test_helpers_and_metrics(launched):
    _, _, proc, records = launched
    assert proc.stdout.count("PRINT-DEFAULT") == 1
    assert "PRINT-DEFAULT from group rank 0" in proc.stdout
    for rec in records:
        assert rec["mean"] == pytest.approx(0.5)
        assert rec["gathered"] == [0, 1]
    assert [rec["main_first_saw_flag"] for rec in records] == [False, True]


def test_checkpoint_comm_stop_agreement_and_record(launched):
    records = launched[3]
    assert records[0]["comm"] == [0, NPROC, [0, 1]]
    assert records[1]["comm"] == [1, NPROC, None]
    assert [r["agreed"] for r in records] == ["requested"] * NPROC
    assert records[0]["stop_rank_count"] == NPROC


def test_checkpointer_and_export_follow_the_group(launched):
    _, out, _, records = launched
    # only the group's rank 0 writes (in "swapped" it is the launcher's rank 1)
    assert [r["checkpoint"] for r in records] == [[7, True, True], [7, True, False]]
    assert sorted(p.name for p in (out / "ckpt").iterdir() if p.name.startswith("step-")) == \
        ["step-00000007"]
    assert (out / "model.pt").is_file()


def test_monitor_writes_once_for_the_whole_group(launched):
    _, out, _, records = launched
    assert [r["monitor"] for r in records] == [[0, NPROC, NPROC], [1, NPROC, NPROC]]
    lines = [json.loads(line) for line in (out / "monitor" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["type"] == "step"] == list(range(1, STEPS + 1))
    assert sum(line["type"] == "summary" for line in lines) == 1
    summary = json.loads((out / "monitor" / "summary.json").read_text())
    assert summary["world_size"] == NPROC and summary["steps"] == STEPS
