"""init()/shutdown() and the helpers inside this process (world size 1, gloo on the CPU)."""

from __future__ import annotations

import socket

import pytest

import scaletrain
from scaletrain.errors import DistEnvError, UsageError
from scaletrain.runtime import init as init_mod
from scaletrain.runtime.init import current, init, shutdown
from scaletrain.runtime.settle import destroy_group

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture
def local(clean_env):
    """A bare process: no launcher variables, no GPU, shutdown afterwards."""
    clean_env.setenv("SCALETRAIN_DEVICE", "cpu")  # the same result on a GPU machine
    yield clean_env
    shutdown()


def test_public_names_are_the_runtime_functions():
    assert scaletrain.init is init and scaletrain.shutdown is shutdown
    from scaletrain.runtime import helpers

    assert scaletrain.print is helpers.print and scaletrain.main_first is helpers.main_first


def test_single_process_init_collectives_and_shutdown(local):
    threads = torch.get_num_threads()
    env = init()
    assert (env.rank, env.world_size, env.device, env.backend, env.launcher) == \
        (0, 1, "cpu", "gloo", "local")
    assert current() is env
    # a real one-rank group: collectives and DDP work unchanged at world size 1
    assert dist.is_initialized() and dist.get_world_size() == 1
    t = torch.tensor([2.0, 3.0])
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 3.0]
    assert int(env.extra["num_threads"]) >= 1
    shutdown()
    assert not dist.is_initialized() and current() is None
    assert torch.get_num_threads() == threads  # restored
    shutdown()  # twice is fine


def test_init_is_idempotent_and_rejects_conflicts(local):
    env = init()
    assert init() is env
    assert init(device="cpu", backend="gloo") is env
    with pytest.raises(UsageError, match="already ran with backend 'gloo'"):
        init(backend="nccl")
    with pytest.raises(UsageError, match="already ran with device 'cpu'"):
        init(device="cuda")
    with pytest.raises(UsageError, match="timeout_s"):
        init(timeout_s=5)
    assert current() is env and dist.is_initialized()


def test_bad_arguments(local):
    with pytest.raises(UsageError, match="backend='tcp'"):
        init(backend="tcp")
    with pytest.raises(UsageError, match="nccl"):
        init(device="cpu", backend="nccl")
    with pytest.raises(UsageError, match="timeout_s"):
        init(timeout_s=0)
    assert not dist.is_initialized() and current() is None


def test_slurm_gpus_with_cpu_torch_fails_then_cpu_works(clean_env):
    if torch.cuda.is_available():
        pytest.skip("this torch has GPU support")
    for k, v in {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
                 "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS": "1",
                 "SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "1",
                 "SLURM_JOB_NODELIST": "localhost", "CUDA_VISIBLE_DEVICES": "0,1",
                 "SLURM_GPUS_ON_NODE": "2"}.items():
        clean_env.setenv(k, v)
    with pytest.raises(DistEnvError) as info:
        init()
    assert "GPUs were allocated (CUDA_VISIBLE_DEVICES=0,1)" in info.value.message
    assert "SCALETRAIN_DEVICE=cpu" in info.value.hint
    assert not dist.is_initialized() and current() is None
    try:
        env = init(device="cpu")
        assert (env.launcher, env.job_id, env.device, env.backend) == ("slurm", "77", "cpu", "gloo")
        assert env.master_port == 10077
    finally:
        shutdown()


def test_batch_step_warns_and_runs_single(clean_env):
    for k, v in {"SLURM_JOB_ID": "78", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
                 "SLURM_TASKS_PER_NODE": "4", "SCALETRAIN_DEVICE": "cpu"}.items():
        clean_env.setenv(k, v)
    try:
        with pytest.warns(RuntimeWarning, match="asked for 4 tasks; start the program with srun"):
            env = init()
        assert env.world_size == 1 and env.job_id == "78"
    finally:
        shutdown()


def test_existing_group_is_adopted_and_left_alone(local):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        env = init()
        assert env.backend == "gloo" and env.world_size == 1
        shutdown()
        assert dist.is_initialized()  # not ours to destroy
    finally:
        destroy_group()


def test_port_in_use_is_a_one_line_error(clean_env):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                 "SCALETRAIN_DEVICE": "cpu"}.items():
        clean_env.setenv(k, v)
    try:
        with pytest.raises(DistEnvError, match=f"rendezvous port 127.0.0.1:{port} is already in use"):
            init(timeout_s=2)
    finally:
        sock.close()
    assert not dist.is_initialized() and current() is None


