"""Pure parts of "bring your script": emulated launcher variables, the group verdict, the plan."""

from __future__ import annotations

import json

import pytest
from helpers import NO_GPUS

from scaletrain.errors import UsageError
from scaletrain.launch import group_check
from scaletrain.launch.inproc import group_record
from scaletrain.launch.inproc.emulate import Place, mpi_vars, slurm_vars
from scaletrain.launch.spec import RunRequest, plan_launch
from scaletrain.runtime.detect import detect


def test_slurm_vars_follow_the_guides_rank_arithmetic():
    world, nodes = 8, 2
    seen = set()
    for rank in range(world):
        v = slurm_vars(Place(rank=rank, world=world, nodes=nodes, cpus_per_task=3, job_id="42"))
        # the Alliance guide's formula: node * tasks per node + local id
        assert int(v["SLURM_NODEID"]) * int(v["SLURM_NTASKS_PER_NODE"]) + int(v["SLURM_LOCALID"]) == rank
        assert v["SLURM_PROCID"] == str(rank) and v["SLURM_NTASKS"] == "8"
        assert v["SLURM_TASKS_PER_NODE"] == "4(x2)" and v["SLURM_JOB_NODELIST"] == "emu-node[1-2]"
        assert v["SLURMD_NODENAME"] == f"emu-node{rank // 4 + 1}"
        seen.add((v["SLURM_NODEID"], v["SLURM_LOCALID"]))
    assert len(seen) == world


