"""Submitting a job, for every caller: a run folder, its script, one sbatch call, the job id.

``scaletrain submit``, ``bench scaling --nodes`` and the Python API (``scaletrain.submit``)
all submit through here, so a run folder always looks the same and the ``after submit`` verbs
(``status``, ``logs``, ``cancel``, ``report``) can read any of them:

    <run folder>/job.sh      the batch script (written whole, mode 0755)
    <run folder>/job_id      the id sbatch gave, written once sbatch answered
    <run folder>/*.out       the job's output (when the plan's log points here)

Every submission gets its own folder: the default name gains ``-2``, ``-3``... when taken
(two submits in one second), and a named folder that already holds a ``job.sh`` or ``job_id``
is refused rather than overwritten (its job may still be running). sbatch runs from the run
folder (through :mod:`scaletrain.slurm.commands`, the only module that runs Slurm).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path
from typing import Mapping

from scaletrain.contract.files import JOB_ID_FILE, JOB_SCRIPT, RUNS_DIR
from scaletrain.errors import ScaletrainError, SlurmError, UsageError
from scaletrain.fileio import atomic_write, fresh_dir, read_bounded
from scaletrain.slurm.parse import is_count


def default_run_dir(job_name: str, base: Path = Path(RUNS_DIR)) -> Path:
    """A fresh ``runs/<timestamp>-<name>`` folder, created (never one another submit has)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", job_name).strip("._")[:100] or "job"
    return fresh_dir(base / f"{stamp}-{safe}")


def make_run_dir(wanted: str | os.PathLike[str] | None, job_name: str, *, flag: str = "--run-dir") -> Path:
    """The run folder, created and absolute: ``wanted`` (new, or empty of a previous job), else
    a fresh ``runs/<timestamp>-<name>``. ``UsageError`` for a folder that holds a job already
    or cannot be written; ``flag`` names the option ``wanted`` came from in the messages."""
    try:
        if wanted:
            run_dir = Path(wanted).expanduser()
            taken = [n for n in (JOB_SCRIPT, JOB_ID_FILE) if (run_dir / n).exists()]
            if taken:
                raise UsageError(f"{flag} {wanted} already holds a job ({', '.join(taken)})",
                                 f"give a new {flag}, or leave it out for a fresh "
                                 "runs/<timestamp>-<name>/ folder")
            run_dir.mkdir(parents=True, exist_ok=True)
            return run_dir.absolute()
        return default_run_dir(job_name).absolute()
    except OSError as exc:
        raise UsageError(f"cannot write the job script into {wanted or RUNS_DIR + '/'}: "
                         f"{exc.strerror or exc}", f"choose a writable {flag}") from None


def write_file(run_dir: Path, name: str, data: str | bytes, mode: int = 0o644) -> Path:
    """One file of the run folder, whole or not at all (``UsageError`` when it cannot be)."""
    try:
        return atomic_write(run_dir / name, data, mode=mode)
    except OSError as exc:
        raise UsageError(f"cannot write {name} into {run_dir}: {exc.strerror or exc}",
                         "choose a writable --run-dir") from None


def write_script(run_dir: Path, script: str) -> Path:
    """``job.sh`` in the run folder (executable); returns its path."""
    return write_file(run_dir, JOB_SCRIPT, script.encode("utf-8"), mode=0o755)


def require_sbatch(hint: str, env: Mapping[str, str] | None = None) -> None:
    """``SlurmError`` (exit 4) with the caller's way out when sbatch is not on PATH."""
    from scaletrain.slurm import commands

    try:
        commands.which("sbatch", env)
    except SlurmError as exc:
        raise SlurmError(exc.message, hint) from None


def sbatch_run_dir(run_dir: Path, *, env: Mapping[str, str] | None = None) -> str:
    """Submit the run folder's ``job.sh`` from the run folder; records and returns the job id.

    Once sbatch has answered, the job is queued whatever happens here: when its id cannot be
    recorded (a full or read-only disk), the error still names the job and how to cancel it,
    so that no job runs that nothing knows about.
    """
    from scaletrain.slurm import commands

    job_id = commands.sbatch_parsable(JOB_SCRIPT, cwd=run_dir, env=env)
    try:
        atomic_write(run_dir / JOB_ID_FILE, f"{job_id}\n")
    except OSError as exc:
        raise ScaletrainError(
            f"job {job_id} was submitted and is queued, but its id could not be written to "
            f"{run_dir / JOB_ID_FILE}: {exc.strerror or exc}",
            f"the job runs all the same: cancel it with 'scancel {job_id}', or free space and write "
            f"{job_id} into that file so that status/logs/cancel find it") from None
    return job_id


def read_job_id(run_dir: Path) -> tuple[str | None, str | None]:
    """The job id :func:`sbatch_run_dir` recorded, read back by the module that writes it:
    ``(id, None)``, ``(None, None)`` when none was recorded, or ``(None, why)`` for a file that
    cannot be read or does not hold an id (a folder edited by hand). Never raises."""
    try:
        text = read_bounded(run_dir / JOB_ID_FILE, limit=4096).decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"cannot read {JOB_ID_FILE}: {getattr(exc, 'strerror', None) or exc}"
    if is_count(text) and len(text) <= 20:
        return text, None
    # written whole (atomic_write): an empty file was emptied or made by hand, not "no file"
    return None, (f"{JOB_ID_FILE} does not hold a job id ({text[:20]!r})" if text else f"{JOB_ID_FILE} is empty")


def account_or_env(account: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The project to bill: the given one, else sbatch's own default ($SBATCH_ACCOUNT, $SLURM_ACCOUNT)."""
    env = os.environ if environ is None else environ
    return account or env.get("SBATCH_ACCOUNT") or env.get("SLURM_ACCOUNT") or None
