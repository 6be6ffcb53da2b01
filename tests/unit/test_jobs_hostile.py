"""Hostile input for the after-submit verbs (issue 29 items 1, 6-9): fake squeue/sacct that fail,
hang, print garbage or too much; run folders with pipes, devices, links, odd digits and
hand-edited records; the Job API with wrong values. Each case: one line, the right exit code,
no traceback, a bound on every wait and read, nothing outside the run folder touched."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from scaletrain.errors import SlurmError, UsageError
from scaletrain.fileio import LINE_BYTES
from scaletrain.jobs import api, cancel, logs, report, report_page, runfolder, status
from scaletrain.observe.monitor import Monitor

SRC = str(Path(__file__).resolve().parents[2] / "src")

# squeue: fails while $FAKE_DIR/squeue.fail counts down, prints $FAKE_DIR/squeue.raw as is, else the queue rows
SQUEUE = """#!/bin/sh
d="$FAKE_DIR"
if [ -f "$d/squeue.fail" ]; then n=$(cat "$d/squeue.fail"); if [ "$n" -gt 0 ]; then
  echo $((n-1)) > "$d/squeue.fail"; echo "squeue: error: slurm_load_jobs: Socket timed out" >&2; exit 1; fi; fi
[ -f "$d/squeue.hang" ] && sleep 30
[ -f "$d/squeue.yes" ] && exec yes 1234567890
[ -f "$d/squeue.raw" ] && exec cat "$d/squeue.raw"
[ -f "$d/queue" ] && cat "$d/queue"
exit 0
"""
SACCT = "#!/bin/sh\nexit 0\n"
SCANCEL = "#!/bin/sh\necho \"scancel $*\" >> \"$FAKE_DIR/calls\"\nexit 0\n"


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("squeue", SQUEUE), ("sacct", SACCT), ("scancel", SCANCEL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    for tool in ("cat", "sleep", "sh", "yes"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return tmp_path


def row(job: str, state: str, reason: str = "None") -> str:
    return f"{job}|{state}|00:01:40|00:03:20|{reason}|c1|0|2026-11-25T01:00:00|2026-11-25T01:00:05|1|\n"


def make_run(root: Path, name: str = "a", job: str | None = "101") -> Path:
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / "job.sh").write_text("#!/bin/bash\n")
    if job is not None:
        (run / "job_id").write_text(job + "\n")
    return run


def cli(*argv: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process: a blocking read shows up as a timeout, not a hung test run."""
    full = {**os.environ, **(env or {}), "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "scaletrain", *argv], capture_output=True, text=True,
                          timeout=timeout, env=full, errors="replace")


def one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("scaletrain: error: "), proc.stderr


# --- item 1: report -o never replaces what is not a regular file ------------------------------

def test_report_output_never_replaces_a_device_a_link_or_a_pipe(tmp_path):
    run = tmp_path / "run"
    Monitor(run, console=False, device_sampler=None).close()
    try:
        os.mknod(tmp_path / "full", stat.S_IFCHR | 0o666, os.makedev(1, 7))   # what /dev/full is
    except PermissionError:
        pytest.skip("mknod needs root")
    (tmp_path / "link").symlink_to(tmp_path / "full")
    os.mkfifo(tmp_path / "fifo")
    for target in ("full", "link", "fifo"):
        proc = cli("report", str(run), "-o", str(tmp_path / target))
        one_line_error(proc, 2)
    assert stat.S_ISCHR(os.lstat(tmp_path / "full").st_mode)
    assert os.path.islink(tmp_path / "link") and stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    # the default page, when a crafted folder put a link there, does not replace the link or its target
    outside = tmp_path / "precious.txt"
    outside.write_text("mine\n")
    (run / "report.html").symlink_to(outside)
    one_line_error(cli("report", str(run)), 2)
    assert outside.read_text() == "mine\n" and (run / "report.html").is_symlink()


def test_atomic_writer_refuses_every_non_regular_target(tmp_path):
    from scaletrain.fileio import atomic_write

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("fifo", "dir", "dangling"):
        with pytest.raises(UsageError, match="not replaced"):
            atomic_write(tmp_path / name, "x")
    assert not (tmp_path / "nowhere").exists() and sorted(os.listdir(tmp_path)) == ["dangling", "dir", "fifo"]


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_report_on_a_full_and_a_read_only_disk_keeps_the_old_page(tmp_path, tmpfs):
    run = tmp_path / "run"
    mon = Monitor(run, console=False, device_sampler=None)
    for _ in range(3):
        mon.step(samples=4, loss=0.5)
    mon.close()
    page = tmpfs / "page.html"
    page.write_text("old page\n")
    with open(tmpfs / "filler", "wb") as fh:      # fill the disk
        try:
            fh.write(b"\0" * (1 << 20))
        except OSError:
            pass
    one_line_error(cli("report", str(run), "-o", str(page)), 2)
    assert page.read_text() == "old page\n" and sorted(os.listdir(tmpfs)) == ["filler", "page.html"]
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    one_line_error(cli("report", str(run), "-o", str(page)), 2)
    assert page.read_text() == "old page\n"


