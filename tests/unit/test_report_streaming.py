"""``report`` streams metrics.jsonl with memory bounded (issue 39, items 5 and 8).

The report kept every step record: 830 MB of memory for a 108 MB metrics.jsonl, a MemoryError
traceback under a 500 MB limit. The memory test runs the report in a child on a small and on
a six times larger file and compares the children's peak memory (``ru_maxrss``): it must not
grow with the file. No timing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.jobs import gpus as gpu_files
from scaletrain.jobs import report, report_page
from scaletrain.jobs.thin import Thinned

_PEAK = """
import resource, sys
from scaletrain.cli.main import main
rc = main(["report", sys.argv[1], "--output", sys.argv[2]])
print(rc, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _metrics(folder: Path, steps: int) -> int:
    """A Monitor folder of one run of ``steps`` steps; the file's size in bytes."""
    folder.mkdir()
    path = folder / "metrics.jsonl"
    with path.open("w") as fh:
        fh.write(json.dumps({"type": "start", "time": 1000.0, "total_steps": steps}) + "\n")
        line = ('{"type": "step", "step": %d, "t": %d.5, "samples": 64, "samples_per_s": 640.5, '
                '"loss": 1.25, "note": "padding so that a line is about as long as the Monitor\'s"}\n')
        fh.writelines(line % (i, i) for i in range(1, steps + 1))
        fh.write(json.dumps({"type": "summary", "steps": steps, "samples_per_s": 640.5}) + "\n")
    return path.stat().st_size


def _peak_kib(folder: Path, tmp_path: Path) -> int:
    done = subprocess.run([sys.executable, "-c", _PEAK, str(folder), str(tmp_path / f"{folder.name}.html")],
                          capture_output=True, text=True, timeout=600)
    rc, peak = done.stdout.split()[-2:]
    assert rc == "0", done.stderr[-1000:]
    return int(peak)


def test_report_memory_does_not_grow_with_the_metrics_file(tmp_path):
    small = _metrics(tmp_path / "small", 30_000)
    large = _metrics(tmp_path / "large", 180_000)
    grown_kib = _peak_kib(tmp_path / "large", tmp_path) - _peak_kib(tmp_path / "small", tmp_path)
    file_grown_kib = (large - small) // 1024
    assert file_grown_kib > 20_000
    # kept step records cost ~8x their bytes; streamed, the peak stays where it was
    assert grown_kib < file_grown_kib // 4, (grown_kib, file_grown_kib)


def test_the_streamed_figures_are_those_of_every_record(tmp_path):
    _metrics(tmp_path / "run", 5000)
    rep = report.build(tmp_path / "run", use_sacct=False)
    figures = report.figures(rep)
    assert (figures["runs"], figures["last_step"], figures["steps_recorded"]) == (1, 5000, 5000)
    part = rep.parts[0]
    assert part.last["step"] == 5000 and len(part.speed.points) <= 2 * part.speed.limit
    drawn = part.loss.drawn()
    assert drawn[0] == (1, 1.25) and len(drawn) <= 2 * part.loss.limit


@pytest.mark.parametrize("count", [0, 1, 599, 1200, 1201, 10_007])
def test_thinned_keeps_evenly_spaced_points_within_the_bound(count):
    line: Thinned[int] = Thinned(limit=600)
    for i in range(count):
        line.add(i)
    assert line.seen == count and len(line.points) <= 1200
    assert line.points == list(range(0, count, line.stride))


def test_gpu_figures_survive_the_thinning(tmp_path):
    path = tmp_path / "gpus-node1.jsonl"
    with path.open("w") as fh:
        fh.write(json.dumps({"type": "sampler", "host": "node1", "interval_s": 10.0}) + "\n")
        for i in range(5000):
            fh.write(json.dumps({"t": 100.0 + 10 * i, "devices": {"0": {"util_pct": 50.0 if i % 2 else 100.0,
                                                                        "mem_gb": 3.0}}}) + "\n")
    (series,), notes = gpu_files.read_samplers([path])
    assert series.mean_util() == pytest.approx(75.0)
    assert series.busy_hours() == pytest.approx(5000 * 0.75 * 10 / 3600)
    assert series.first_t == 100.0 and len(series.points) <= 1200 and notes == []


def test_an_unreadable_metrics_file_is_a_note_not_zero_runs(tmp_path, monkeypatch):
    """Item 8: an error of the disk is named, not read as "the Monitor recorded nothing"."""
    _metrics(tmp_path / "run", 10)
    from scaletrain.observe import monitorfiles

    def eio(path):
        raise OSError(5, "Input/output error")
        yield  # pragma: no cover - a generator, like the real one

    monkeypatch.setattr(monitorfiles, "read_records", eio)
    rep = report.build(tmp_path / "run", use_sacct=False)
    text = report_page.render_text(rep)
    assert f"cannot read {tmp_path / 'run' / 'metrics.jsonl'}: Input/output error" in text
    assert "throughput, steps, GPU use and memory are unknown" in text
