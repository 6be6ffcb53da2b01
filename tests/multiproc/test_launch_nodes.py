"""Several launchers on one machine (tier 2): two "nodes" form one job; two jobs stay apart.

- `scaletrain run --nnodes 2 --node-rank 0|1 --master-addr 127.0.0.1 --master-port P`, started
  together with 2 workers each, must form one world of 4 (ranks 0-3, sums over 4 ranks).
- two single-node `scaletrain run --nproc-per-node 2` started at the same moment must each
  pick their own port and form two separate worlds of 2.
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


def _together(cmds: list[list[str]], env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in cmds]
    results = []
    try:
        for p, c in zip(procs, cmds):
            out, err = p.communicate(timeout=180)
            results.append(subprocess.CompletedProcess(c, p.returncode, out, err))
    finally:
        for p in procs:  # a hung launcher must not outlive the test
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def _records(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    out = tmp_path_factory.mktemp("nodes")
    port = free_port()
    cmds = [[*launcher_cmd(2, ["--nnodes", "2", "--node-rank", str(node),
                               "--master-addr", "127.0.0.1", "--master-port", str(port)]),
             str(WORKER), str(out)] for node in (0, 1)]
    return _together(cmds, worker_env()), _records(out), port


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    outs = [tmp_path_factory.mktemp(f"job{i}") for i in (0, 1)]
    cmds = [[*launcher_cmd(2), str(WORKER), str(o)] for o in outs]
    return _together(cmds, worker_env()), [_records(o) for o in outs]


def test_two_launchers_form_world_of_four(two_nodes):
    results, records, port = two_nodes
    for res in results:
        assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(r["dist_rank"] for r in records) == [0, 1, 2, 3]
    for rec in records:
        assert rec["dist_world"] == 4 and rec["env"]["WORLD_SIZE"] == "4"
        assert rec["env"]["LOCAL_WORLD_SIZE"] == "2"
        assert rec["sum"] == 1 + 2 + 3 + 4
        assert rec["env"]["MASTER_PORT"] == str(port)
        assert rec["env"]["MASTER_ADDR"] == "127.0.0.1"


def test_node_rank_decides_global_ranks(two_nodes):
    _, records, _ = two_nodes
    for rec in records:
        node = int(rec["env"]["GROUP_RANK"])
        assert rec["dist_rank"] == node * 2 + int(rec["env"]["LOCAL_RANK"])


def test_concurrent_launches_do_not_collide(two_jobs):
    results, records = two_jobs
    for res in results:
        assert res.returncode == 0, res.stdout + res.stderr
    ports = []
    for recs in records:
        assert sorted(r["dist_rank"] for r in recs) == [0, 1]
        assert all(r["dist_world"] == 2 and r["sum"] == 3 for r in recs)
        ports.append({r["env"]["MASTER_PORT"] for r in recs})
    assert len(ports[0]) == 1 and ports[0] != ports[1]
