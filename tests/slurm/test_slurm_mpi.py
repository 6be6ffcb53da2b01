"""srun --mpi=pmix on the real local Slurm: scaletrain.init() agrees with mpi4py on 2 nodes x 2."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slurm
PROBE = REPO / "tests" / "multiproc" / "bring" / "mpi4py_probe.py"


def test_srun_pmix_ranks_match_mpi4py(slurm_cluster, tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (scripts/test.sh installs it with Open MPI)")
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed (WITH_MPI=1 tests/slurm/harness/install.sh)")
    mpis = slurm_cluster.run("srun", "--mpi=list", timeout=30)
    if "pmix" not in mpis.stdout + mpis.stderr:
        pytest.skip(f"this Slurm has no PMIx plugin: {mpis.stdout.strip()} {mpis.stderr.strip()}")
    out = tmp_path / "views.json"
    proc = slurm_cluster.run("srun", "--mpi=pmix", "--nodes=2", "--ntasks-per-node=2",
                             "--cpus-per-task=1", "--kill-on-bad-exit=1", "--time=2",
                             sys.executable, str(PROBE), str(out), timeout=180,
                             extra_env={"OMPI_MCA_btl": "self,tcp"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    views = json.loads(out.read_text())["views"]
    got = sorted((v["mpi_rank"], v["rank"], v["world"], v["local_rank"], v["node"]) for v in views)
    assert got == [(r, r, 4, r % 2, r // 2) for r in range(4)]
    assert {v["launcher"] for v in views} == {"slurm"}  # srun's own variables come first
