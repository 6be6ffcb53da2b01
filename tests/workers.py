"""Start real worker processes for multi-process tests (tier 2), through our own launcher.

Usage in a test::

    from workers import run_workers
    proc = run_workers(SCRIPT, nproc=2, args=["--out", str(tmp_path / "r.json")])
    assert proc.returncode == 0, proc.stdout + proc.stderr

Keep the number of launches low: the CI machine has 2 cores and every process imports torch.
Batch several checks into one launch that writes its results to a file, and assert on the
file from several small tests through a module-scoped fixture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment for workers: no launcher variables inherited from the test process."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_"))
           and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                         "MASTER_ADDR", "MASTER_PORT"}}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO / "src"), str(REPO / "tests"), env.get("PYTHONPATH", "")] if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def launcher_cmd(nproc: int, launcher_args: Sequence[str] = ()) -> list[str]:
    """The command prefix that starts ``nproc`` local workers with scaletrain's launcher."""
    return [sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", str(nproc),
            *launcher_args]


def run_workers(script: str | Path, nproc: int, args: Sequence[str] = (), *,
                launcher_args: Sequence[str] = (), env: dict[str, str] | None = None,
                timeout: float = 180.0, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nproc`` local processes and wait; output captured as text."""
    cmd = [*launcher_cmd(nproc, launcher_args), str(script), *map(str, args)]
    return subprocess.run(cmd, env=worker_env(env), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO)
