"""Real Open MPI: a program started by mpirun (with mpi4py) gets the right ranks from
scaletrain.init(), and torch.distributed works between the MPI-started processes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from workers import REPO, worker_env

pytestmark = pytest.mark.multiproc
PROBE = REPO / "tests" / "multiproc" / "bring" / "mpi4py_probe.py"


def test_mpirun_ranks_match_mpi4py(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/test.sh installs it with Open MPI)")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (WITH_MPI=1 tests/slurm/harness/install.sh)")
    out = tmp_path / "views.json"
    env = worker_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                      "OMPI_MCA_btl": "self,tcp"})
    proc = subprocess.run([mpirun, "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x",
                           "OMP_NUM_THREADS", sys.executable, str(PROBE), str(out)],
                          env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    got = sorted((v["mpi_rank"], v["rank"], v["world"], v["local_rank"], v["launcher"])
                 for v in result["views"])
    assert got == [(0, 0, 2, 0, "openmpi"), (1, 1, 2, 1, "openmpi")]
    assert result["mean_rank"] == pytest.approx(0.5)  # a torch collective over the MPI ranks
