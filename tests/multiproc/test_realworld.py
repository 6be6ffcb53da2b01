"""Programs shaped like the ones people bring (PyTorch tutorials, centre course material,
Lightning), written in our own words: each trains with world size 2 under `scaletrain run
--cpu`, and its ranks end with the same parameters. One launch per program."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import alive, free_port
from workers import REPO, launcher_cmd, run_workers, worker_env

pytestmark = pytest.mark.multiproc
PROGS = REPO / "tests" / "multiproc" / "realworld"
WARNING = "did not form one process group"


def _train(tmp_path, program, *args, launcher_args=("--cpu",), env=None, nproc=2):
    out = tmp_path / "out.json"
    proc = run_workers(PROGS / program, nproc=nproc, args=[*args, str(out)],
                       launcher_args=list(launcher_args), env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert WARNING not in proc.stderr, proc.stderr
    result = json.loads(out.read_text())
    assert result["world"] == 2 and result["params_equal"], result
    assert all(math.isfinite(v) for v in result["first"]) and result["sum"] != 0.0
    return result, proc


@pytest.mark.parametrize("program", ["int_device.py", "cuda_rank.py", "device_rank.py",
                                     "current_device.py"])
def test_integer_devices_map_to_the_cpu(tmp_path, program):
    result, _ = _train(tmp_path, program)
    assert result["backend"] == "gloo"


def test_fsdp2_on_a_cuda_device_mesh(tmp_path):
    result, _ = _train(tmp_path, "fsdp2_mesh.py")
    assert result["mesh"] == "cpu" and result["local"] == "cpu"


def test_tensor_parallel_on_the_current_accelerator(tmp_path):
    result, _ = _train(tmp_path, "tensor_parallel.py")
    assert result["device_type"] == "cuda"  # what the program asked torch.accelerator


@pytest.mark.parametrize("accelerator", ["auto", "gpu"])
def test_lightning_takes_its_cuda_path(tmp_path, accelerator):
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("lightning is not installed")
    result, _ = _train(tmp_path, "lightning_auto.py", accelerator)
    assert result["accelerator"] == "CUDAAccelerator" and result["devices"] == 2
    assert result["steps"] == 4  # 64 samples, 2 ranks, batches of 8


def test_dataloader_workers_helper_threads_and_a_centre_core_list(tmp_path):
    result, proc = _train(tmp_path, "dataloader_workers.py")
    assert result["steps"] == 4  # 32 samples, 2 ranks, batches of 4
    assert result["cores"] >= 1
    lines = [ln for ln in proc.stderr.splitlines() if "os.sched_setaffinity asked for" in ln]
    assert len(lines) == 2 and "this machine has" in lines[0]  # once per worker


@pytest.mark.parametrize("form,env,nodes", [
    ("exported", {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, 1),
    ("computed", None, 1),
    ("computed", None, 2)], ids=["exported", "computed", "computed-2-nodes"])
def test_srun_form_under_emulated_slurm_keeps_exported_world_size(tmp_path, form, env, nodes):
    """WORLD_SIZE exported before `scaletrain run`, or computed by the program from Slurm's
    variables with MASTER_ADDR the first host of SLURM_JOB_NODELIST (an emulated node name)."""
    result, _ = _train(tmp_path, "srun_exported.py", form, nproc=2 // nodes,
                       launcher_args=("--emulate", "slurm", "--cpu", "--nnodes", str(nodes)),
                       env=env)
    assert result["exported_world"] == "2"


def test_cuda_graph_is_refused_in_one_line(tmp_path):
    proc = run_workers(PROGS / "cuda_graph.py", nproc=2, launcher_args=["--cpu"])
    assert proc.returncode != 0
    assert "--cpu cannot run torch.cuda.CUDAGraph: CUDA graphs replay" in proc.stderr
    assert "Traceback" not in proc.stderr


def _pids(folder):
    return [int(p) for f in sorted(folder.iterdir()) for p in f.read_text().split()]


@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_nothing_a_worker_started_outlives_the_run(tmp_path, mode):
    """A child ignoring SIGTERM, a double-fork + setsid daemon and a subprocess per worker:
    gone when `scaletrain run` returns, whether the workers succeeded or one failed."""
    folder = tmp_path / "pids"
    folder.mkdir()
    proc = run_workers(PROGS / "daemon.py", nproc=2, args=[mode, str(folder)],
                       env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"})
    assert proc.returncode == (0 if mode == "ok" else 1), proc.stderr[-3000:]
    pids = _pids(folder)
    assert len(pids) == 6  # 3 per worker
    assert [p for p in pids if alive(p)] == []
    said = re.search(r"stopped (\d) process\(es\) the workers had started and left running "
                     r"\(PIDs [\d, ]+\), (\d) of them with SIGKILL after 2 s", proc.stderr)
    assert said, proc.stderr[-3000:]
    # the two per worker that ignore SIGTERM are always ours to kill; after a failure the agent
    # may already have stopped the plain subprocess in the failed worker's process group
    assert 4 <= int(said.group(1)) <= 6 and int(said.group(2)) == 4


def test_nothing_outlives_a_launcher_stopped_by_timeout(tmp_path):
    folder = tmp_path / "pids"
    folder.mkdir()
    cmd = [*launcher_cmd(2), str(PROGS / "daemon.py"), "hang", str(folder)]
    launcher = subprocess.Popen(cmd, env=worker_env({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while len(list(folder.iterdir())) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # the PID files are written before the worker sleeps
        launcher.send_signal(signal.SIGTERM)  # what `timeout` sends
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert [p for p in _pids(folder) if alive(p)] == []


def test_mp_spawn_under_two_workers_ends_naming_the_port(tmp_path):
    port = free_port()
    start = time.monotonic()
    proc = run_workers(PROGS / "mp_spawn.py", nproc=2, args=[str(port)],
                       env={"SCALETRAIN_RENDEZVOUS_TIMEOUT": "15"}, timeout=170)
    took = time.monotonic() - start
    assert proc.returncode != 0
    assert "starts 2 workers of its own (torch.multiprocessing.spawn)" in proc.stderr
    # the copies' rank 0 each host a store at the same port: one waits, or finds it taken
    assert f"the rendezvous at localhost:{port} " in proc.stderr
    assert "the copies collide there" in proc.stderr
    assert took < 150, took  # not the 30-minute start-up timeout


def test_mp_spawn_under_one_worker_trains(tmp_path):
    """The documented remedy, --nproc-per-node 1: the program's own workers host their own
    store at its port, instead of waiting as clients of the agent's (issue 29 item 11)."""
    proc = run_workers(PROGS / "mp_spawn.py", nproc=1, args=[str(free_port())],
                       env={"SCALETRAIN_RENDEZVOUS_TIMEOUT": "30"}, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "did not complete within" not in proc.stderr
    assert "workers of its own" not in proc.stderr  # one launcher worker: nothing collides


def test_unresolvable_master_addr_is_one_line_from_the_launcher(tmp_path):
    proc = run_workers(PROGS / "srun_exported.py", nproc=2, args=["computed", tmp_path / "x"],
                       env={"MASTER_ADDR": "no-such-host.invalid",
                            "SCALETRAIN_RESOLVE_TIMEOUT": "1"}, timeout=60)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert ("error: MASTER_ADDR='no-such-host.invalid' does not resolve (tried for 1 s"
            in proc.stderr)


def test_unresolvable_master_addr_stops_init_under_another_launcher(tmp_path):
    """A rank started by torchrun or srun: scaletrain.init() gives up after the bound."""
    env = worker_env({"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                      "MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": str(free_port()),
                      "SCALETRAIN_RESOLVE_TIMEOUT": "1"})
    proc = subprocess.run([sys.executable, "-c", "import scaletrain; scaletrain.init()"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode != 0
    assert "rank 1: MASTER_ADDR='no-such-host.invalid' does not resolve" in proc.stderr


@pytest.mark.built
def test_csc_deepspeed_shape_trains_on_deepspeeds_cpu_accelerator(tmp_path):
    """The CSC guide's DeepSpeed program under --cpu: torch.cuda answers as a GPU node there, so
    DeepSpeed would take its CUDA accelerator and JIT-build CUDA ops; --cpu gives it its CPU one
    (DS_ACCELERATOR=cpu, the user's own choice kept). The config's Adam is torch's (torch_adam):
    DeepSpeed's fused CPU Adam is a C++ build of minutes on first use, not what is tested here."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (scripts/test.sh installs it)")
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16,
                                  "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}}}))
    result, _ = _train(tmp_path, "csc_deepspeed.py", "--deepspeed", "--deepspeed_config", str(config))
    assert result["accelerator"] == "cpu" and result["backend"] == "gloo"
    assert result["steps"] == 12                      # 128 samples / (16 x 2 ranks) x 3 epochs
    assert result["last_loss"] < result["first_loss"]
