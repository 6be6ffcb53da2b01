"""A job stopped twice and resumed (the README's resumable example): the report's throughput weights
each run by its steps and lists every run's figure, the stop names its run in the same numbering as
"runs: N", and the console of a resumed run counts the overall step, as ``scaletrain status`` does."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from scaletrain.jobs import report, report_page
from scaletrain.observe.monitor import Monitor
from scaletrain.observe.records import StepBatch
from scaletrain.observe.sinks import ConsoleSink
from scaletrain.observe.steplog import StepColumns

# (start step, steps trained, samples/s) of the three runs the issue saw: stopped at 18 and 39, then to the end
RUNS = [(0, 18, 129.0), (18, 21, 202.0), (39, 1241, 6350.0)]


def _write_runs(folder: Path, runs: list[tuple[int, int, float]], stop: dict | None = None) -> Path:
    lines = []
    for i, (offset, steps, rate) in enumerate(runs):
        lines.append({"type": "start", "time": 1000.0 * (i + 1), "total_steps": 1280, "start_step": offset})
        lines += [{"type": "step", "step": s, "t": 0.01 * s, "samples": 64, "samples_per_s": rate}
                  for s in range(1, steps + 1, max(1, steps // 5))] + [
                  {"type": "step", "step": steps, "t": 0.01 * steps, "samples": 64, "samples_per_s": rate}]
        lines.append({"type": "summary", "steps": steps, "samples_per_s": rate})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if stop is not None:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "stop.json").write_text(json.dumps(stop))
    return folder


def test_throughput_weights_each_run_by_its_steps_and_lists_them(tmp_path):
    rep = report.build(_write_runs(tmp_path, RUNS))
    fig = report.figures(rep)
    # (18 x 129 + 21 x 202 + 1241 x 6350) / 1280 = 7886914 / 1280; the plain median was 202
    assert fig["samples_per_s"] == pytest.approx(6161.6515625)
    assert fig["run_rates"] == [(1, 129.0, 18), (2, 202.0, 21), (3, 6350.0, 1241)]
    assert fig["runs"] == 3 and fig["last_step"] == 1280 and fig["steps_redone"] == 0
    assert ("throughput: 6162 samples/s (the runs' figures weighted by their steps: run 1 129 over 18 steps, "
            "run 2 202 over 21 steps, run 3 6350 over 1241 steps)") in report_page.render_text(rep)


def test_runs_of_equal_length_weigh_alike_and_one_run_is_its_own_figure(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    two = report.figures(report.build(_write_runs(tmp_path / "a", [(0, 10, 100.0), (10, 10, 300.0)])))
    assert two["samples_per_s"] == pytest.approx(200.0)
    one = report.build(_write_runs(tmp_path / "b", [(0, 7, 55.5)]))
    assert report.figures(one)["samples_per_s"] == pytest.approx(55.5)
    assert "throughput: 55.5 samples/s (run 1 55.5 over 7 steps)" in report_page.render_text(one)


@pytest.mark.parametrize("step,run", [(18, 1), (39, 2)])
def test_the_stop_names_its_run_in_the_runs_numbering(tmp_path, step, run):
    # a local run has no Slurm restart count: every stop.json says 0, whichever run it stopped
    stop = {"reason": "requested", "step": step, "signal": "SIGUSR1", "restart_count": 0}
    text = report_page.render_text(report.build(_write_runs(tmp_path, RUNS, stop)))
    assert "runs: 3 (restarted 2x)" in text
    assert f"stopped on purpose: requested at step {step} (SIGUSR1, run {run} of 3)" in text
    assert "restart 0" not in text


def test_a_stop_outside_the_recorded_runs_takes_slurms_count(tmp_path):
    stop = {"reason": "time limit", "step": 5000, "signal": "SIGUSR1", "restart_count": 1}
    text = report_page.render_text(report.build(_write_runs(tmp_path, RUNS, stop)))
    assert "(SIGUSR1, run 2 of 3)" in text       # SLURM_RESTART_COUNT=1: the job's second run


def test_console_counts_the_overall_step_after_a_resume():
    out = io.StringIO()
    sink = ConsoleSink(total=13, every=5, stream=out, bar=False, start_step=4)
    # this run's steps 1..9 are the job's steps 5..13
    sink.write(StepBatch(StepColumns.build([0.01] * 9, [4] * 9, first=1), mem_gb=0.1, world_size=1))
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["9/13", "13/13"]
    assert lines[-1].endswith("ETA 00:00")         # nothing left once the job's last step is done


def test_console_bar_after_a_resume_shows_the_overall_fraction():
    out = io.StringIO()
    sink = ConsoleSink(total=40, every=5, stream=out, bar=True, start_step=30)
    sink.write(StepBatch(StepColumns.build([0.01] * 10, [4] * 10, first=1), mem_gb=0.1, world_size=1))
    assert "100% step 40/40" in out.getvalue()


def test_monitor_started_at_a_resume_step_prints_overall_steps(tmp_path):
    out = io.StringIO()
    mon = Monitor(tmp_path, total_steps=20, every=5, log_every=5, device_sampler=None, stream=out,
                  start_step=8)
    for _ in range(12):
        mon.step(samples=4, loss=0.5)
    mon.close()
    shown = [ln.split()[1] for ln in out.getvalue().splitlines() if ln.startswith("step ")]
    assert shown[-1] == "20/20" and all(int(s.split("/")[0]) > 8 for s in shown), shown
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # the file keeps this run's count; status and report add the start step
    assert max(r["step"] for r in records if r["type"] == "step") == 12
