"""Every live profile x {1 GPU, 1 node, 2 nodes, 8 nodes} x every launcher: the script is valid bash,
lint finds nothing wrong with it, and its GPU request and launch line have the form the centre's
current documentation writes (GOLDEN: one row per cluster, citing the page).

Retired systems are refused by plan with their successor named; lint still reads their scripts.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from scaletrain.clusters.profile import list_profiles, load_profile
from scaletrain.errors import PlanError
from scaletrain.lint.engine import lint_text
from scaletrain.plan.launchers import SPECS
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import exports, render_script
from scaletrain.plan.request import JobRequest
from scaletrain.plan.summary import notes

from test_plan_golden import job_shape, sbatch_options  # tests/unit is on sys.path

LIVE = ("roihu", "jupiter", "lumi", "fir", "nibi", "rorqual", "trillium", "narval", "juwels-booster")
RETIRED = {"puhti": "roihu", "mahti": "roihu", "cedar": "fir", "graham": "nibi", "beluga": "rorqual"}
SHAPES = {"1gpu": {"gpus": 1}, "1node": {"nodes": 1}, "2nodes": {"nodes": 2}, "8nodes": {"nodes": 8}}

# cluster -> (the page the form comes from, the #SBATCH option carrying the GPUs, its value for N GPUs
# per node, partitions a job may land in (None: no --partition line), GPUs per node per that page)
GOLDEN: dict[str, tuple[str, str, str, tuple[str | None, ...], int]] = {
    "roihu": ("CSC docs/computing/running/creating-job-scripts-roihu.md, GPU jobs",
              "gres", "gpu:gh200:{n}", ("gpumedium", "gpularge"), 4),
    "jupiter": ("JSC apps.fz-juelich.de/jsc/hps/jupiter/configuration.html; HiPACE++ 'Jupiter Booster @ JSC'",
                "gres", "gpu:{n}", ("booster",), 4),
    "lumi": ("LUMI-AI-Guide 05-multi-gpu-and-node/run_ddp_torchrun_4.sh and README",
             "gpus-per-node", "{n}", ("small-g", "standard-g"), 8),
    "fir": ("Alliance wiki Fir, GPU instances", "gpus-per-node", "h100:{n}", (None,), 4),
    "nibi": ("Alliance wiki Nibi, GPU instances", "gpus-per-node", "h100:{n}", (None,), 8),
    "rorqual": ("Alliance wiki Rorqual, GPU instances", "gpus-per-node", "h100:{n}", (None,), 4),
    "trillium": ("Alliance wiki Trillium Quickstart, GPU subcluster", "gpus-per-node", "{n}", (None,), 4),
    "narval": ("Alliance wiki Narval, GPU instances", "gpus-per-node", "a100:{n}", (None,), 4),
    "juwels-booster": ("JSC course 'Parallelize Training'; apps.fz-juelich.de/jsc/hps/juwels/batchsystem.html",
                       "gres", "gpu:{n}", ("booster",), 4),
}
# How each launcher's line starts its processes (the guides' forms: CSC ml-multi, LUMI AI Guide 05)
KIND = {"torchrun": "torchrun", "scaletrain-run": "torchrun", "accelerate": "accelerate",
        "deepspeed": "deepspeed"}


def test_the_live_and_retired_sets_are_the_shipped_ones() -> None:
    shipped = set(list_profiles()) - {"local"}
    assert set(LIVE) | set(RETIRED) == shipped
    assert {n for n in shipped if load_profile(n).retired} == set(RETIRED)
    for name, succ in RETIRED.items():
        prof = load_profile(name)
        assert prof.successor == succ and prof.successor in LIVE and prof.facts.get("retired")


def _plan(cluster: str, shape: dict, launcher: str):
    req = JobRequest(cluster=cluster, script="train.py", script_args=("--epochs", "3"), account="project_1",
                     launcher=launcher, **shape)
    return make_plan(req, load_profile(cluster))


@pytest.mark.parametrize("cluster", LIVE)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("launcher", sorted(SPECS))
def test_live_profile_scripts(cluster: str, shape: str, launcher: str) -> None:
    prof = load_profile(cluster)
    missing = prof.missing_launchers.get(launcher)
    if missing:   # the centre's software lacks it (LUMI: no TensorFlow): refused, saying why
        with pytest.raises(PlanError, match=missing.split(" (")[0][:40]):
            _plan(cluster, SHAPES[shape], launcher)
        return
    plan = _plan(cluster, SHAPES[shape], launcher)
    text = render_script(plan)
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    doc, option, form, parts, per_node = GOLDEN[cluster]
    assert per_node == prof.gpus_per_node, doc
    gpn = 1 if shape == "1gpu" else per_node
    nodes = {"1gpu": 1, "1node": 1, "2nodes": 2, "8nodes": 8}[shape]
    opts = sbatch_options(text)
    assert opts[option] == form.format(n=gpn), f"{doc}: #SBATCH --{option}={form.format(n=gpn)}"
    assert opts.get("partition") in parts, doc
    got = job_shape(text, cluster)
    assert (got["nodes"], got["gpus_per_node"]) == (nodes, gpn)
    per_node_launcher = SPECS[launcher].per_node
    assert got["tasks_per_node"] == (1 if per_node_launcher else gpn)
    assert got["srun"] and got["kind"] == KIND.get(launcher, "python")
    if launcher in ("torchrun", "scaletrain-run"):
        assert got["nproc"] == gpn and got["multi_node_rdzv"] == (nodes > 1)
    assert "train.py" in text and "--epochs 3" in text
    # lint finds nothing, except the billing warning plan itself gives for 1 GPU of a whole node
    findings = [(f.rule, f.severity) for f in lint_text(text, profile=prof).findings]
    whole = prof.partitions[opts["partition"]].whole_node if opts.get("partition") else False
    allowed = {("partition-limit", "warning")} if (whole and gpn < per_node) else set()
    assert set(findings) <= allowed, findings
    if allowed:
        assert any("billed for" in n for n in notes(plan))


@pytest.mark.parametrize("cluster", ["roihu", "jupiter"])
def test_gh200_nodes_bind_each_gpu_to_its_grace_cpu(cluster: str) -> None:
    prof = load_profile(cluster)
    assert prof.cpu_arch == "aarch64" and prof.cores_per_gpu == 72
    assert prof.gpu_cpu_map == {g: tuple(range(72 * g, 72 * g + 72)) for g in range(4)}
    plan = _plan(cluster, {"nodes": 1}, "srun")
    assert (plan.resources.cpus_per_task, plan.resources.threads_per_proc) == (72, 72)
    masks = plan.resources.cpu_bind.removeprefix("mask_cpu:").split(",")
    assert [int(m, 16) for m in masks] == [((1 << 72) - 1) << (72 * g) for g in range(4)]
    torchrun = _plan(cluster, {"nodes": 1}, "torchrun")
    assert dict(exports(torchrun))["SCALETRAIN_GPU_CPU_MAP"].count(";") == 3
    assert (torchrun.resources.cpus_per_task, torchrun.resources.threads_per_proc) == (288, 72)


@pytest.mark.parametrize("name, successor", sorted(RETIRED.items()))
def test_retired_profiles_refuse_plan_with_the_successor(name: str, successor: str) -> None:
    prof = load_profile(name)
    with pytest.raises(PlanError) as err:
        _plan(name, {"gpus": 1}, "scaletrain")
    assert f"successor is {successor}" in err.value.message
    assert f"scaletrain port OLD.sh --cluster {successor}" in err.value.hint
    assert prof.retired and prof.retired in err.value.message


def test_lint_of_a_puhti_guide_script_says_retired_and_how_to_port() -> None:
    # CSC's Puhti example (docs/apps/pytorch.md), as users still have it
    text = ("#!/bin/bash\n#SBATCH --account=project_2001234\n#SBATCH --partition=gpu\n#SBATCH --ntasks=1\n"
            "#SBATCH --cpus-per-task=10\n#SBATCH --mem=80G\n#SBATCH --time=1:00:00\n#SBATCH --gres=gpu:v100:1\n\n"
            "module load pytorch/2.4\nsrun python3 myprog.py <options>\n")
    from scaletrain.lint.engine import choose_profile
    from scaletrain.lint.script import parse_script

    prof, how = choose_profile(parse_script(text, "old.sh"))
    assert prof is not None and prof.name == "puhti" and "partition 'gpu'" in how
    found = [f for f in lint_text(text, path="old.sh", profile=prof).findings if f.rule == "cluster-retired"]
    assert len(found) == 1
    assert "retired on 2026-07-31" in found[0].message and "successor: roihu" in found[0].message
    assert found[0].hint == "port it: scaletrain port old.sh --cluster roihu"