def test_scaletrain_detects_an_emulated_task_like_a_real_one(clean_env):
    v = slurm_vars(Place(rank=3, world=4, nodes=2, job_id="77"))
    # as on a CPU-only machine: on a GPU node 2 tasks would not fit the 1 GPU found there
    env = detect({**v, **NO_GPUS, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12345"})
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.node_rank,
            env.num_nodes, env.local_world_size) == ("slurm", 3, 1, 4, 1, 2, 2)
    mpi = detect({**mpi_vars(Place(rank=2, world=4, nodes=2)), **NO_GPUS, "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": "12345"})
    assert (mpi.launcher, mpi.rank, mpi.local_rank, mpi.world_size) == ("openmpi", 2, 0, 4)


@pytest.fixture
def _plan(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    def make(environ=None, **kw):
        return plan_launch(RunRequest(target=str(script), **kw), environ=environ or {}, gpus=0)
    return make


def test_emulated_nodes_are_local_workers(_plan):
    plan = _plan(nproc_per_node=2, nnodes=3, emulate="slurm")
    assert (plan.nproc_per_node, plan.nnodes, plan.emulated_nodes) == (6, 1, 3)
    assert plan.rdzv_backend == "c10d"
    assert plan.worker_env["SCALETRAIN_EMULATE"] == "slurm"
    assert plan.worker_env["PYTHONPATH"].split(":")[0].endswith("launch/inproc/shim")
    with pytest.raises(UsageError, match="--node-rank"):
        _plan(nproc_per_node=2, nnodes=2, node_rank=1, emulate="slurm")
    with pytest.raises(UsageError, match="not one of"):
        _plan(nproc_per_node=2, emulate="pbs")


def test_the_shim_keeps_the_users_pythonpath_after_its_own(_plan):
    plan = _plan(nproc_per_node=1, cpu=True, environ={"PYTHONPATH": "/mine"})
    assert plan.worker_env["PYTHONPATH"].endswith(":/mine")
    assert plan.worker_env["SCALETRAIN_CPU_SMOKE"] == "1"


def _records(tmp_path, groups=None, exits=None):
    for rank, world in (groups or {}).items():
        (tmp_path / f"group-rank{rank}-pid1.json").write_text(json.dumps({"rank": rank, "world_size": world}))
    for rank, extra in (exits or {}).items():
        (tmp_path / f"exit-rank{rank}-pid1.json").write_text(json.dumps({"rank": rank, **extra}))
    return group_record.read_records(tmp_path)


def test_verdict_quiet_when_all_joined_one_group(tmp_path):
    rec = _records(tmp_path, {"0": 2, "1": 2}, {"0": {}, "1": {}})
    assert group_check.verdict(rec, expected_world=2, local_ranks=["0", "1"]) is None


def test_verdict_names_what_went_wrong(tmp_path):
    rec = _records(tmp_path, {"0": 1}, {"0": {"frameworks": ["lightning"]}})
    text = group_check.verdict(rec, expected_world=2, local_ranks=["0", "1"])
    assert "1 of 2 never started torch.distributed" in text
    assert "groups of size 1 instead of 2" in text and "Trainer(devices=" in text


def test_verdict_sees_a_framework_that_trains_alone_in_a_full_group(tmp_path):
    rec = _records(tmp_path, {"0": 2, "1": 2},
                   {r: {"frameworks": ["accelerate"], "framework_worlds": {"accelerate": 1}}
                    for r in ("0", "1")})
    text = group_check.verdict(rec, expected_world=2, local_ranks=["0", "1"])
    assert "accelerate trained with 1 process(es) instead of 2" in text and "--cpu" in text


def test_verdict_has_nothing_to_say_about_one_worker(tmp_path):
    assert group_check.verdict(_records(tmp_path), expected_world=1, local_ranks=["0"]) is None


def test_verdict_under_cpu_does_not_suggest_cpu(tmp_path):
    rec = _records(tmp_path, {"0": 1, "1": 1}, {"0": {}, "1": {}})
    plain = group_check.verdict(rec, expected_world=2, local_ranks=["0", "1"])
    under_cpu = group_check.verdict(rec, expected_world=2, local_ranks=["0", "1"], cpu=True)
    assert "scaletrain run --cpu" in plain
    assert "--cpu" not in under_cpu.split("HINT:")[1] and "init_process_group" in under_cpu


def test_verdict_after_a_crash_speaks_only_on_evidence_of_lone_training(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    alone = _records(tmp_path / "a", {"0": 1, "1": 1})
    text = group_check.verdict(alone, expected_world=2, local_ranks=["0", "1"], crashed=True)
    assert text.startswith("the 2 workers did not form one process group before they failed")
    early = _records(tmp_path / "b")
    assert group_check.verdict(early, expected_world=2, local_ranks=["0", "1"],
                               crashed=True) is None  # crashed before any group: not "alone"


def test_emulation_keeps_the_torchrun_variables_the_user_exported(_plan):
    from scaletrain.launch.inproc.worker_shim import _emulate

    plan = _plan(nproc_per_node=2, emulate="slurm",
                 environ={"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "PATH": "/bin"})
    worker = {**plan.worker_env, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
              "LOCAL_WORLD_SIZE": "2"}  # what the agent adds
    _emulate("slurm", worker)
    assert worker["WORLD_SIZE"] == "2" and worker["SLURM_PROCID"] == "1"
    assert "RANK" not in worker and "LOCAL_RANK" not in worker  # not exported: srun's view
    plain = _plan(nproc_per_node=2, emulate="slurm", environ={"PATH": "/bin"})
    worker = {**plain.worker_env, "RANK": "1", "WORLD_SIZE": "2"}
    _emulate("slurm", worker)
    assert "WORLD_SIZE" not in worker


@pytest.mark.parametrize("environ,flag", [({"MASTER_PORT": "31234"}, None), ({}, 31234)],
                         ids=["exported", "flag"])
def test_emulation_leaves_the_programs_port_to_the_program(_plan, environ, flag):
    """The launcher's own store binds a free port; the program's MASTER_PORT is the user's."""
    from scaletrain.launch.inproc.worker_shim import _emulate

    plan = _plan(nproc_per_node=2, nnodes=2, emulate="slurm", master_port=flag,
                 environ={**environ, "MASTER_ADDR": "emu-node1"})
    assert (plan.rdzv_backend, plan.rdzv_endpoint, plan.local_addr) == ("c10d", "localhost:0",
                                                                       None)
    assert plan.master_port_fixed == 31234  # still checked free before the workers start
    worker = {**plan.worker_env, "RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "agent-host",
              "MASTER_PORT": "40000"}  # what the agent adds
    _emulate("slurm", worker)
    assert (worker["MASTER_ADDR"], worker["MASTER_PORT"]) == ("emu-node1", "31234")
    plain = _plan(nproc_per_node=2, emulate="slurm", environ={})
    worker = {**plain.worker_env, "RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "40000"}
    _emulate("slurm", worker)
    assert worker["MASTER_PORT"] == "40000"  # nothing exported: the launcher's free port


def test_emulated_host_names_are_recognised():
    from scaletrain.launch.inproc.emulate import is_emulated_host, node_names

    _, first, hosts = node_names(3)
    assert first == "emu-node1" and all(is_emulated_host(h) for h in hosts)
    assert not any(is_emulated_host(h) for h in ("localhost", "emu-node", "emu-nodeX", "node1"))


def test_the_start_up_line_counts_workers_per_emulated_node(_plan):
    """--emulate --nnodes 2 -n 2 printed '4 worker(s) per node' for 2 per emulated node."""
    line = _plan(nproc_per_node=2, nnodes=2, emulate="slurm").describe()
    assert line.startswith("2 worker(s) per node x 2 emulated node(s) here (slurm), 4 in all,"), line


def test_one_of_two_real_nodes_says_what_it_waits_for_and_how_the_other_joins(_plan):
    plan = _plan(nproc_per_node=2, nnodes=2, node_rank=0, master_addr="host0", master_port=29611)
    note = plan.waiting_note()
    assert note.startswith("waiting for the other 1 node(s) (node rank 1) at host0:29611;"), note
    assert "scaletrain run --nnodes 2 --node-rank R --master-addr host0 --master-port 29611 --nproc-per-node 2" in note
    assert _plan(nproc_per_node=2).waiting_note() is None
    assert _plan(nproc_per_node=2, nnodes=2, emulate="slurm").waiting_note() is None