def test_init_method_brackets_ipv6():
    env = scaletrain.Env(master_addr="fe80::1", master_port=1234)
    assert init_mod._init_method(env) == "tcp://[fe80::1]:1234"


# --- helpers: without init, after init ---------------------------------------------------

def test_helpers_without_init_single_process(local, capsys):
    scaletrain.print("hello", 42)
    scaletrain.print("not me", ranks=[1])
    scaletrain.print("all", ranks="all")  # world size 1: no prefix
    scaletrain.barrier()
    order = []
    with scaletrain.main_first():
        order.append("body")
    assert order == ["body"]
    assert capsys.readouterr().out == "hello 42\nall\n"


def test_helpers_after_init(local, capsys):
    init()
    scaletrain.print("x", end="!\n")
    scaletrain.barrier()
    with scaletrain.main_first(local=True):
        pass
    assert capsys.readouterr().out == "x!\n"


def test_helpers_follow_the_launcher_rank_without_init(clean_env, capsys):
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h",
                 "MASTER_PORT": "1"}.items():
        clean_env.setenv(k, v)
    scaletrain.print("rank 0 only")
    scaletrain.print("everyone", ranks="all")
    scaletrain.print("some", ranks=(0, 1))
    assert capsys.readouterr().out == "[rank 1] everyone\n[rank 1] some\n"
    with pytest.raises(DistEnvError, match="call scaletrain.init"):
        scaletrain.barrier()


def test_main_first_releases_others_when_first_raises(local):
    init()
    with pytest.raises(ValueError):
        with scaletrain.main_first():
            raise ValueError("download failed")
    assert current() is not None


def test_cpu_plan_uses_the_exported_map_and_physical_gpu():
    """LUMI: the generated script exports the profile's GPU->cores map; a task that sees
    GCD 3 as cuda:0 is bound to that GCD's CCD, cores 25-31. No profile is read here."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.contract.environ import GPU_CPU_MAP_VAR, format_gpu_cpu_map
    from scaletrain.runtime.env import Placement
    from scaletrain.runtime.resolve import plan_cpus

    environ = {GPU_CPU_MAP_VAR: format_gpu_cpu_map(load_profile("lumi").gpu_cpu_map),
               "ROCR_VISIBLE_DEVICES": "3", "SLURM_CPUS_PER_TASK": "7", "SLURM_JOB_ID": "1"}
    placement = Placement(rank=3, local_rank=3, world_size=8, local_world_size=8,
                          launcher="slurm")
    plan = plan_cpus(placement, "cuda:0", environ, allowed=range(64))
    assert plan.binding is not None and plan.binding.cores == tuple(range(25, 32))
    facts = plan.facts()
    assert facts["cpu_bind"] == "25-31" and "GPU 3" in facts["cpu_bind_reason"]
    assert facts["num_threads"] == "7"
    # an srun task already bound to exactly those cores: nothing to do
    assert plan_cpus(placement, "cuda:0", environ, allowed=range(25, 32)).binding is None
    off = plan_cpus(placement, "cuda:0", {**environ, "SCALETRAIN_CPU_BIND": "none"},
                    allowed=range(64))
    assert off.binding is None and "cpu_bind" not in off.facts()
    with pytest.raises(DistEnvError, match="SCALETRAIN_GPU_CPU_MAP"):
        plan_cpus(placement, "cuda:0", {GPU_CPU_MAP_VAR: "3:x-y"}, allowed=range(64))


def test_launcher_backend_and_procs_per_gpu_variables(local):
    """`scaletrain run --procs-per-gpu` tells workers gloo through SCALETRAIN_BACKEND."""
    local.setenv("SCALETRAIN_BACKEND", "gloo")
    local.setenv("SCALETRAIN_PROCS_PER_GPU", "2")
    env = init()
    assert env.backend == "gloo" and env.device == "cpu"
    shutdown()
    local.setenv("SCALETRAIN_PROCS_PER_GPU", "zero")
    with pytest.raises(DistEnvError, match="SCALETRAIN_PROCS_PER_GPU='zero'"):
        init()
    local.delenv("SCALETRAIN_PROCS_PER_GPU")
    local.setenv("SCALETRAIN_BACKEND", "carrier-pigeon")
    with pytest.raises(UsageError, match="carrier-pigeon"):
        init()


def test_rank_print_is_print_without_shadowing_the_builtin():
    from scaletrain.runtime import helpers

    assert scaletrain.rank_print is helpers.rank_print is scaletrain.print
    namespace: dict = {}
    exec("from scaletrain import *", namespace)
    assert "print" not in namespace and namespace["rank_print"] is helpers.rank_print
