"""Every fact of the shipped profiles quotes its centre's page, and the numbers planned from the
Alliance's bundles are the page's (issue 36 item 2).

The quotes are checked by the project's checker against the stored pages
(``../shared/tools/check-profile-quotes`` and ``../shared/reference/centre-docs``, beside the
checkout in CI); without them that test is skipped, saying why. The bundle figures below are the
Alliance wiki's "Allocations and compute scheduling", Ratios in bundles, column "Bundle per GPU"
(stored copy of 2026-05-17, read 2026-11-27).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.clusters.profile import _shipped_dir, load_profile
from scaletrain.clusters.resources import Resources, billed_gpu_hours, billing_text
from scaletrain.plan.planner import make_plan
from scaletrain.plan.request import JobRequest
from scaletrain.slurm.parse import parse_mem_mib

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT.parent / "shared" / "tools" / "check-profile-quotes"


@pytest.mark.skipif(not CHECKER.is_file(), reason=f"no quote checker at {CHECKER} (CI has ../shared beside "
                                                  "the checkout)")
@pytest.mark.skipif(sys.version_info < (3, 11), reason="check-profile-quotes needs Python 3.11+ (tomllib)")
def test_every_profile_quote_is_on_its_centres_page() -> None:
    done = subprocess.run([sys.executable, str(CHECKER), str(_shipped_dir())], capture_output=True, text=True,
                          timeout=600, check=False)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr
    # every fact carries a quote, and every quote was found
    assert summary.endswith(" 0 not found, 0 facts with no quote"), summary


# cluster -> (cores, MiB of memory) of the billed bundle of one H100: Fir '12 cores, 288 GB' (a quarter
# of the node's '1125G or 1152000M'), Nibi '14 cores, 250 GB' (an eighth of '2000G or 2048000M')
BUNDLE = {"fir": (12, 288_000), "nibi": (14, 250 * 1024)}


@pytest.mark.parametrize("cluster", sorted(BUNDLE))
def test_planned_jobs_ask_for_the_bundle_they_are_billed_for(cluster: str) -> None:
    cores, mib = BUNDLE[cluster]
    prof = load_profile(cluster)
    for gpus in range(1, prof.gpus_per_node + 1):
        plan = make_plan(JobRequest(cluster=cluster, script="t.py", account="def-x", gpus=gpus), prof)
        r = plan.resources
        assert r.cpus_per_task * r.tasks_per_node == cores * gpus, (gpus, r.cpus_per_task)
        asked = parse_mem_mib(plan.resources.mem)
        assert asked is not None and asked >= mib * gpus - 1, (gpus, plan.resources.mem)
        assert asked <= prof.mem_per_node_gb * 1024, (gpus, plan.resources.mem)   # and never more than a node has
        assert plan.resources.gpu_hours == gpus   # one bundle per GPU for an hour, nothing more


def test_billing_lines_speak_the_centres_unit() -> None:
    fir, roihu, lumi = load_profile("fir"), load_profile("roihu"), load_profile("lumi")
    assert billing_text(4, 4, fir) == ("4 bundle-hours billed (a bundle: 1 H100, 12 cores, 281.25G; "
                                       "12.2 RGU each: 48.8 RGU-equivalent hours)")
    assert billing_text(4, 4, roihu) == "800 GPU BU billed (4 GPU-hours x 200 BU)"
    assert billing_text(2, 2, lumi) == "2 GPU-hours billed (one billed GPU-hour = 2 MI250X GCDs for an hour)"
    plan = make_plan(JobRequest(cluster="nibi", script="t.py", account="def-x", gpus=8), load_profile("nibi"))
    from scaletrain.plan.summary import render_summary

    text = render_summary(plan)
    assert "8 bundle-hours billed" in text and "GPU-hours billed" not in text


def test_the_alliance_counts_a_fraction_of_a_bundle_lumi_whole_slices() -> None:
    # the page's example: 1 RGU, 5 cores for a 3-core bundle "will be counted as 1.66 RGU equivalents";
    # on Fir 20 cores for one H100 (12 per bundle) is 1.67 bundles, on LUMI 9 cores per GCD 2 slices
    fir = load_profile("fir")
    assert billed_gpu_hours(Resources(nodes=1, gpus_per_node=1, tasks_per_node=1, cpus_per_task=20,
                                      mem_gb=100, seconds=3600), fir) == 1.67
    lumi = load_profile("lumi")
    assert billed_gpu_hours(Resources(nodes=1, gpus_per_node=1, tasks_per_node=1, cpus_per_task=9,
                                      mem_gb=60, seconds=3600, partition="small-g"), lumi) == 1.0