# --- item 6: waiting does not take Slurm's silence for an answer ------------------------------

def test_job_wait_retries_a_silent_slurm_says_so_and_returns_the_real_state(slurm, capsys):
    run = make_run(slurm)
    (slurm / "queue").write_text(row("101", "COMPLETED"))
    (slurm / "squeue.fail").write_text("3")
    assert api.Job(run).wait(poll=0.01) == "COMPLETED"
    err = capsys.readouterr().err
    assert "did not answer" in err and "Socket timed out" in err and "answers again" in err
    (slurm / "squeue.fail").write_text("99")
    with pytest.raises(SlurmError, match="did not answer 5 times in a row"):
        api.Job(run).wait(poll=0.01)


def test_job_wait_bounds_a_hanging_squeue(slurm, monkeypatch):
    run = make_run(slurm)
    (slurm / "squeue.hang").write_text("")
    monkeypatch.setattr(status, "QUERY_TIMEOUT_S", 0.3)
    with pytest.raises(SlurmError, match="did not answer"):
        api.Job(run).wait(timeout=1.0, poll=0.01)


def test_cancel_save_says_how_long_it_really_waited(slurm, monkeypatch):
    run = make_run(slurm)
    (slurm / "queue").write_text(row("101", "RUNNING"))
    monkeypatch.setattr(cancel, "POLL_S", 0.05)
    with pytest.raises(SlurmError) as info:
        cancel.cancel(run, save=True, wait_s=0.4)
    # the time it waited (0.4 s, plus the stub Slurm's replies: seconds on a loaded machine), not
    # the 300 s default
    waited = re.search(r"still RUNNING after (\d+) s", info.value.message)
    assert waited is not None and int(waited.group(1)) < 30, info.value.message
    (slurm / "squeue.fail").write_text("99")                          # asked, then Slurm goes silent
    monkeypatch.setattr(cancel, "_state", lambda job, env: "RUNNING")
    with pytest.raises(SlurmError) as info:
        cancel.cancel(run, save=True, wait_s=300)
    assert "did not answer 5 times" in info.value.message and "300 s" not in info.value.message


def test_follow_keeps_going_through_silence_and_rereads_a_truncated_file(tmp_path):
    import io

    run = tmp_path / "run"
    run.mkdir()
    out_file = run / "job.out"
    out_file.write_text("first line\nsecond line\n")
    answers = iter(["fail", "fail", "truncate", "done"])
    notes: list[str] = []

    def finished() -> bool:
        what = next(answers)
        if what == "fail":
            raise SlurmError("squeue: 'squeue' did not answer within 10 s")
        if what == "truncate":
            out_file.write_text("new\n")          # shorter than what was read: truncated and rewritten
            return False
        return True

    sink = io.StringIO()
    logs.follow(run, sink, finished=finished, poll=0.01, on_note=notes.append)
    assert sink.getvalue() == "first line\nsecond line\nnew\n"
    assert any("did not answer" in n for n in notes) and any("truncated" in n for n in notes)


def test_status_step_and_eta_after_thousands_of_steps(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "job_id").write_text("5\n")
    (run / "monitor").mkdir()
    lines = [json.dumps({"type": "start", "start_step": 40, "total_steps": 10_000, "time": 1.0e9})]
    lines += [json.dumps({"type": "step", "step": i, "t": i * 0.1, "step_s": 0.1, "samples": 4,
                          "samples_per_s": 40.0, "loss": 0.5, "padding": "p" * 60}) for i in range(1, 3001)]
    (run / "monitor" / "metrics.jsonl").write_text("\n".join(lines) + "\n")   # as the Monitor writes them
    assert (run / "monitor" / "metrics.jsonl").stat().st_size > 256 * 1024   # past a quick tail's reach
    got = status.RunStatus(run=runfolder.open_run(run), state="RUNNING")
    status._progress(got)
    assert (got.step, got.total_steps) == (3040, 10_000)
    assert got.eta().startswith("ETA ")


