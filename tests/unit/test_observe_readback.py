"""A writer owns its reader (issue 40): the Monitor's metrics.jsonl and summary.json and the GPU
sampler's gpus-<host>.jsonl are read back by the observe module that writes them, and the
after-submit verbs (jobs/) and ``plan --explain`` call those readers instead of parsing the files
themselves."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from scaletrain.contract.files import METRICS_FILE, SUMMARY_FILE
from scaletrain.jobs import gpus, runfolder, status
from scaletrain.observe import monitorfiles, nodesampler
from scaletrain.observe.devices import Sample
from scaletrain.observe.monitor import Monitor

JOBS = Path(__file__).resolve().parents[2] / "src" / "scaletrain" / "jobs"


def _monitor_run(run: Path, losses: list[float]) -> Path:
    """A run folder as the Monitor writes it: a start line, a step line per step, a summary."""
    mon = Monitor(run, console=False, device_sampler=None, jsonl_every=1)
    for loss in losses:
        mon.step(samples=4, loss=loss)
    mon.close()
    return run / METRICS_FILE


def test_metrics_read_back_what_the_monitor_wrote_nan_as_null_and_a_cut_line_skipped(tmp_path):
    path = _monitor_run(tmp_path / "run", [0.5, float("nan"), 0.25])
    assert '"loss": null' in path.read_text()                   # the writer: NaN is JSON's null
    with open(path, "a", encoding="utf-8") as fh:               # a job killed mid-write
        fh.write('{"type": "step", "step": 4, "t": 9.5, "loss"')
    records = list(monitorfiles.read_records(path))
    assert [r["type"] for r in records] == ["start", "step", "step", "step", "summary"]
    steps = [r for r in records if r["type"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r.get("loss") for r in steps] == [0.5, None, 0.25]   # null reads back as "no loss", not NaN
    assert all(r["samples"] == 4 and r["samples_per_s"] > 0 for r in steps)
    start, last = monitorfiles.metrics_tail(path)
    assert start is not None and start["type"] == "start"
    assert last is not None and (last["step"], last["loss"]) == (3, 0.25)   # the whole line before the cut one


def test_the_tail_finds_the_step_lines_the_writer_starts_with(tmp_path):
    """The tail searches for the writer's first bytes; a change of the step lines' template that
    the reader does not follow shows here (status would see no step at all)."""
    path = _monitor_run(tmp_path / "run", [1.0] * 5)
    assert path.read_bytes().count(monitorfiles.STEP_HEAD) == 5
    start, last = monitorfiles.metrics_tail(path)
    assert start is not None and last is not None and last["step"] == 5
    got = status.RunStatus(run=runfolder.open_run(tmp_path / "run"), state="RUNNING")
    status._progress(got)                                       # status reads through the same reader
    assert got.step == 5


def test_a_hand_edited_record_loses_the_bad_fields_not_the_file(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"type": "step", "step": 3, "t": 1.0, "loss": "x", "samples_per_s": -2}\n'
                    '{"type": "step", "step": true, "t": 1.0}\n[1, 2]\nnot json\n')
    assert list(monitorfiles.read_records(path)) == [{"type": "step", "step": 3, "t": 1.0}]


def test_the_summary_reads_back_as_the_step_the_monitor_measured(tmp_path):
    mon = Monitor(tmp_path / "run", console=False, device_sampler=None, warmup=2)
    for _ in range(8):
        mon.step(samples=4, loss=float("nan"))
    written = mon.close()
    doc = json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())   # strict JSON: no bare NaN in it
    measured = monitorfiles.summary_step(doc)
    assert measured is not None
    assert measured.step_s == pytest.approx(written["step_s_median"]) and measured.step_s > 0
    assert (measured.samples_per_step, measured.world_size, measured.steps) == (4, 1, 8)
    assert measured.samples == written["total_samples"] and measured.grad_bytes is None
    few = Monitor(tmp_path / "few", console=False, device_sampler=None, warmup=5)
    few.step(samples=4)
    few.close()
    assert monitorfiles.summary_step(json.loads((tmp_path / "few" / SUMMARY_FILE).read_text())) is None


class _Backend:
    name = "fake"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> dict[str, Sample]:
        self.reads += 1
        return {"0": Sample(util_pct=90.0, mem_gb=float(self.reads)), "1": Sample(util_pct=math.nan, mem_gb=2.0)}

    def close(self) -> None:
        pass


def test_gpu_samples_read_back_what_the_sampler_wrote(tmp_path):
    path = nodesampler.sample_loop(tmp_path, 5.0, _Backend(), vendor="nvidia", host="g7", max_samples=2,
                                   stop=None)
    assert path == nodesampler.samples_path(tmp_path, "g7") and nodesampler.sample_files(tmp_path) == [path]
    assert '"util_pct": null' in path.read_text()               # NaN written as null
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"t": 5.0, "devices": {"0": {"util_pct": 1')  # cut short
    lines = list(nodesampler.read_samples(path))
    assert lines[0] == nodesampler.SamplerLine(host="g7", reason=None)
    readings = [x for x in lines if isinstance(x, nodesampler.Reading)]
    assert len(readings) == 2 and all((r.host, r.interval_s) == ("g7", 5.0) for r in readings)
    assert [r.devices["0"] for r in readings] == [(90.0, 1.0), (90.0, 2.0)]
    assert readings[0].devices["1"] == (None, 2.0)               # null reads back as "no reading"
    series, notes = gpus.read_samplers([path])                   # the report's figures from the reader
    assert [(s.label, s.mean_util(), s.interval_s) for s in series] == [("g7:0", 90.0, 5.0), ("g7:1", None, 5.0)]
    assert notes == []


def test_a_blind_sampler_says_why_through_the_reader(tmp_path):
    path = nodesampler.sample_loop(tmp_path, 1.0, None, reason="no GPU", host="c1")
    assert list(nodesampler.read_samples(path)) == [nodesampler.SamplerLine(host="c1", reason="no GPU")]
    assert gpus.read_samplers([path]) == ([], ["GPU sampler on c1: no GPU"])


@pytest.mark.parametrize("module", sorted(p.name for p in JOBS.glob("*.py")))
def test_jobs_does_not_parse_the_observe_files_itself(module):
    """jobs/ finds the Monitor's and the sampler's files; reading them is their writer's reader's
    job. No module of jobs/ parses JSON itself or names the sampler's or summary's file, and only
    runfolder names metrics.jsonl (to find it)."""
    tree = ast.parse((JOBS / module).read_text(encoding="utf-8"))
    parses = [f"line {node.lineno}" for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "json" and node.attr in ("load", "loads")]
    parses += [f"line {node.lineno}: {node.id}" for node in ast.walk(tree)
               if isinstance(node, ast.Name) and node.id in ("json_lines", "read_json_object", "GPU_SAMPLES_PREFIX",
                                                              "SUMMARY_FILE")
               or (module != "runfolder.py" and isinstance(node, ast.Name) and node.id == "METRICS_FILE")]
    assert parses == []
