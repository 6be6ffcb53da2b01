"""The only code in scaletrain that runs Slurm's commands (sbatch, scontrol, sinfo, squeue, sacct,
scancel).

Each wrapper is small and typed: it finds the command (``SlurmError`` with a hint when it is
missing), runs it with an explicit environment (tests pass ``SLURM_CONF`` this way instead of
changing ``os.environ``), and turns a failure into one line: Slurm's own last error line.

Job state comes from ``scontrol show job -o ID``: unlike ``sacct`` it needs no slurmdbd, and a
finished job stays visible for ``MinJobAge`` seconds (300 by default), which is plenty for
``wait()`` polling every second or so.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from scaletrain.errors import SlurmError, printable
from scaletrain.slurm.parse import (
    FINAL_STATES,
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    parse_delimited,
    parse_exit_code,
    parse_job_id,
    parse_record,
    parse_records,
)

JOB_ID = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,20})?")   # ASCII only: str.isdigit() takes '²' and '٣'


def is_job_id(text: str) -> bool:
    """True for a Slurm job id as sbatch prints it (``123``, an array task ``123_4``), ASCII digits only."""
    return isinstance(text, str) and JOB_ID.fullmatch(text) is not None

_WAIT_RETRIES = 5  # consecutive scontrol failures tolerated while waiting
MAX_OUTPUT = 64 * 1024 * 1024  # bytes read from one stream of one command: squeue of a huge queue is far less
QUERY_TIMEOUT_S = 10.0  # squeue/sacct/scancel for the after-submit verbs: a stuck slurmctld is one line

_INSTALL_HINT = ("run this on a Slurm login node (or load Slurm's module); "
                 "'scaletrain plan' prints the script without Slurm")


def which(command: str, env: Mapping[str, str] | None = None) -> str:
    """The full path of a Slurm command, or ``SlurmError`` (exit 4) saying it is missing."""
    path = (env or os.environ).get("PATH")
    found = shutil.which(command, path=path)
    if not found:
        raise SlurmError(f"'{command}' not found: Slurm's commands are not on PATH", _INSTALL_HINT)
    return found


def _one_line(text: str) -> str:
    """Slurm's most telling error line: the last 'error:'/'fatal:' line, else the last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "no output"
    for line in reversed(lines):
        if "error:" in line or "fatal:" in line:
            return line
    return lines[-1]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the command and whatever it started (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def _capture(proc: subprocess.Popen[bytes], name: str, timeout: float) -> tuple[bytes, bytes]:
    """stdout and stderr, each at most MAX_OUTPUT bytes, within ``timeout`` seconds, else SlurmError."""
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(name, timeout)
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                bufs[key.fd] += chunk
                if len(bufs[key.fd]) > MAX_OUTPUT:
                    raise SlurmError(f"'{name}' printed more than {MAX_OUTPUT >> 20} MiB: not read further",
                                     "ask about fewer jobs or nodes; check the command by hand")
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(name, timeout) from None
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()])


def decode(data: bytes) -> str:
    """Slurm's bytes as text: not-UTF-8 bytes replaced, control characters shown as escapes
    (lines and tabs kept), so what it says cannot drive the terminal or break a parser."""
    return printable(data.decode("utf-8", errors="replace").replace("\r\n", "\n"), keep="\n\t")


