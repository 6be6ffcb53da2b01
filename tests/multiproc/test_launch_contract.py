"""`scaletrain run` gives any torchrun-style script the torchrun contract (tier 2, real processes).

Two launches for the whole module:
- 3 ranks, output of all ranks, SLURM_CPUS_PER_TASK=6 and no OMP_NUM_THREADS (so the launcher
  must hand out 6 / 3 = 2 threads), flag-like script arguments;
- 2 ranks with --ranks 0 and --procs-per-gpu 2 (on a CPU machine: 2 ranks on the one
  device, told to use gloo), a user MASTER_PORT and a user OMP_NUM_THREADS=1 (both must win;
  without the user's value the launcher would hand out SLURM_CPUS_PER_TASK=4 / 2 = 2).
The worker script is plain torch with no scaletrain import.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import free_port
from workers import launcher_cmd, worker_env

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("launch_contract_worker.py")
PASSED = ["--epochs", "3", "-x", "--nproc-per-node", "9", "--", "tail value"]


def _launch(tmp: Path, nproc: int, launcher_args: list[str], extra: dict[str, str],
            drop: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = worker_env(extra)
    for name in drop:
        env.pop(name, None)
    cmd = [*launcher_cmd(nproc, launcher_args), str(WORKER), str(tmp), *PASSED]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    records = [json.loads(p.read_text()) for p in sorted(tmp.glob("rank*.json"))]
    return proc, records


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    out = tmp_path_factory.mktemp("contract3")
    return _launch(out, 3, [], {"SLURM_CPUS_PER_TASK": "6"}, drop=("OMP_NUM_THREADS",))


@pytest.fixture(scope="module")
def rank0_only(tmp_path_factory):
    out = tmp_path_factory.mktemp("contract2")
    port = free_port()
    proc, records = _launch(out, 2, ["--ranks", "0", "--procs-per-gpu", "2"],
                            {"MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                             "SLURM_CPUS_PER_TASK": "4"})
    return proc, records, port


def test_runs_and_every_rank_reports(three):
    proc, records = three
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(r["dist_rank"] for r in records) == [0, 1, 2]


def test_env_contract(three):
    _, records = three
    for rec in records:
        env, rank = rec["env"], rec["dist_rank"]
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank)
        assert env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "3" and env["LOCAL_WORLD_SIZE"] == "3"
        assert env["GROUP_RANK"] == "0"
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert env["MASTER_ADDR"] and env["MASTER_PORT"].isdigit()
        assert env["SCALETRAIN_BACKEND"] is None  # only --procs-per-gpu sets it
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert len({rec["env"][key] for rec in records}) == 1, key


def test_all_reduce_sums(three):
    _, records = three
    for rec in records:
        assert rec["dist_world"] == 3
        assert rec["sum"] == 1 + 2 + 3
        assert rec["vector"] == [0.0, 6.0, 12.0, 18.0]
        assert rec["max"] == 20


def test_plain_script_needs_no_scaletrain(three):
    _, records = three
    assert not any(rec["scaletrain_runtime_imported"] for rec in records)


def test_args_passed_verbatim(three):
    _, records = three
    for rec in records:
        assert rec["argv"] == PASSED


def test_threads_are_cores_over_workers(three):
    # SLURM_CPUS_PER_TASK=6 shared by 3 local workers -> 2 each (torchrun would force 1).
    _, records = three
    for rec in records:
        assert rec["env"]["OMP_NUM_THREADS"] == "2"
        assert rec["threads"] == 2


def test_every_line_prefixed_with_its_rank(three):
    proc, _ = three
    for rank in range(3):
        assert f"[rank {rank}] marker-out {rank}" in proc.stdout
        assert f"[rank {rank}] marker-err {rank}" in proc.stderr
    # nothing from a worker reaches the console unprefixed
    assert not [line for line in proc.stdout.splitlines() if line and not line.startswith("[rank ")]


def test_ranks_0_shows_only_rank_0(rank0_only):
    proc, records, _ = rank0_only
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(records) == 2  # rank 1 ran, its output was only hidden
    assert "marker-out 0" in proc.stdout and "marker-err 0" in proc.stderr
    assert "marker-out 1" not in proc.stdout and "marker-err 1" not in proc.stderr


def test_user_master_port_is_used(rank0_only):
    _, records, port = rank0_only
    assert {rec["env"]["MASTER_PORT"] for rec in records} == {str(port)}


def test_user_omp_num_threads_wins(rank0_only):
    _, records, _ = rank0_only
    for rec in records:
        assert rec["env"]["OMP_NUM_THREADS"] == "1"
        assert rec["threads"] == 1


def test_procs_per_gpu_tells_workers_to_use_gloo(rank0_only, three):
    _, records, _ = rank0_only
    for rec in records:
        assert rec["env"]["SCALETRAIN_BACKEND"] == "gloo"
        assert rec["env"]["SCALETRAIN_PROCS_PER_GPU"] == "2"
    assert all(rec["env"]["SCALETRAIN_PROCS_PER_GPU"] is None for rec in three[1])
