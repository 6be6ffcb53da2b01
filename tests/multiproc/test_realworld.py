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
