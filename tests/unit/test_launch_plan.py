"""Tier 1: `scaletrain run`'s planning, thread budget, GPU count, ports and failure reports.

All pure functions with explicit environment dicts; no process is started, torch is not needed.
"""

from __future__ import annotations

import signal
import socket
import sys

import pytest

from scaletrain.errors import LaunchError, UsageError
from scaletrain.launch.failure import (FailedRank, exit_code_for, render_tail, root_cause,
                                       worker_failed_error)
from scaletrain.launch.gpus import count_visible_gpus
from scaletrain.runtime.device import parse_visible
from scaletrain.launch.output import console_filter, tail_lines
from scaletrain.launch.ports import check_port_free, port_is_free
from scaletrain.launch.spec import RunRequest, plan_launch
from scaletrain.launch.threads import thread_budget


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def plan(script, env=None, gpus=0, **kw):
    return plan_launch(RunRequest(target=script, **kw), environ=env or {}, gpus=gpus)


# --- the plan -------------------------------------------------------------------------------

def test_single_node_default_is_standalone_on_a_kernel_chosen_port(script):
    p = plan(script, nproc_per_node=2)
    assert (p.rdzv_backend, p.rdzv_endpoint, p.master_port_fixed) == ("c10d", "localhost:0", None)
    assert p.args == ("-u", script) and p.entrypoint == sys.executable


def test_args_are_passed_verbatim(script):
    p = plan(script, args=("--nproc-per-node", "9", "--", "-m"))
    assert p.args == ("-u", script, "--nproc-per-node", "9", "--", "-m")


def test_module_mode(script):
    p = plan("json", module=True, args=("--x",))
    assert p.args == ("-u", "-m", "json", "--x")
    with pytest.raises(UsageError, match="no module named"):
        plan("no_such_module_xyz.sub", module=True)


def test_auto_is_gpu_count_or_one(script):
    assert plan(script).nproc_per_node == 1
    assert plan(script, gpus=4).nproc_per_node == 4


def test_user_master_port_means_static_rendezvous_on_it(script):
    p = plan(script, env={"MASTER_PORT": "31234"}, nproc_per_node=2)
    assert (p.rdzv_backend, p.rdzv_endpoint, p.master_port_fixed) == ("static", "127.0.0.1:31234", 31234)
    p = plan(script, env={"MASTER_PORT": "31234", "MASTER_ADDR": "10.0.0.5"})
    assert p.rdzv_endpoint == "10.0.0.5:31234"


def test_user_master_addr_alone_is_given_to_workers(script):
    p = plan(script, env={"MASTER_ADDR": "myhost"})
    assert p.rdzv_backend == "c10d" and p.local_addr == "myhost"


def test_flag_contradicting_environment_is_an_error(script):
    with pytest.raises(UsageError, match="contradicts MASTER_PORT"):
        plan(script, env={"MASTER_PORT": "1234"}, master_port=4321)
    assert plan(script, env={"MASTER_PORT": "1234"}, master_port=1234).rdzv_endpoint.endswith(":1234")


def test_multi_node_is_static_and_only_node_0_checks_its_port(script):
    p0 = plan(script, nnodes=2, node_rank=0, master_addr="h0", master_port=29555)
    p1 = plan(script, nnodes=2, node_rank=1, master_addr="h0", master_port=29555)
    assert p0.rdzv_backend == p1.rdzv_backend == "static"
    assert p0.rdzv_endpoint == p1.rdzv_endpoint == "h0:29555"
    assert (p0.master_port_fixed, p1.master_port_fixed) == (29555, None)
    assert plan(script, nnodes=2, master_addr="h0").rdzv_endpoint == "h0:29500"


@pytest.mark.parametrize("kw, match", [
    ({"nproc_per_node": 0}, "at least 1"),
    ({"nproc_per_node": "many"}, "number or 'auto'"),
    ({"nnodes": 0}, "at least 1"),
    ({"nnodes": 2, "node_rank": 2, "master_addr": "h"}, "outside 0..1"),
    ({"nnodes": 2, "node_rank": -1, "master_addr": "h"}, "outside 0..1"),
    ({"node_rank": 1}, "needs --nnodes"),
    ({"nnodes": 2}, "needs the address"),
    ({"max_restarts": -1}, "0 or more"),
    ({"ranks": "1"}, "'all' or '0'"),
    ({"procs_per_gpu": 0}, "at least 1"),
    ({"master_port": 70000}, "TCP port"),
    ({"max_restarts": 1, "master_port": 29555}, "--max-restarts needs"),
])
def test_bad_values_are_usage_errors_with_a_hint(script, kw, match):
    with pytest.raises(UsageError, match=match) as info:
        plan(script, **kw)
    assert info.value.hint and "\n" not in info.value.message


def test_missing_script(tmp_path):
    with pytest.raises(UsageError, match="script not found") as info:
        plan(str(tmp_path / "nope.py"))
    assert info.value.exit_code == 2


def test_more_ranks_than_gpus_is_refused_when_gpus_exist(script):
    with pytest.raises(UsageError, match="more than the 2 GPU") as info:
        plan(script, gpus=2, nproc_per_node=3)
    assert "--procs-per-gpu" in info.value.hint
    assert plan(script, gpus=0, nproc_per_node=3).nproc_per_node == 3  # CPU: any count