def run_command(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                cwd: str | Path | None = None, timeout: float = 60.0) -> str:
    """Run a Slurm command and return its stdout; any failure is one ``SlurmError`` line.

    Bounded: ``timeout`` seconds and MAX_OUTPUT bytes per stream; the command runs in its own
    session so that, past either bound, everything it started is ended with it.
    """
    exe = which(argv[0], env)
    name = " ".join(argv)[:200]
    try:
        proc = subprocess.Popen([exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(env) if env is not None else None,
                                cwd=str(cwd) if cwd is not None else None, start_new_session=True)
    except OSError as exc:
        raise SlurmError(f"cannot run {argv[0]}: {exc.strerror}", _INSTALL_HINT) from None
    try:
        out, err = _capture(proc, name, timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"'{printable(name)}' did not answer within {timeout:.0f} s",
                         "is slurmctld up? try 'sinfo' or 'scontrol ping'") from None
    finally:
        if proc.poll() is None:
            _stop(proc)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    if proc.returncode != 0:
        said = decode(err) or decode(out)
        raise SlurmError(f"{argv[0]} failed: {_one_line(said)}", _failure_hint(said))
    return decode(out)


# What Slurm's commands say where no cluster answers them: installed, but without a
# configuration (a laptop, a CI runner, a container) or cut off from the controller.
_NO_CLUSTER = ("Could not establish a configuration source", "fetch_config", "slurm.conf",
               "Unable to contact slurm controller", "Unable to establish a connection",
               "Zero Bytes were transmitted or received", "Connection refused",
               "Communication connection failure", "Invalid authentication credential",
               "Munge", "munge", "Socket timed out")


def _failure_hint(said: str) -> str:
    """The hint for a Slurm command that failed: a request Slurm refused is the user's to fix,
    but where no cluster answered, the request was never looked at."""
    if any(marker in said for marker in _NO_CLUSTER):
        return ("no Slurm cluster answers on this machine (Slurm's commands are here, but no "
                "configuration or controller): run this on the cluster's login node; "
                "'scaletrain plan' prints the script without Slurm")
    return "fix the request (see the message from Slurm) or check 'sinfo'"


def sbatch_parsable(script_path: str | Path, *, cwd: str | Path | None = None,
                    extra_args: Sequence[str] = (),
                    env: Mapping[str, str] | None = None) -> str:
    """Submit ``script_path`` with ``sbatch --parsable`` from ``cwd``; returns the job id.

    ``cwd`` matters: it becomes the job's working directory and where relative
    ``--output`` paths land.
    """
    out = run_command(["sbatch", "--parsable", *extra_args, str(script_path)],
                      env=env, cwd=cwd)
    try:
        return parse_job_id(out)
    except ValueError:
        raise SlurmError(f"sbatch printed no job id: {_one_line(out)}",
                         "check the script with 'scaletrain lint'") from None


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """What ``scontrol show job -o`` says about one job (the fields scaletrain uses)."""

    job_id: str
    state: str                      # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT...
    exit_code: int                  # the batch script's exit status
    signal: int                     # the signal that ended it (0 if none)
    reason: str = ""
    stdout: str | None = None       # StdOut= path, already expanded by Slurm
    stderr: str | None = None
    node_list: str = ""
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """True once the job is in a final state (nothing more will happen to it)."""
        return self.state in FINAL_STATES

    @property
    def returncode(self) -> int:
        """A process-style exit code: 0 only for COMPLETED, 128+signal when killed by one."""
        if self.state == "COMPLETED" and self.exit_code == 0:
            return 0
        if self.exit_code:
            return self.exit_code
        if self.signal:
            return 128 + self.signal
        return 1


def job_info_from_record(record: Mapping[str, str]) -> JobInfo:
    """Build ``JobInfo`` from one parsed ``scontrol show job -o`` record."""
    code, sig = parse_exit_code(record.get("ExitCode"))
    # JobState can carry a suffix in some versions ("CANCELLED by 0"); the first word is the state.
    state = (record.get("JobState") or "UNKNOWN").split()[0]
    return JobInfo(job_id=record.get("JobId", ""), state=state, exit_code=code, signal=sig,
                   reason=record.get("Reason", ""), stdout=record.get("StdOut") or None,
                   stderr=record.get("StdErr") or None, node_list=record.get("NodeList", ""),
                   raw=dict(record))


def job_info(job_id: str, *, env: Mapping[str, str] | None = None) -> JobInfo:
    """The job's current state from ``scontrol show job -o``; ``SlurmError`` if unknown."""
    out = run_command(["scontrol", "show", "job", "-o", str(job_id)], env=env)
    for line in out.splitlines():
        record = parse_record(line)
        if record.get("JobId") == str(job_id):
            return job_info_from_record(record)
    raise SlurmError(f"scontrol knows no job {job_id}",
                     "finished jobs are forgotten after MinJobAge; check the job's output file")


def wait(job_id: str, *, timeout: float | None = None, poll: float = 1.0,
         max_poll: float = 10.0, env: Mapping[str, str] | None = None,
         on_change: Callable[[JobInfo], None] | None = None,
         on_note: Callable[[str], None] | None = None) -> JobInfo:
    """Poll until the job reaches a final state and return it; ``on_change`` sees each new state.

    The loop is :func:`scaletrain.slurm.poll.poll_until`: polling slows from ``poll`` to
    ``max_poll`` seconds, a few failed ``scontrol`` calls in a row (a busy slurmctld times out)
    are retried and said through ``on_note``. ``timeout`` (seconds, None = forever) raises
    ``SlurmError`` with the job still in the queue: waiting gives up, the job is not cancelled.
    """
    from scaletrain.slurm.poll import poll_until

    seen: list[str] = []

    def fetch() -> JobInfo:
        info = job_info(job_id, env=env)
        if on_change is not None and seen[-1:] != [info.state]:
            seen.append(info.state)
            on_change(info)
        return info

    waited = poll_until(fetch, lambda info: info.finished, timeout=timeout, poll=poll, max_poll=max_poll,
                        patience=_WAIT_RETRIES, on_note=on_note)
    if not waited.done:
        raise SlurmError(f"job {job_id} still {waited.value.state} after {waited.seconds:.0f} s",
                         f"it keeps running; follow it with 'squeue -j {job_id}' "
                         f"or stop it with 'scancel {job_id}'")
    return waited.value


def cancel(job_id: str, *, env: Mapping[str, str] | None = None) -> None:
    """Cancel a job with ``scancel`` (no error if it already ended)."""
    run_command(["scancel", str(job_id)], env=env, timeout=QUERY_TIMEOUT_S)


def send_signal(job_id: str, signal_name: str, *, batch: bool,
                env: Mapping[str, str] | None = None, timeout: float = QUERY_TIMEOUT_S) -> None:
    """``scancel --signal=NAME`` to the batch shell only (``batch=True``: its trap decides what
    to relay) or to the job's steps only (Slurm's default for signals other than KILL)."""
    if not signal_name.isalnum():
        raise SlurmError(f"not a signal name: {signal_name!r}", "use USR1, USR2 or TERM")
    run_command(["scancel", *(["--batch"] if batch else []), f"--signal={signal_name}", str(job_id)],
                env=env, timeout=timeout)


def _job_list(job_ids: Sequence[str]) -> str:
    ids = [str(j) for j in job_ids]
    bad = [j for j in ids if not is_job_id(j)]
    if bad:
        raise SlurmError(f"not a job id: {bad[0]!r}", "a job id is a number, as sbatch printed it")
    return ",".join(dict.fromkeys(ids))


def squeue_jobs(job_ids: Sequence[str], *, env: Mapping[str, str] | None = None,
                timeout: float = QUERY_TIMEOUT_S) -> dict[str, dict[str, str]]:
    """What the queue knows of ``job_ids`` in ONE ``squeue`` call: ``{id: {field: value}}``.

    ``--states=all`` keeps jobs that ended less than MinJobAge ago (COMPLETED, FAILED...). A
    job the controller has forgotten is simply absent; when none of the ids is known squeue
    says "Invalid job id", which is read as "none known", not as a failure. ``SlurmError`` when
    squeue is missing, fails otherwise or does not answer within ``timeout`` seconds.
    """
    if not job_ids:
        return {}
    fmt = ",".join(f"{name}:|" for name in SQUEUE_FIELDS)
    try:
        out = run_command(["squeue", "--noheader", "--states=all", f"--jobs={_job_list(job_ids)}",
                           "-O", fmt], env=env, timeout=timeout)
    except SlurmError as exc:
        if "Invalid job id" in exc.message:
            return {}
        raise
    return {row["JobID"]: row for row in parse_delimited(out, SQUEUE_FIELDS)}


def sacct_jobs(job_ids: Sequence[str], *, env: Mapping[str, str] | None = None,
               timeout: float = QUERY_TIMEOUT_S) -> dict[str, list[dict[str, str]]]:
    """Slurm's accounting for ``job_ids`` in ONE ``sacct`` call: ``{id: [one row per run]}``.

    ``-X`` gives the allocation (not each step), ``-D`` one row per run of a requeued job,
    oldest first. ``SlurmError`` where accounting is not kept (no slurmdbd), sacct is missing
    or slow.
    """
    if not job_ids:
        return {}
    out = run_command(["sacct", "--noheader", "--parsable2", "--allocations", "--duplicates",
                       f"--jobs={_job_list(job_ids)}", f"--format={','.join(SACCT_FIELDS)}"],
                      env=env, timeout=timeout)
    runs: dict[str, list[dict[str, str]]] = {}
    for row in parse_delimited(out, SACCT_FIELDS):
        runs.setdefault(row["JobID"], []).append(row)
    return runs


def show_nodes(*, env: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """``scontrol show node -o`` as parsed records, one per node."""
    return parse_records(show_nodes_text(env=env))


def show_nodes_text(*, env: Mapping[str, str] | None = None) -> str:
    """The raw text of ``scontrol show node -o`` (kept for parsing and for bug reports)."""
    return run_command(["scontrol", "show", "node", "-o"], env=env)


def show_partitions_text(*, env: Mapping[str, str] | None = None) -> str:
    """The raw text of ``scontrol show partition -o``."""
    return run_command(["scontrol", "show", "partition", "-o"], env=env)


def version_text(*, env: Mapping[str, str] | None = None) -> str:
    """What ``sinfo --version`` prints (``slurm 23.11.4``), or "" when it cannot be run."""
    try:
        return run_command(["sinfo", "--version"], env=env).strip()
    except SlurmError:
        return ""


def cluster_name(*, env: Mapping[str, str] | None = None) -> str | None:
    """``ClusterName`` from ``scontrol show config``, or None if it cannot be read."""
    try:
        out = run_command(["scontrol", "show", "config"], env=env)
    except SlurmError:
        return None
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ClusterName":
            return value.strip() or None
    return None


def sinfo(fmt: str = "%P %a %l %D %c %m %G %N", *,
          env: Mapping[str, str] | None = None) -> list[list[str]]:
    """``sinfo -h -o FMT`` split into rows of fields (whitespace-separated)."""
    out = run_command(["sinfo", "-h", "-o", fmt], env=env)
    return [line.split() for line in out.splitlines() if line.strip()]
