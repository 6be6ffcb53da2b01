"""``scaletrain status``: what Slurm, the Monitor and the Checkpointer say of each run folder.

For any number of run folders Slurm is asked twice in all: one ``squeue`` call for every job
id (``--states=all`` keeps jobs that ended a few minutes ago), then one ``sacct`` call for the
ids the queue no longer knows. Both are bounded by a timeout; a missing, failing or slow
command becomes a note on the rows it concerns, never a traceback. Nothing is written
anywhere: two ``status --watch`` in two terminals read the same folders side by side.

Progress comes from the Monitor's ``metrics.jsonl`` (its last step, its rate, the run's
``start`` line with total steps and the step it resumed from) and the Checkpointer's folder
(latest committed step, ``stop.json``). The ETA compares the steps left at the current rate
with the time left in this run's limit; when it does not fit, it says how many more runs
(requeues) the job needs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from scaletrain.checkpoint import layout
from scaletrain.errors import SlurmError, printable
from scaletrain.jobs import runfolder
from scaletrain.jobs.runfolder import RunFolder
from scaletrain.observe.monitorfiles import metrics_tail
from scaletrain.slurm.parse import FINAL_STATES, base_state, is_count, parse_duration_seconds, parse_time_seconds
from scaletrain.slurm.poll import PATIENCE, Waited, poll_until

QUERY_TIMEOUT_S = 10.0     # commands.QUERY_TIMEOUT_S (not imported: that module is loaded only to ask Slurm)


@dataclass(kw_only=True)
class RunStatus:
    """One run folder's line: Slurm's view, then the program's own records."""

    run: RunFolder
    state: str = "UNKNOWN"          # Slurm's state; NOT SUBMITTED without a job id
    elapsed_s: int | None = None
    limit_s: int | None = None
    restarts: int = 0
    reason: str = ""
    nodes: str = ""
    step: int | None = None         # the program's step (resume point + the Monitor's count)
    total_steps: int | None = None
    samples_per_s: float | None = None
    steps_per_s: float | None = None
    loss: float | None = None
    checkpoint: int | None = None   # latest committed step
    checkpoint_unread: bool = False  # chosen by its sizes, its checksums not read here (layout.choose)
    stop: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    forgotten: bool = False         # Slurm answered and knows nothing of the job: it will not come back

    @property
    def finished(self) -> bool:
        """True once Slurm says nothing more will happen to the job (or there is no job)."""
        return self.state in FINAL_STATES or self.state in {"NOT SUBMITTED", "NO JOB", "GONE"} or self.forgotten

    def eta(self) -> str:
        """``ETA 00:12:00 (fits)`` or ``will not finish in this run: 2 more runs``; '' when unknown."""
        if self.state != "RUNNING" or not (self.step and self.total_steps):
            return ""
        left = self.total_steps - self.step
        if left <= 0:
            return ""
        if not self.steps_per_s:
            return ""
        need = left / self.steps_per_s
        text = f"ETA {_hms(need)}"
        if self.limit_s and self.elapsed_s is not None:
            remaining = self.limit_s - self.elapsed_s
            if need > remaining:
                more = math.ceil((need - remaining) / self.limit_s)
                text += f", will not finish in this run: {more} more run{'s' if more > 1 else ''} after this one"
        return text


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def slurm_states(job_ids: Sequence[str], *, env: Mapping[str, str] | None = None,
                 timeout: float = 10.0) -> tuple[dict[str, dict[str, str]], dict[str, list[dict[str, str]]], list[str]]:
    """(squeue rows, sacct runs, notes) for ``job_ids``: one squeue call, then one sacct call
    for the ids squeue did not know. Failures become notes."""
    from scaletrain.slurm import commands

    notes: list[str] = []
    queue: dict[str, dict[str, str]] = {}
    try:
        queue = commands.squeue_jobs(job_ids, env=env, timeout=timeout)
    except SlurmError as exc:
        notes.append(f"squeue: {exc.message}")
    gone = [j for j in job_ids if j not in queue]
    acct: dict[str, list[dict[str, str]]] = {}
    if gone:
        try:
            acct = commands.sacct_jobs(gone, env=env, timeout=timeout)
        except SlurmError as exc:
            notes.append(f"sacct: {exc.message}")
    return queue, acct, notes


def collect_states(job_ids: Sequence[str], *, env: Mapping[str, str] | None = None,
                   timeout: float = QUERY_TIMEOUT_S) -> dict[str, str]:
    """``{job id: Slurm state}`` from the same two calls (squeue, then sacct); unknown ids absent."""
    queue, acct, _ = slurm_states(job_ids, env=env, timeout=timeout)
    out = {j: base_state(row.get("State", "")) for j, row in queue.items()}
    for j, runs in acct.items():
        out.setdefault(j, base_state(runs[-1].get("State", "")))
    return out


