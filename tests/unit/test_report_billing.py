"""``scaletrain report`` says what a job was billed in the centre's unit (issue 36 item 2): the
cluster comes from job.sh's scaletrain header, the bill from the profile's billing rule applied to
sacct's allocation; without a known cluster the report gives GPU-hours allocated and says so.

Rules (the profiles' quotes): Alliance "Research groups are charged for the maximum number of
RGU-core-memory bundles they use" (Fir: H100 bundle "12 cores, 288 GB", 12.2 RGU); CSC Roihu
"Total GPU BU = numOfGPUs * 200 BU/GPUh * runtime-hours"; LUMI "A GPU-hour corresponds to the
allocation of a full MI250x module (2 GCDs) for one hour", billed per slice of 8 cores or 64 GB.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.contract.script import GENERATED_BY
from scaletrain.jobs import report, report_page


def _report(tmp_path: Path, cluster: str | None, tres: str, elapsed: str) -> report.Report:
    head = GENERATED_BY.format(version="0", cluster=cluster) if cluster else "# a script of my own"
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n{head}\nsrun python train.py\n")
    (tmp_path / "job_id").write_text("4242\n")
    rep = report.build(tmp_path, use_sacct=False)
    row = {"JobID": "4242", "State": "COMPLETED", "Elapsed": elapsed, "AllocTRES": tres, "AllocCPUS": "1"}
    return dataclasses.replace(rep, acct=[row])


@pytest.mark.parametrize("cluster, tres, elapsed, line", [
    # 1 GPU but 24 cores: two Fir bundles (12 cores, 288000M = 281.25G each) for the hour
    ("fir", "billing=2,cpu=24,gres/gpu=1,mem=100G,node=1", "01:00:00",
     "cost: 2 bundle-hours billed (a bundle: 1 H100, 12 cores, 281.25G; 12.2 RGU each: 24.4 RGU-equivalent hours)"
     " (1 for the GPUs alone) over 3600 s of running (fir profile's billing rule on sacct's allocation)"),
    # 2 GPUs for half an hour: 1 GPU-hour at 200 BU
    ("roihu", "cpu=144,gres/gpu=2,node=1", "00:30:00",
     "cost: 200 GPU BU billed (1 GPU-hours x 200 BU) over 1800 s of running "
     "(roihu profile's billing rule on sacct's allocation)"),
    # 8 GCDs, 480 GB (8 slices of 64 GB), 2 GCDs per billed GPU-hour
    ("lumi", "cpu=56,gres/gpu=8,mem=480G,node=1", "01:00:00",
     "cost: 4 GPU-hours billed (one billed GPU-hour = 2 MI250X GCDs for an hour) over 3600 s of running "
     "(lumi profile's billing rule on sacct's allocation)"),
])
def test_report_bills_in_the_centres_unit(tmp_path: Path, cluster: str, tres: str, elapsed: str, line: str) -> None:
    text = report_page.render_text(_report(tmp_path, cluster, tres, elapsed))
    assert f"  {line}" in text.splitlines(), text


def test_unknown_cluster_gives_gpu_hours_and_says_the_unit_is_unknown(tmp_path: Path) -> None:
    rep = _report(tmp_path, None, "cpu=4,gres/gpu=2,node=1", "00:01:00")
    fig = report.figures(rep)
    assert fig["billed"] is None and fig["gpu_hours"] == pytest.approx(2 * 60 / 3600)
    assert ("  GPU-hours: 0.033 allocated over 60 s of running (the centre bills in its own unit; job.sh names "
            "no cluster whose profile says which)") in report_page.render_text(rep).splitlines()


def test_a_cluster_without_a_profile_here_is_said(tmp_path: Path) -> None:
    rep = _report(tmp_path, "mars", "cpu=4,gres/gpu=2,node=1", "00:01:00")
    assert rep.profile is None and "cost:" not in report_page.render_text(rep)
    assert "job.sh was planned for cluster 'mars', which no profile here describes" in " ".join(rep.notes)


def test_a_cpu_job_on_a_known_cluster_is_not_billed_in_gpu_units(tmp_path: Path) -> None:
    rep = _report(tmp_path, "fir", "cpu=8,mem=16G,node=1", "01:00:00")
    text = report_page.render_text(rep)
    assert report.figures(rep)["billed"] is None and "bundle" not in text
    assert "no GPUs allocated: the job's CPUs are billed, not counted here" in text
