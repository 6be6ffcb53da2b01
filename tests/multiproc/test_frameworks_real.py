"""The guides' last two systems with their real packages: Horovod (the Alliance's program shape)
at world 2 under ``scaletrain run --emulate mpi`` and under Open MPI's ``mpirun``, and a
TensorFlow MultiWorkerMirroredStrategy program with two workers from scaletrain's TF_CONFIG.
Each checks that the workers end with the same parameters, equal to one process's training on
the same data (the global batch in one piece) within a tolerance.

The packages live in venvs of their own (scripts/frameworks_env.sh, which scripts/test.sh runs):
a test skips with that script's reason when its venv is not there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import framework_python, free_port, trained_alike
from workers import REPO, worker_env

pytestmark = [pytest.mark.multiproc, pytest.mark.built]
PROGS = REPO / "tests" / "multiproc" / "frameworks"
HVD = PROGS / "hvd_train.py"
TF = PROGS / "tf_multiworker.py"
GROUP_WARNING = "did not form one process group"


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=worker_env(env), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc


def _read(folder: Path, pattern: str, count: int) -> list[dict]:
    found = [json.loads((folder / pattern.format(i)).read_text()) for i in range(count)]
    return found


# ------------------------------------------------------------------------------------- Horovod

@pytest.fixture(scope="module")
def horovod(tmp_path_factory) -> tuple[Path, list[float]]:
    """(the Horovod venv's python, one process's parameters after training on both ranks' batches)."""
    python = framework_python("horovod")
    ref = tmp_path_factory.mktemp("hvd-ref")
    _run([str(python), str(HVD), str(ref), "--batch_size", "32"])
    (one,) = _read(ref, "hvd-{}.json", 1)
    assert one["size"] == 1
    return python, one["params"]


def test_horovod_trains_at_world_2_under_emulate_mpi(horovod, tmp_path):
    """No MPI runtime: the launcher serves Horovod's Gloo rendezvous and each worker gets the
    HOROVOD_* variables of its emulated place."""
    python, reference = horovod
    proc = _run([str(python), "-m", "scaletrain", "run", "--emulate", "mpi", "--nproc-per-node", "2",
                 str(HVD), str(tmp_path)])
    assert GROUP_WARNING not in proc.stderr, proc.stderr   # Horovod's group counts as the run's group
    ranks = _read(tmp_path, "hvd-{}.json", 2)
    assert [(r["rank"], r["size"], r["local_rank"], r["controller"]) for r in ranks] == \
        [(0, 2, 0, "gloo"), (1, 2, 1, "gloo")]
    trained_alike(ranks, reference, "params", rtol=1e-4)


def test_horovod_trains_at_world_2_under_mpirun(horovod, tmp_path):
    python, reference = horovod
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (WITH_MPI=1 tests/slurm/harness/install.sh)")
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,tcp"}
    _run([mpirun, "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
          str(python), str(HVD), str(tmp_path)], env=env)
    ranks = _read(tmp_path, "hvd-{}.json", 2)
    assert [(r["rank"], r["size"], r["controller"]) for r in ranks] == [(0, 2, "mpi"), (1, 2, "mpi")]
    trained_alike(ranks, reference, "params", rtol=1e-4)


# ---------------------------------------------------------------------------------- TensorFlow

def test_tensorflow_multiworker_trains_two_workers_from_scaletrains_tf_config(tmp_path):
    """Two workers as two srun tasks on one node would start them: each gets srun's variables
    (scaletrain's emulation of them) and the TF_CONFIG that 'python -m
    scaletrain.frameworks.tensorflow' prints for its task."""
    from scaletrain.launch.inproc.emulate import Place, slurm_vars

    python = framework_python("tensorflow")
    ref = tmp_path / "ref"
    ref.mkdir()
    _run([str(python), str(TF), str(ref)])
    (one,) = _read(ref, "tf-{}.json", 1)
    assert one["workers"] == 1

    master = free_port()
    procs = []
    for rank in range(2):
        env = {**slurm_vars(Place(rank=rank, world=2, job_id=str(os.getpid()))), "MASTER_PORT": str(master)}
        config = _run([str(python), "-m", "scaletrain.frameworks.tensorflow"], env=env).stdout
        assert json.loads(config)["task"] == {"type": "worker", "index": rank}
        procs.append(subprocess.Popen([str(python), str(TF), str(tmp_path)], env=worker_env({**env, "TF_CONFIG": config}),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO))
    try:
        outputs = [p.communicate(timeout=900)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-4000:] for o in outputs)
    workers = _read(tmp_path, "tf-{}.json", 2)
    assert [(w["index"], w["workers"]) for w in workers] == [(0, 2), (1, 2)]
    trained_alike(workers, one["weights"], "weights", rtol=1e-4)