def job_state(job_id: str, *, env: Mapping[str, str] | None = None, timeout: float | None = None) -> str:
    """Slurm's state of one job; ``UNKNOWN`` only when the queue answered and has forgotten it
    (and accounting knows nothing). ``SlurmError`` when Slurm did not answer: silence is not a state.
    ``timeout``: seconds per Slurm call (default QUERY_TIMEOUT_S)."""
    queue, acct, notes = slurm_states([job_id], env=env, timeout=QUERY_TIMEOUT_S if timeout is None else timeout)
    if job_id in queue:
        return base_state(queue[job_id].get("State", ""))
    if job_id in acct:
        return base_state(acct[job_id][-1].get("State", ""))
    unanswered = [n for n in notes if n.startswith("squeue:")]
    if unanswered:
        raise SlurmError(unanswered[0], "check 'squeue' and 'sinfo'")
    return "UNKNOWN"


def ended(state: str) -> bool:
    """True for a final state, or a job Slurm has forgotten (nothing more will be known of it)."""
    return state in FINAL_STATES or state == "UNKNOWN"


def wait_for(job_id: str, *, timeout: float | None, poll: float, max_poll: float | None = None,
             env: Mapping[str, str] | None = None, patience: int = PATIENCE,
             on_note: Callable[[str], None] | None = None) -> Waited[str]:
    """Poll the job's state (squeue, then sacct) through the one wait loop until it has
    :func:`ended` or ``timeout`` seconds have passed; Slurm's silences are retried."""
    def fetch(left: float | None) -> str:
        # squeue, then sacct when squeue does not know the job: two calls within the time left
        return job_state(job_id, env=env, timeout=QUERY_TIMEOUT_S if left is None else min(QUERY_TIMEOUT_S, left / 2))

    return poll_until(fetch, ended, timeout=timeout, poll=poll, max_poll=max_poll, patience=patience,
                      on_note=on_note, bounded=True)


def _limit_seconds(text: str | None) -> int | None:
    """The job's time limit as squeue or sacct writes it; None when unlimited or unreadable."""
    try:
        return parse_time_seconds(text)
    except ValueError:
        return None


def _from_queue(status: RunStatus, row: Mapping[str, str]) -> None:
    status.state = base_state(row.get("State", ""))
    status.elapsed_s = parse_duration_seconds(row.get("TimeUsed"))
    status.limit_s = _limit_seconds(row.get("TimeLimit"))
    restarts = row.get("RestartCnt", "")
    status.restarts = int(restarts) if is_count(restarts) else 0
    reason = row.get("Reason", "")
    status.reason = "" if reason in {"None", "(null)"} else reason
    status.nodes = row.get("NodeList", "") if status.state == "RUNNING" else ""


def _from_acct(status: RunStatus, runs: Sequence[Mapping[str, str]]) -> None:
    last = runs[-1]
    status.state = base_state(last.get("State", ""))
    status.elapsed_s = parse_duration_seconds(last.get("Elapsed"))
    status.limit_s = _limit_seconds(last.get("Timelimit"))
    status.restarts = max(0, len(runs) - 1)


def _progress(status: RunStatus, verify_bytes: int | None = None) -> None:
    run = status.run
    try:
        start, last = metrics_tail(run.metrics)
    except OSError as exc:   # a row without a step says why, and still shows its checkpoint
        start = last = None
        status.notes.append(f"cannot read {run.metrics}: {exc.strerror or exc}")
    else:
        if run.metrics is not None and start is None and last is None and _size(run.metrics):
            status.notes.append(f"{run.metrics} holds no record the Monitor wrote that can be read "
                                "(lines damaged or edited)")
    if start is not None:
        status.total_steps = start.get("total_steps") if isinstance(start.get("total_steps"), int) else None
    if last is not None:
        offset = start.get("start_step", 0) if start is not None else 0
        status.step = int(last.get("step", 0)) + (offset if isinstance(offset, int) else 0)
        status.samples_per_s = _float(last.get("samples_per_s"))
        status.loss = _float(last.get("loss"))
        step_s = _float(last.get("step_s"))
        status.steps_per_s = 1.0 / step_s if step_s else None
    choice = runfolder.checkpoint_choice(run.checkpoints, verify_bytes=verify_bytes)
    status.checkpoint, status.checkpoint_unread = choice.step, choice.unread
    status.notes += choice.notes()
    status.stop = runfolder.stop_record(run.checkpoints)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _open(path: str | Path) -> RunStatus:
    """One folder's row; a folder that cannot be read at all is a row with a note, not an end
    to every other folder's line."""
    try:
        return RunStatus(run=runfolder.open_run(path))
    except (OSError, ValueError, RecursionError) as exc:
        return RunStatus(run=runfolder.RunFolder(path=Path(path), notes=[f"cannot read this folder: {exc}"]))


