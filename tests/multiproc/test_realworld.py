"""Programs shaped like the ones people bring (PyTorch tutorials, centre course material,
Lightning), written in our own words: each trains with world size 2 under `scaletrain run
--cpu`, and its ranks end with the same parameters. One launch per program."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from helpers import free_port
from workers import REPO, run_workers

pytestmark = pytest.mark.multiproc
PROGS = REPO / "tests" / "multiproc" / "realworld"
WARNING = "did not form one process group"


def _train(tmp_path, program, *args, launcher_args=("--cpu",), env=None):
    out = tmp_path / "out.json"
    proc = run_workers(PROGS / program, nproc=2, args=[*args, str(out)],
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


@pytest.mark.parametrize("form,env", [
    ("exported", {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}),
    ("computed", None)])
def test_srun_form_under_emulated_slurm_keeps_exported_world_size(tmp_path, form, env):
    result, _ = _train(tmp_path, "srun_exported.py", form,
                       launcher_args=("--emulate", "slurm", "--cpu"), env=env)
    assert result["exported_world"] == "2"


def test_cuda_graph_is_refused_in_one_line(tmp_path):
    proc = run_workers(PROGS / "cuda_graph.py", nproc=2, launcher_args=["--cpu"])
    assert proc.returncode != 0
    assert "--cpu cannot run torch.cuda.CUDAGraph: CUDA graphs replay" in proc.stderr
    assert "Traceback" not in proc.stderr