# --- item 7: hand-edited records, bad folders, odd digits -------------------------------------

START = {"type": "start", "start_step": 10, "total_steps": 100, "time": 1.0e9}
STEP = {"type": "step", "step": 5, "t": 1.0, "step_s": 0.1, "samples": 4, "samples_per_s": 40.0, "loss": 0.5}
SUMMARY = {"type": "summary", "samples_per_s": 40.0, "device_util": {"available": True, "device": "cpu"}}
EDITS = [
    *[("start", {k: v}) for k in ("start_step", "total_steps", "time") for v in ("x", None, [1], -5, True)],
    *[("step", {k: v}) for k in ("step", "t", "step_s", "samples_per_s", "loss") for v in ("x", {"a": 1}, 1e400)],
    ("summary", {"samples_per_s": "fast"}), ("summary", {"device_util": [1, 2]}),
    ("summary", {"device_util": {"available": True, "device": "\x1b[2J", "util": "x"}}),
    ("event", {"message": {"nested": True}, "hint": 5}), ("event", {"message": "\x1b]0;owned\x07"}),
    ("start", {"type": 7}),
]


@pytest.mark.parametrize("kind, edit", EDITS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(EDITS)])
def test_hand_edited_records_give_lines_not_tracebacks(tmp_path, kind, edit, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "job_id").write_text("5\n")
    recs = [dict(START), dict(STEP), dict(SUMMARY), {"type": "event", "message": "m"}]
    target = next(r for r in recs if r["type"] == kind)
    target.update(edit)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    step = run / "ckpt" / "step-00000005"
    step.mkdir(parents=True)
    (step / "COMMIT.json").write_text(json.dumps({"step": edit.get("step", 5)}))
    (run / "ckpt" / "stop.json").write_text(json.dumps({"reason": edit.get("message", "x"), "superseded": 3}))
    (run / "gpus-n1.jsonl").write_text(json.dumps({"type": "sampler", "interval_s": edit.get("t", 10)}) + "\n"
                                       + json.dumps({"t": edit.get("t", 1.0), "devices": {"0": edit}}) + "\n")
    got = status.collect([run], env={"PATH": "/nonexistent"})[0]
    line = status.format_row(got)
    assert "\x1b" not in line and "\n" not in line
    # a wrong-typed value makes its figure unknown: never computed with, never shown as True/nan/inf
    assert got.total_steps in (100, None) and got.step in (15, 5, None) and got.checkpoint in (5, None)
    assert type(got.step) in (int, type(None)) and type(got.total_steps) in (int, type(None))
    rep = report.build(run, use_sacct=False)
    text = report_page.render_text(rep)
    fig = report.figures(rep)
    assert fig["total_steps"] in (100, None) and fig["last_step"] in (15, 5, None)
    assert fig["samples_per_s"] in (40.0, None) and fig["checkpoints"] in ([5], [])
    for word in ("True", "nan", "inf", "\x1b"):
        assert word not in line and word not in text, word
    report_page.render_html(rep)


def test_one_unreadable_folder_is_one_line_and_the_others_still_show(tmp_path, monkeypatch):
    good, bad = make_run(tmp_path, "good", None), make_run(tmp_path, "bad", None)
    (bad / "job_id").mkdir()                                   # a folder where a file belongs
    real = runfolder.open_run

    def exploding(path):
        if Path(path).name == "exploding":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(runfolder, "open_run", exploding)
    rows = status.collect([good, bad, tmp_path / "runs" / "exploding"])
    lines = [status.format_row(r) for r in rows]
    assert lines[0].startswith("good") and "cannot read job_id" in lines[1]
    assert "cannot read this folder" in lines[2] and len(lines) == 3


@pytest.mark.parametrize("digits", ["²", "١٢٣", "1²", "۱"])
def test_odd_digits_are_not_job_ids_steps_or_counts(tmp_path, digits):
    from scaletrain.slurm import commands, parse

    run = make_run(tmp_path, "a", digits)
    (run / "ckpt" / f"step-{digits}").mkdir(parents=True)
    (run / "ckpt" / f"step-{digits}" / "COMMIT.json").write_text('{"step": 2}')
    (run / "ckpt" / "stop.json").write_text("{}")
    got = status.collect([run])[0]
    assert got.state == "NOT SUBMITTED" and "does not hold a job id" in status.format_row(got)
    assert got.checkpoint is None
    with pytest.raises(SlurmError, match="not a job id"):
        commands.squeue_jobs([digits])
    assert parse.parse_limit(digits) is None and parse.parse_exit_code(f"{digits}:0") == (0, 0)
    with pytest.raises(ValueError):
        parse.parse_job_id(digits)
    stat_row = status.RunStatus(run=runfolder.RunFolder(path=run))
    status._from_queue(stat_row, {"State": "RUNNING", "RestartCnt": digits, "TimeLimit": f"{digits}:00"})
    assert stat_row.restarts == 0 and stat_row.limit_s is None


