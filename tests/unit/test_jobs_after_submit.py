"""status, logs, cancel and report against fake squeue/sacct/scancel on PATH (no cluster):
two Slurm calls for any number of run folders, hostile folders, slow or missing squeue, nothing
written by status, cancel --save's signal, and report figures equal to the Monitor's records."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import run_cli

from scaletrain.jobs import cancel, logs, report, report_page, runfolder, status
from scaletrain.observe.monitor import Monitor

SQUEUE = """#!/bin/sh
echo "squeue $*" >> "$FAKE_DIR/calls"
[ -f "$FAKE_DIR/squeue.sleep" ] && sleep "$(cat "$FAKE_DIR/squeue.sleep")"
for a in "$@"; do case "$a" in --jobs=*) ids="${a#--jobs=}";; esac; done
[ -f "$FAKE_DIR/queue" ] || exit 0
while IFS= read -r line; do id="${line%%|*}"; case ",$ids," in *",$id,"*) echo "$line";; esac; done < "$FAKE_DIR/queue"
"""
SACCT = """#!/bin/sh
echo "sacct $*" >> "$FAKE_DIR/calls"
for a in "$@"; do case "$a" in --jobs=*) ids="${a#--jobs=}";; esac; done
[ -f "$FAKE_DIR/acct" ] || exit 0
while IFS= read -r line; do id="${line%%|*}"; case ",$ids," in *",$id,"*) echo "$line";; esac; done < "$FAKE_DIR/acct"
"""
SCANCEL = """#!/bin/sh
echo "scancel $*" >> "$FAKE_DIR/calls"
[ -f "$FAKE_DIR/on_cancel" ] && sh "$FAKE_DIR/on_cancel"
exit 0
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("squeue", SQUEUE), ("sacct", SACCT), ("scancel", SCANCEL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    import shutil

    for tool in ("cat", "sleep", "sh"):     # only these beside the fakes: a real squeue must not answer
        (bin_dir / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return tmp_path


def queue_row(job: str, state: str, used: str = "00:01:40", limit: str = "00:03:20", restarts: int = 0) -> str:
    # JobID State TimeUsed TimeLimit Reason NodeList RestartCnt SubmitTime StartTime NumNodes, each ended by |
    return f"{job}|{state}|{used}|{limit}|None|c1|{restarts}|2026-11-25T01:00:00|2026-11-25T01:00:05|1|"


def acct_row(job: str, state: str, elapsed: str = "00:01:00", cpu: str = "00:01:00") -> str:
    # JobID State Elapsed Timelimit ExitCode TotalCPU AllocCPUS NNodes AllocTRES NodeList Submit Start End
    return (f"{job}|{state}|{elapsed}|00:10:00|0:0|{cpu}|4|1|cpu=4,gres/gpu=2,node=1|c1|"
            f"2026-11-25T01:00:00|2026-11-25T01:00:30|2026-11-25T01:01:30")


def make_run(root: Path, name: str, job: str | None, *, steps: int = 0, start_step: int = 0,
             total: int | None = None, ckpt: int | None = None) -> Path:
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / "job.sh").write_text("#!/bin/bash\n")
    if job is not None:
        (run / "job_id").write_text(job + "\n")
    if steps:
        mon = Monitor(run / "monitor", total_steps=total, console=False, device_sampler=None,
                      start_step=start_step)
        for _ in range(steps):
            mon.step(samples=4, loss=0.5)
        mon.close()
    if ckpt is not None:
        folder = run / "checkpoints" / f"step-{ckpt:08d}"
        folder.mkdir(parents=True)
        # the smallest marker the resume accepts too (status counts only what the resume loads)
        (folder / "COMMIT.json").write_text(json.dumps({"step": ckpt, "files": {}}))
    return run


def _calls(fake: Path) -> list[str]:
    try:
        return (fake / "calls").read_text().splitlines()
    except FileNotFoundError:
        return []


def _tree(root: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in root.rglob("*")}


def test_status_of_many_runs_is_two_slurm_calls_and_writes_nothing(fake):
    running = make_run(fake, "a", "101", steps=10, start_step=40, total=100, ckpt=40)
    done = make_run(fake, "b", "102", steps=3)
    forgotten = make_run(fake, "c", "103")
    edited = make_run(fake, "d", None)
    (edited / "job_id").write_text("not a number\n")
    (fake / "queue").write_text(queue_row("101", "RUNNING") + "\n")
    (fake / "acct").write_text(acct_row("102", "PREEMPTED") + "\n" + acct_row("102", "COMPLETED") + "\n")
    gone = fake / "runs" / "deleted"
    before = _tree(fake / "runs")
    rows = status.collect([running, done, forgotten, edited, gone])
    assert _tree(fake / "runs") == before
    calls = _calls(fake)
    assert len(calls) == 2 and calls[0].startswith("squeue") and calls[1].startswith("sacct"), calls
    assert "--jobs=101,102,103" in calls[0] and "--jobs=102,103" in calls[1]
    a, b, c, d, e = rows
    assert (a.state, a.step, a.total_steps, a.checkpoint, a.elapsed_s, a.limit_s) == \
        ("RUNNING", 50, 100, 40, 100, 200)
    assert (b.state, b.restarts, b.step) == ("COMPLETED", 1, 3)
    assert c.state == "UNKNOWN" and "no longer knows job 103" in status.format_row(c)
    assert c.finished and a.finished is False        # --watch stops for a forgotten job, not a running one
    assert d.state == "NOT SUBMITTED" and "does not hold a job id" in status.format_row(d)
    assert e.state == "GONE" and "\n" not in status.format_row(e)


def test_eta_counts_the_runs_a_job_still_needs():
    row = status.RunStatus(run=runfolder.RunFolder(path=Path("x")), state="RUNNING", step=50,
                           total_steps=100, steps_per_s=0.1, elapsed_s=100, limit_s=200)
    # 50 steps at 0.1 steps/s = 500 s; 100 s left in this run, then 400 s = 2 more 200-s runs
    assert row.eta() == "ETA 00:08:20, will not finish in this run: 2 more runs after this one"
    row.steps_per_s = 1.0
    assert row.eta() == "ETA 00:00:50"


def test_squeue_missing_or_slow_is_a_note_not_a_traceback(fake, capsys, monkeypatch):
    run = make_run(fake, "a", "101")
    (fake / "bin" / "squeue").unlink()
    code, out, err = run_cli(capsys, "status", str(run))
    assert code == 0 and "'squeue' not found" in out and "Traceback" not in err
    (fake / "bin" / "squeue").write_text(SQUEUE)
    (fake / "bin" / "squeue").chmod(0o755)
    (fake / "squeue.sleep").write_text("60")
    t0 = time.monotonic()
    rows = status.collect([run], timeout=0.5)
    assert time.monotonic() - t0 < 30   # bounded at 0.5 s, not the 60 s squeue (margin: load)
    assert "did not answer" in status.format_row(rows[0])


def test_two_watchers_print_one_line_per_change(fake):
    import io
    import threading

    run = make_run(fake, "a", "101", steps=3, total=10)
    (fake / "queue").write_text(queue_row("101", "RUNNING") + "\n")
    before = _tree(fake / "runs")
    outs = [io.StringIO(), io.StringIO()]
    # two watchers at once, two rounds each: the job did not change, so one line each
    threads = [threading.Thread(target=status.watch, args=([run],),
                                kwargs={"interval": 1, "out": out, "tty": False, "rounds": 2}) for out in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [o.getvalue().count("\n") for o in outs] == [1, 1]
    assert "RUNNING" in outs[0].getvalue() and "step 3/10" in outs[0].getvalue()
    assert _tree(fake / "runs") == before
    assert sum(c.startswith("squeue") for c in _calls(fake)) == 4


def test_logs_in_order_and_by_rank(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first, second = run / "job-1.out", run / "job-2.out"
    first.write_text("[rank 0] run one\n[rank 1] other\nbatch line\n")
    second.write_text("[rank 0] run two\n")
    os.utime(first, (1, 1))
    assert "".join(logs.read_lines(run)) == first.read_text() + second.read_text()
    assert list(logs.read_lines(run, rank=0)) == ["[rank 0] run one\n", "[rank 0] run two\n"]
    assert logs.rank_of("  1: srun label") == 1 and logs.rank_of("plain") is None


@pytest.mark.parametrize("requeue_script, batch", [(True, True), (False, False)])
def test_cancel_save_signals_usr2_and_reports_the_saved_step(fake, requeue_script, batch):
    run = make_run(fake, "a", "101", ckpt=30)
    if requeue_script:
        (run / "job.sh").write_text("trap '_scaletrain_keep=1; _scaletrain_stop USR2' USR2\n")
    (fake / "queue").write_text(queue_row("101", "RUNNING") + "\n")
    # the job saves, writes stop.json and ends when the signal arrives
    (fake / "on_cancel").write_text(
        f"echo '{queue_row('101', 'FAILED')}' > {fake}/queue\n"
        f"echo '{{\"reason\": \"requested\", \"step\": 30}}' > {run}/checkpoints/stop.json\n")
    result = cancel.cancel(run, save=True, wait_s=20)
    sent = [c for c in _calls(fake) if c.startswith("scancel")]
    assert sent == [f"scancel {'--batch ' if batch else ''}--signal=USR2 101"]
    assert result.stop == {"reason": "requested", "step": 30} and result.saved_step == 30
    assert "saved step 30 (stop.json: requested)" in result.message()


def test_cancel_without_save_is_plain_scancel(fake):
    run = make_run(fake, "a", "101")
    (fake / "queue").write_text(queue_row("101", "PENDING") + "\n")
    (fake / "on_cancel").write_text(f"echo '{queue_row('101', 'CANCELLED')}' > {fake}/queue\n")
    assert cancel.cancel(run).state == "CANCELLED"
    assert [c for c in _calls(fake) if c.startswith("scancel")] == ["scancel 101"]


def test_report_numbers_are_the_monitors(fake):
    run = make_run(fake, "a", "101", steps=12, start_step=0, total=20, ckpt=10)
    mon = Monitor(run / "monitor", total_steps=20, console=False, device_sampler=None, start_step=10)
    for _ in range(10):
        mon.step(samples=4, loss=0.25)
    mon.close()
    (fake / "acct").write_text(acct_row("101", "REQUEUED", "00:00:30", "00:00:30") + "\n"
                               + acct_row("101", "COMPLETED", "00:01:30", "00:04:30") + "\n")
    rep = report.build(run)
    fig = report.figures(rep)
    records = [json.loads(x) for x in (run / "monitor" / "metrics.jsonl").read_text().splitlines()]
    summaries = [r for r in records if r["type"] == "summary"]
    assert fig["runs"] == 2 and fig["last_step"] == 20 and fig["total_steps"] == 20
    assert fig["steps_recorded"] == sum(r["type"] == "step" for r in records) == 22
    assert fig["steps_redone"] == 2                          # run 1 reached 12, run 2 resumed at 10
    assert [s["steps"] for s in summaries] == [12, 10]         # weighted by them: 12 and 10 steps
    assert fig["samples_per_s"] == pytest.approx((12 * summaries[0]["samples_per_s"]
                                                  + 10 * summaries[1]["samples_per_s"]) / 22)
    assert fig["gpu_hours"] == pytest.approx(2 * 120 / 3600)
    assert fig["cpu_efficiency"] == pytest.approx(300 / (4 * 120))
    page = report_page.write(rep)
    text = page.read_text()
    assert text.count("<polyline") == 4 and "restarted 1x" in text
    assert "GPU-hours busy: unknown" in report_page.render_text(rep)


def test_report_without_monitor_says_what_it_cannot_know(fake, capsys):
    run = make_run(fake, "a", "101")
    (fake / "acct").write_text(acct_row("101", "COMPLETED") + "\n")
    code, out, _ = run_cli(capsys, "report", str(run))
    assert code == 0 and "no Monitor records" in out and "GPU-hours: 0.033 allocated" in out


def test_report_time_lost_between_runs_from_the_start_lines(tmp_path):
    lines = [{"type": "start", "time": 1000.0, "total_steps": 30, "start_step": 0},
             *({"type": "step", "step": s, "t": 2.0 * s, "samples": 4, "samples_per_s": 2.0} for s in (1, 2, 3)),
             {"type": "start", "time": 1100.0, "total_steps": 30, "start_step": 2},
             {"type": "step", "step": 1, "t": 2.0, "samples": 4, "samples_per_s": 2.0},
             "not json {"]
    (tmp_path / "metrics.jsonl").write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
    fig = report.figures(report.build(tmp_path))
    # run 1's last step at 1000 + 6 s; run 2 started at 1100: 94 s lost; it resumed at 2, so step 3 was redone
    assert fig["between_runs_s"] == pytest.approx(94.0) and fig["steps_redone"] == 1 and fig["last_step"] == 3


class _FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.reads = 0
        self.closed = False

    def read(self):
        from scaletrain.observe.devices import Sample

        self.reads += 1
        return {"0": Sample(util_pct=95.0, mem_gb=30.0, power_w=300.0),
                "1": Sample(util_pct=10.0, mem_gb=2.0 + self.reads, power_w=80.0)}

    def close(self) -> None:
        self.closed = True


def test_node_sampler_writes_whole_lines_and_says_why_when_blind(tmp_path):
    from scaletrain.observe import nodesampler

    backend = _FakeBackend()
    path = nodesampler.sample_loop(tmp_path, 0.0, backend, vendor="nvidia", host="g1", max_samples=3)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert path.name == "gpus-g1.jsonl" and backend.closed and len(lines) == 4
    assert lines[0] == {"type": "sampler", "host": "g1", "interval_s": 0.0, "backend": "nvidia"}
    assert lines[3]["devices"]["1"] == {"util_pct": 10.0, "mem_gb": 5.0, "power_w": 80.0}
    blind = nodesampler.sample_loop(tmp_path, 1.0, None, reason="nvidia: nvidia-ml-py not installed", host="c1")
    assert json.loads(blind.read_text())["reason"] == "nvidia: nvidia-ml-py not installed"


def test_report_names_idle_gpus_and_counts_busy_hours(tmp_path):
    from scaletrain.observe import nodesampler

    nodesampler.sample_loop(tmp_path / "run", 10.0, _FakeBackend(), vendor="nvidia", host="g1", max_samples=1,
                            stop=None)
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps({"type": "start", "time": 0.0}) + "\n")
    nodesampler.sample_loop(tmp_path / "run", 0.0, None, reason="no GPU", host="c2")
    rep = report.build(tmp_path / "run")
    fig = report.figures(rep)
    # one reading each, 10 s interval: (0.95 + 0.10) x 10 s = 10.5 GPU-seconds busy
    assert fig["gpu_hours_busy"] == pytest.approx(10.5 / 3600) and fig["gpus_sampled"] == 2
    assert fig["idle_gpus"] == ["g1:1"]
    text = report_page.render_text(rep)
    assert "idle or starved: g1:1 at 10% on average. HINT: feed it faster" in text
    assert "GPU sampler on c2: no GPU" in text
    assert report_page.render_html(rep).count("<h2>") == 4


def test_sample_gpus_starts_one_sampler_per_node_in_the_job(capsys):
    import subprocess

    code, out, _ = run_cli(capsys, "plan", "--cluster", "roihu", "--nodes", "2", "--account", "p1",
                           "--sample-gpus", "15", "--", "train.py")
    assert code == 0
    line = next(x for x in out.splitlines() if "nodesampler" in x)
    assert line.startswith('srun --overlap --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" '
                           "--ntasks-per-node=1 --gres=gpu:4 ")
    assert line.endswith("--interval 15 &")
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0
    code, plain, _ = run_cli(capsys, "plan", "--cluster", "roihu", "--nodes", "2", "--account", "p1",
                             "--", "train.py")
    assert "nodesampler" not in plain


def test_slurm_durations_and_delimited_rows():
    from scaletrain.slurm.parse import SACCT_FIELDS, parse_delimited, parse_duration_seconds

    assert [parse_duration_seconds(t) for t in ("1-02:03:04", "02:03:04", "03:04", "00:01.234", "", "N/A")] == \
        [93784, 7384, 184, 1, None, None]
    rows = parse_delimited("sacct: warning\n" + acct_row("7", "COMPLETED") + "\n", SACCT_FIELDS)
    assert len(rows) == 1 and rows[0]["AllocTRES"] == "cpu=4,gres/gpu=2,node=1" and rows[0]["End"].endswith("01:30")


def test_unknown_ids_and_bad_ids(fake):
    from scaletrain.errors import SlurmError
    from scaletrain.slurm import commands

    (fake / "bin" / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    assert commands.squeue_jobs(["5"]) == {}                 # none known: not a failure
    with pytest.raises(SlurmError, match="not a job id"):
        commands.squeue_jobs(["5; rm -rf /"])              # never reaches a command line
    (fake / "bin" / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    row = status.collect([make_run(fake, "a", "5")])[0]
    assert row.state == "UNKNOWN" and row.finished and "accounting storage is disabled" in status.format_row(row)
