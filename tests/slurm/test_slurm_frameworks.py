"""Lightning and Accelerate programs in a real 2-node Slurm job written by `submit`: each
framework reports one world of 4 processes (2 nodes x 2) from inside the framework."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import REPO

pytestmark = pytest.mark.slurm
EXAMPLES = REPO / "examples" / "bring"


@pytest.mark.parametrize("launcher,program,setting,key", [
    ("lightning", "lightning_train.py", "told", "world_size"),
    ("accelerate", "accelerate_train.py", "cpu", "num_processes"),
])
def test_framework_forms_one_world_under_slurm(slurm_cluster, probed_profile, tmp_path,
                                               launcher, program, setting, key):
    if importlib.util.find_spec(launcher) is None:
        pytest.skip(f"{launcher} is not installed (pip install -e '.[test]')")
    out = tmp_path / "world.json"
    proc = slurm_cluster.scaletrain(
        "submit", "--profile", str(probed_profile), "--run-dir", str(tmp_path / "run"), "--wait",
        "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-gpu", "1", "--device", "cpu",
        "--time", "00:05:00", "--launcher", launcher, "--", str(EXAMPLES / program), setting,
        str(out), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text())[key] == 4