def test_slurm_bytes_that_are_not_utf8_or_drive_the_terminal(slurm):
    run = make_run(slurm)
    (slurm / "squeue.raw").write_bytes(row("101", "PENDING", "\x1b]0;owned\x07\x1b[2J").encode()
                                       .replace(b"|c1|", b"|c1\xff\xfe|"))
    proc = cli("status", str(run), env={"PATH": str(slurm / "bin"), "FAKE_DIR": str(slurm)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stdout and "PENDING (\\x1b]0;owned\\x07\\x1b[2J)" in proc.stdout


def test_escape_sequences_in_folder_names_are_shown_not_obeyed(tmp_path):
    run = make_run(tmp_path, "evil\x1b[2J\x1b]0;t\x07name", None)
    line = status.format_row(status.collect([run])[0])
    assert "\x1b" not in line and "\x07" not in line and "evil\\x1b[2J" in line
    err = UsageError(f"no run folder {run}", "hint\x1b[31m").render()
    assert "\x1b" not in err


# --- item 8: nothing blocks or reads without a bound ------------------------------------------

def test_pipes_and_devices_in_a_run_folder_block_nothing(tmp_path):
    run = make_run(tmp_path, "a", None)
    os.mkfifo(run / "job_id")
    os.mkfifo(run / "job.out")
    (run / "metrics.jsonl").symlink_to("/dev/zero")
    (run / "b.out").symlink_to("/dev/zero")
    (run / "c.out").write_text("[rank 0] hello\n")
    ckpt = run / "ckpt" / "step-00000003"
    ckpt.mkdir(parents=True)
    os.mkfifo(ckpt / "COMMIT.json")
    os.mkfifo(run / "ckpt" / "stop.json")
    os.mkfifo(run / "gpus-n1.jsonl")
    for argv in (("status", str(run)), ("logs", str(run)), ("report", str(run), "-o", str(tmp_path / "r.html"))):
        proc = cli(*argv, timeout=60)
        assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, (argv, proc.stderr)
    proc = cli("logs", str(run))
    assert proc.stdout == "[rank 0] hello\n" and "job.out skipped" in proc.stderr and "b.out skipped" in proc.stderr


def test_logs_streams_a_huge_line_with_bounded_memory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    size = 24 * LINE_BYTES
    with open(run / "job.out", "wb") as fh:
        fh.write(b"[rank 1] " + b"x" * size + b"\n[rank 0] after\n")
    tracemalloc.start()
    try:
        total = sum(len(piece) for piece in logs.read_lines(run))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == size + len("[rank 1] \n[rank 0] after\n")
    assert peak < 6 * LINE_BYTES            # a few pieces, not the 24 MiB line
    assert list(logs.read_lines(run, rank=0)) == ["[rank 0] after\n"]     # the long line's pieces all left out


def test_logs_of_a_large_array_keeps_the_newest_and_says_what_it_left_out(tmp_path, monkeypatch):
    monkeypatch.setattr(runfolder, "MAX_LOG_FILES", 64)
    run = tmp_path / "run"
    run.mkdir()
    for i in range(70):
        path = run / f"job_{i:03d}.out"
        path.write_text(f"task {i}\n")
        os.utime(path, (1000 + i, 1000 + i))
    notes: list[str] = []
    text = "".join(logs.read_lines(run, on_note=notes.append))
    assert "task 69\n" in text and "task 5\n" not in text and "task 6\n" in text
    assert notes == ["6 older output files left out (job_000.out to job_005.out); the newest 64 are read"]


def test_slurm_output_is_bounded_in_time_and_size(slurm, monkeypatch):
    from scaletrain.slurm import commands

    monkeypatch.setattr(commands, "MAX_OUTPUT", 1 << 20)
    (slurm / "squeue.yes").write_text("")
    with pytest.raises(SlurmError, match="printed more than 1 MiB"):
        commands.squeue_jobs(["101"])
    (slurm / "squeue.yes").unlink()
    (slurm / "squeue.hang").write_text("")
    with pytest.raises(SlurmError, match="did not answer within"):
        commands.squeue_jobs(["101"], timeout=0.3)