def test_procs_per_gpu_multiplies_and_asks_for_gloo(script):
    p = plan(script, gpus=2, procs_per_gpu=3)
    assert p.nproc_per_node == 6
    assert p.worker_env["SCALETRAIN_BACKEND"] == "gloo"
    assert p.worker_env["SCALETRAIN_PROCS_PER_GPU"] == "3"
    assert plan(script, gpus=0, procs_per_gpu=3).nproc_per_node == 3  # CPU: same path
    with pytest.raises(UsageError, match="contradicts --procs-per-gpu"):
        plan(script, gpus=2, procs_per_gpu=3, nproc_per_node=4)
    assert "SCALETRAIN_BACKEND" not in plan(script, nproc_per_node=2).worker_env


def test_restarts_get_a_fresh_store_per_attempt(script):
    assert plan(script, max_restarts=2).worker_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan(script).worker_env


# --- threads ----------------------------------------------------------------------------------

def test_threads_share_the_affinity_mask(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    b = thread_budget(4, {})
    assert b.per_worker == 4 and not b.user_set and "16 cores" in b.source
    assert thread_budget(32, {}).per_worker == 1  # never 0


def test_threads_under_slurm_use_cpus_per_task(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    assert thread_budget(2, {"SLURM_CPUS_PER_TASK": "10"}).per_worker == 5


def test_user_omp_num_threads_wins_and_is_not_rewritten(script):
    b = thread_budget(2, {"OMP_NUM_THREADS": "7", "SLURM_CPUS_PER_TASK": "10"})
    assert b.per_worker == 7 and b.user_set
    assert "OMP_NUM_THREADS" not in plan(script, env={"OMP_NUM_THREADS": "7"}).worker_env
    assert plan(script, env={"SLURM_CPUS_PER_TASK": "8"},
                nproc_per_node=2).worker_env["OMP_NUM_THREADS"] == "4"


# --- GPUs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, count", [
    ("", 0), ("-1", 0), ("0", 1), ("0,1,2,3", 4), ("3,1", 2), ("0,1,-1,2", 2),
    ("GPU-8f1c2e4a-aaaa,GPU-11112222-bbbb", 2), ("MIG-1234abcd", 1), ("0, 1", 2),
])
def test_parse_visible_devices(value, count):
    assert len(parse_visible(value)) == count


def test_visible_device_variables_decide_without_probing():
    assert count_visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert count_visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert count_visible_gpus({"ROCR_VISIBLE_DEVICES": "0,1,2"}) == 3


# --- ports ----------------------------------------------------------------------------------------

def test_a_listening_port_is_detected():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(LaunchError, match=f"port {port}") as info:
            check_port_free(port, where="--master-port")
        assert "--master-port" in info.value.hint
    assert port_is_free(port)


# --- output and failures --------------------------------------------------------------------------

def test_console_filter():
    assert console_filter("all", 0) is None
    assert console_filter("0", 0) == {0}
    hidden = console_filter("0", 1)
    assert hidden and 0 not in hidden and 1 not in hidden  # a non-empty set that hides every rank


def test_tail_lines(tmp_path):
    f = tmp_path / "err.log"
    f.write_text("".join(f"line {i}\n" for i in range(100)) + "\n\n")
    assert tail_lines(str(f), 3) == ["line 97", "line 98", "line 99"]
    assert tail_lines(str(tmp_path / "missing"), 3) == []


def _f(rank, code, tail=()):
    return FailedRank(rank=rank, local_rank=rank, pid=100 + rank, exitcode=code, stderr_tail=tuple(tail))


def test_root_cause_skips_ranks_we_stopped_and_peer_losses():
    killed = _f(0, -signal.SIGTERM)
    peer = _f(2, 1, ["RuntimeError: ... Connection closed by peer [127.0.0.1]:1234"])
    real = _f(1, 1, ["ValueError: boom"])
    assert root_cause([killed, peer, real]) is real
    assert root_cause([killed]) is killed  # nothing better: report what there is


def test_exit_codes():
    assert exit_code_for(_f(0, 7)) == 1   # a worker's own code is in the message, not the exit
    assert exit_code_for(_f(0, 3)) == 1   # never confused with scaletrain's "environment" 3
    assert exit_code_for(_f(0, 75)) == 75  # stopped on purpose after saving: passes through
    assert exit_code_for(_f(0, -signal.SIGSEGV)) == 128 + signal.SIGSEGV
    assert exit_code_for(_f(0, 255)) == 1


def test_worker_failed_error_names_rank_and_signal():
    err = worker_failed_error([_f(3, -signal.SIGSEGV, ["Segmentation fault"])], node_rank=1)
    assert err.rank == 3 and "SIGSEGV" in err.message and "on node 1" in err.message
    assert err.exit_code == 128 + signal.SIGSEGV and "\n" not in err.message
    assert "out of memory" in worker_failed_error([_f(1, -signal.SIGKILL)]).hint


def test_render_tail():
    assert "| ValueError: boom" in render_tail(_f(1, 1, ["ValueError: boom"]))
    assert "wrote nothing" in render_tail(_f(1, 1))
