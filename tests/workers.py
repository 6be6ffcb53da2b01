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
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Sequence

from helpers import without_launcher_vars

REPO = Path(__file__).resolve().parent.parent
# The launcher's words for a rank killed by SIGSEGV/SIGABRT in native code (launch/crash.py)
NATIVE_CRASH = "crashed in native code"
_NATIVE_EXITS = (128 + signal.SIGABRT, 128 + signal.SIGSEGV)


# A program of two or more ranks that all-reduces rank + 1 and prints "sum S" (3.0 on two ranks)
ALLREDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("sum", float(t[0]))
dist.destroy_process_group()
"""


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment for workers: no launcher variables inherited from the test process."""
    env = without_launcher_vars(os.environ)
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


def _native_crash(proc: subprocess.CompletedProcess) -> bool:
    """A rank died of SIGABRT/SIGSEGV during the program (with or without the stack a
    faulthandler dump gives); an abort after the program had finished is another matter."""
    if proc.returncode not in _NATIVE_EXITS:
        return False
    killed = "was killed by SIGABRT" in proc.stderr or "was killed by SIGSEGV" in proc.stderr
    return NATIVE_CRASH in proc.stderr or (killed and "finished its program" not in proc.stderr)


def run_workers(script: str | Path, nproc: int, args: Sequence[str] = (), *,
                launcher_args: Sequence[str] = (), env: dict[str, str] | None = None,
                timeout: float = 180.0, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nproc`` local processes and wait; output captured as text.

    A launch in which a rank died in native code (heap corruption inside torch: CI saw
    "malloc(): unaligned tcache chunk detected" once, in rank 3 of a 4-process HSDP launch on
    2 cores) runs once more, with a warning that carries the crash's stack: such a crash is not the behaviour under test, and a
    second one fails the test. Python errors, wrong numbers, exit codes and timeouts never rerun.
    """
    cmd = [*launcher_cmd(nproc, launcher_args), str(script), *map(str, args)]
    proc = subprocess.run(cmd, env=worker_env(env), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO)
    if _native_crash(proc):
        crash = proc.stderr[-3000:]  # the failed rank's stderr, its stack, the error line
        warnings.warn(f"{Path(script).name}: a worker crashed in native code; launched once "
                      f"more:\n{crash}", RuntimeWarning, stacklevel=2)
        print(f"workers: rerun after a native crash:\n{crash}", file=sys.stderr)
        proc = subprocess.run(cmd, env=worker_env(env), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd or REPO)
    return proc


def launch_json(script: str | Path, nproc: int, out_dir: Path, *, timeout: float = 300.0,
                args: Sequence[str] = ()) -> dict:
    """Run ``script --out FILE`` on ``nproc`` workers; the JSON rank 0 wrote there.

    Fails the test with the workers' last output when the launch does not succeed.
    """
    import json

    out = Path(out_dir) / "results.json"
    proc = run_workers(script, nproc=nproc, args=["--out", str(out), *args], timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return json.loads(out.read_text())


def save_and_shutdown(results: dict, path: str | Path) -> None:
    """Worker side: rank 0 writes ``results`` as JSON, every rank waits, then shuts down."""
    import json

    import torch.distributed as dist

    import scaletrain

    if dist.get_rank() == 0:
        Path(path).write_text(json.dumps(results, indent=1))
    dist.barrier()
    scaletrain.shutdown()
