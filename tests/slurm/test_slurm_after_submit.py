"""After submit on the local Slurm cluster: status, logs, cancel --save and report on a job that
trains with the Monitor and a Checkpointer, through the CLI and through the Python API.

- CLI: ``status`` shows the job RUNNING with a step that grows; USR1 (what Slurm sends before
  the time limit) requeues it and it resumes; ``cancel --save`` leaves a committed checkpoint,
  a ``stop.json`` saying "requested" and no second requeue; ``logs`` shows both runs;
  ``report`` renders (Chromium screenshot, not blank) with the Monitor's numbers.
- API: ``scaletrain.submit`` -> ``Job.wait()`` COMPLETED, ``Job.status().step`` the final step.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

HERE = Path(__file__).resolve().parent
JOB = HERE / "monitor_job.py"


def _status(cluster, run_dir: Path) -> str:
    proc = cluster.scaletrain("status", str(run_dir), timeout=60)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 1, proc.stdout + proc.stderr
    return proc.stdout


def _until(cluster, run_dir: Path, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        seen = _status(cluster, run_dir)
        found = re.search(pattern, seen)
        if found:
            return found
        time.sleep(1)
    pytest.fail(f"no {pattern!r} in status within {timeout:g} s: {seen}")


def _screenshot(page: Path, shot: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("Chromium is not installed (scripts/test.sh installs it when run as root)")
    image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot")
    with tempfile.TemporaryDirectory(prefix="scaletrain-chromium-") as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                        "--window-size=1000,1100", f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, timeout=120)
    colours = image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 20, "the screenshot is blank"


def test_status_requeue_cancel_save_logs_report(slurm_cluster, probed_profile, tmp_path):
    run_dir = tmp_path / "run"
    proc = slurm_cluster.scaletrain("submit", "--profile", str(probed_profile), "--run-dir", str(run_dir),
                                    "--requeue", "--time", "00:10:00", "--device", "cpu", "--gpus", "2",
                                    "--", str(JOB), str(run_dir), "400", timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0].strip()
    try:
        first = int(_until(slurm_cluster, run_dir, r"RUNNING .*step (\d+)/400", 180).group(1))
        later = int(_until(slurm_cluster, run_dir, r"RUNNING .*step (\d+)/400", 60).group(1))
        deadline = time.monotonic() + 60
        while later <= first and time.monotonic() < deadline:
            later = int(_until(slurm_cluster, run_dir, r"step (\d+)/400", 30).group(1))
        assert later > first
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", job_id)      # the time limit is near
        _until(slurm_cluster, run_dir, r"RUNNING .*requeued 1x", 240)
        saved = json.loads((run_dir / "checkpoints" / "stop.json").read_text())["step"]
        deadline = time.monotonic() + 120     # the second run trains (its own steps, past the resume point)
        while int(_until(slurm_cluster, run_dir, r"requeued 1x \| step (\d+)/400", 60).group(1)) < saved + 2:
            assert time.monotonic() < deadline
            time.sleep(1)
        cancel = slurm_cluster.scaletrain("cancel", str(run_dir), "--save", "--wait", "240", timeout=300)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    finally:
        slurm_cluster.run("scancel", job_id)
    stop = json.loads((run_dir / "checkpoints" / "stop.json").read_text())
    assert stop["reason"] == "requested" and stop["signal"] == "SIGUSR2" and stop["restart_count"] == 1, stop
    assert (run_dir / "checkpoints" / f"step-{stop['step']:08d}" / "COMMIT.json").is_file()
    assert f"saved step {stop['step']} (stop.json: requested)" in cancel.stdout, cancel.stdout
    info = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    assert "Restarts=1" in info, info                                # stopped, not requeued again
    final = _status(slurm_cluster, run_dir)
    assert f"step {stop['step']}/400" in final and "stopped (requested)" in final, final

    log = slurm_cluster.scaletrain("logs", str(run_dir), timeout=60).stdout
    assert "requeueing job" in log and "not requeued" in log, log
    assert log.count("resumed at step") == 4, log                  # 2 ranks x 2 runs
    rank0 = slurm_cluster.scaletrain("logs", str(run_dir), "--rank", "0", timeout=60).stdout
    assert rank0.count("resumed at step") == 2 and "requeueing" not in rank0, rank0

    rep = slurm_cluster.scaletrain("report", str(run_dir), timeout=60)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    records = [json.loads(x) for x in (run_dir / "monitor" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["type"] == "step"]
    assert "runs: 2 (restarted 1x)" in rep.stdout
    assert f"reached {stop['step']} of 400" in rep.stdout, rep.stdout
    resumed = [r["start_step"] for r in records if r["type"] == "start"]
    assert len(resumed) == 2 and resumed[0] == 0 and resumed[1] > 0
    assert resumed[1] + steps[-1]["step"] == stop["step"]
    shot = tmp_path / "report.png"
    _screenshot(run_dir / "report.html", shot)
    keep = HERE.parent.parent / "docs" / "img"
    if keep.is_dir():
        shutil.copy(shot, keep / "after-submit-report.png")


def test_python_api_submit_wait_status_report(slurm_cluster, probed_profile, tmp_path, monkeypatch):
    import scaletrain

    monkeypatch.chdir(tmp_path)
    env = slurm_cluster.env()
    job = scaletrain.submit(cluster=str(probed_profile), gpus=1, program=[str(JOB), str(tmp_path / "run"), "12"],
                            device="cpu", time="00:05:00", run_dir=tmp_path / "run", env=env)
    try:
        assert job.state in {"PENDING", "RUNNING", "COMPLETED"}
        assert job.wait(timeout=240, poll=1.0) == "COMPLETED", job.logs()
    finally:
        slurm_cluster.run("scancel", job.job_id)
    status = scaletrain.Job(tmp_path / "run", env=env).status()
    assert (status.state, status.step, status.total_steps, status.checkpoint) == ("COMPLETED", 12, 12, 10)
    assert "finished at step 12" in job.logs()          # one rank: its lines carry no prefix
    text = job.report()
    assert "reached 12 of 12" in text and (tmp_path / "run" / "report.html").is_file()