def collect(paths: Sequence[str | Path], *, env: Mapping[str, str] | None = None,
            timeout: float = QUERY_TIMEOUT_S) -> list[RunStatus]:
    """The status of every run folder in ``paths`` (in that order), with two Slurm calls in all."""
    rows = [_open(p) for p in paths]
    # checksums read for all the rows together at most what one checkpoint may cost (a listing of
    # every run under ./runs, refreshed by --watch, must not reread gigabytes); a row beyond its
    # share is judged by its sizes, and says so
    share = layout.VERIFY_BYTES // max(1, len(rows))
    ids = [r.run.job_id for r in rows if r.run.job_id]
    queue, acct, notes = slurm_states(ids, env=env, timeout=timeout) if ids else ({}, {}, [])
    for row in rows:
        row.notes += row.run.notes
        job = row.run.job_id
        if not runfolder.is_dir(row.run.path):
            row.state = "GONE"
            continue
        if job is None:
            row.state = "NOT SUBMITTED" if row.run.script else "NO JOB"
        elif job in queue:
            _from_queue(row, queue[job])
        elif job in acct:
            _from_acct(row, acct[job])
        else:
            row.state = "UNKNOWN"
            row.forgotten = not any(n.startswith("squeue:") for n in notes)   # the queue answered without it
            row.notes += notes or [f"Slurm no longer knows job {job} (and keeps no accounting of it)"]
        try:
            _progress(row, share)
        except (OSError, ValueError, RecursionError) as exc:
            row.notes.append(f"cannot read its records: {exc}")
    return rows


def format_row(s: RunStatus) -> str:
    """One line per run, for a terminal or a log: every field a researcher asks for."""
    parts = [s.run.name]
    if s.run.job_id:
        parts.append(f"job {s.run.job_id}")
    parts.append(s.state + (f" ({s.reason})" if s.reason and s.state == "PENDING" else ""))
    if s.elapsed_s is not None:
        parts.append(_hms(s.elapsed_s) + (f"/{_hms(s.limit_s)}" if s.limit_s else ""))
    if s.restarts:
        parts.append(f"requeued {s.restarts}x")
    if s.step is not None:
        parts.append(f"step {s.step}" + (f"/{s.total_steps}" if s.total_steps else ""))
    if s.samples_per_s is not None and s.state == "RUNNING":
        parts.append(f"{s.samples_per_s:.4g} samples/s")
    if s.loss is not None:
        parts.append(f"loss {s.loss:.4g}")
    eta = s.eta()
    if eta:
        parts.append(eta)
    if s.checkpoint is not None:
        parts.append(f"checkpoint step {s.checkpoint}" + (" (sizes checked)" if s.checkpoint_unread else ""))
    if s.stop and not s.stop.get("superseded"):   # a later run went on past it: not the state now
        parts.append(f"stopped ({s.stop.get('reason')}) at step {s.stop.get('step')}")
    if s.nodes:
        parts.append(f"on {s.nodes}")
    parts += s.notes
    # folder names, Slurm's words and notes come from outside: one line, nothing for the terminal to act on
    return printable(" | ".join(str(p) for p in parts))


def watch(paths: Sequence[str | Path], *, interval: float, out: Any, tty: bool,
          env: Mapping[str, str] | None = None, rounds: int | None = None) -> None:
    """Refresh until every job has ended: in place on a terminal, else a line per change.
    The rounds run in the one wait loop (:func:`scaletrain.slurm.poll.poll_until`)."""
    shown: dict[str, str] = {}
    n = 0

    def refresh() -> bool:
        nonlocal n
        rows = collect(paths, env=env)       # Slurm's silence is a note on the rows, not an end
        lines = [format_row(r) for r in rows]
        if tty:
            out.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + "scaletrain status (Ctrl-C to stop)\n"
                      + "\n".join(lines) + "\n")
        else:
            for row, line in zip(rows, lines):
                if shown.get(str(row.run.path)) != line:
                    shown[str(row.run.path)] = line
                    out.write(line + "\n")
        out.flush()
        n += 1
        return all(r.finished for r in rows) or (rounds is not None and n >= rounds)

    poll_until(refresh, bool, timeout=None, poll=interval)
