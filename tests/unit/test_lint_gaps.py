"""Lint's gaps on real scripts (issue 29 item 13): each case fires where it should and stays
quiet where it should not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.lint.engine import lint_file, lint_text
from scaletrain.lint.report import format_summary
from test_lint_real_world import _found
from test_lint_rules import job


def _lint_with_program(tmp_path: Path, program: str, *sbatch: str, body: str) -> dict[str, set[str]]:
    (tmp_path / "train.py").write_text(program)
    script = tmp_path / "job.sh"
    script.write_text(job("--time=1:00:00", *sbatch, body=body))
    out: dict[str, set[str]] = {}
    for f in lint_file(str(script)).findings:
        out.setdefault(f.rule, set()).add(f.severity)
    return out


SHARED = ("--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4")


@pytest.mark.parametrize("program,fires", [
    ('import torch\nmodel = Net().to("cuda")  # <- Device ID is chosen based on ROCR_VISIBLE_DEVICES\n',
     True),
    ('import torch\n# we call torch.cuda.set_device(local_rank) later\nmodel = Net().cuda()\n', True),
    ('import os, torch\ndev = int(os.environ["ROCR_VISIBLE_DEVICES"].split(",")[0])  # pick\n', False),
    ('import os, torch\ntorch.cuda.set_device(int(os.environ["SLURM_LOCALID"]))  # one per task\n',
     False),
    ('s = "#"\nmodel = Net().cuda()  # set_device\n', True),  # a '#' in a string is no comment
], ids=["rocr-comment", "set-device-comment", "rocr-code", "set-device-code", "hash-in-string"])
def test_a_comment_does_not_pick_a_gpu(tmp_path, program, fires):
    found = _lint_with_program(tmp_path, program, *SHARED, body="srun python train.py")
    assert ("gpus-shared-by-tasks" in found) == fires


def test_an_ambiguous_partition_reports_what_its_profiles_agree_on(tmp_path, monkeypatch):
    monkeypatch.delenv("SCALETRAIN_CLUSTER", raising=False)
    script = tmp_path / "booster.sh"
    script.write_text(job("--account=training2306", "--partition=booster", "--nodes=1",
                          "--ntasks-per-node=1", "--gres=gpu:1", "--time=1:00:00",
                          body="export SRUN_CPUS_PER_TASK=1\nsrun python x.py"))
    result = lint_file(str(script))
    assert result.cluster is None and result.candidates == ("jupiter", "juwels-booster")
    assert {f.rule for f in result.findings} == {"partition-limit"}  # whole nodes, 1 GPU used
    summary = format_summary([result])
    assert "cluster: jupiter or juwels-booster (partition 'booster' matches 2 profiles" in summary
    # JUPITER's develbooster takes 8 nodes, JUWELS' 4: where they disagree, nothing is said ...
    six = tmp_path / "devel.sh"
    six.write_text(job("--account=training2306", "--partition=develbooster", "--nodes=6",
                       "--ntasks-per-node=4", "--gres=gpu:4", "--time=1:00:00",
                       body="export SRUN_CPUS_PER_TASK=1\nsrun python x.py"))
    assert "partition-limit" not in {f.rule for f in lint_file(str(six)).findings}
    # ... and the profile picked with --cluster says it
    assert "partition-limit" in {f.rule for f in lint_file(str(six), cluster="juwels-booster").findings}
    assert lint_file(str(six), cluster="juwels-booster").candidates == ()


TWO_NODES = ("--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4")
LWS = "export LOCAL_WORLD_SIZE=$WORLD_SIZE\nsrun python train.py"


@pytest.mark.parametrize("program,severity", [
    ("import torch\nmodel = Net().cuda()  # LOCAL_WORLD_SIZE unused\n", "warning"),
    ("import os\nlocal = int(os.environ['LOCAL_WORLD_SIZE'])\n", "error"),
], ids=["never-read", "read"])
def test_local_world_size_is_an_error_where_the_program_reads_it(tmp_path, program, severity):
    found = _lint_with_program(tmp_path, program, *TWO_NODES, body=LWS)
    assert found["local-world-size"] == {severity}
    # a program lint cannot read may read it: an error, as before
    unread = _lint_with_program(tmp_path, program, *TWO_NODES,
                                body="export LOCAL_WORLD_SIZE=$WORLD_SIZE\nsrun python other.py")
    assert unread["local-world-size"] == {"error"}


@pytest.mark.parametrize("body,fires", [
    ('if [ ! -d data ]; then (echo "no data"; exit 1); fi', True),
    ('if [ ! -d data ]; then\n    ( echo "no data" >&2\n      exit 1 )\nfi', True),
    ('if [ -d data ]; then echo ok; else (echo "no data"; exit 2); fi', True),
    ('if [ ! -d data ]; then echo "no data"; exit 1; fi', False),
    ('if [ -d build ]; then (cd build && make); fi', False),
    ('if [ ! -d data ]; then { echo "no data"; exit 1; }; fi', False),
])
def test_an_exit_in_a_subshell_after_then(body, fires):
    found = _found(job("--time=1:00:00", body=body + "\nsrun python x.py"))
    assert ("subshell-exit" in found) == fires


CPT = ("--ntasks-per-node=4", "--cpus-per-task=8", "--gres=gpu:4")


@pytest.mark.parametrize("sbatch,body,fires", [
    (CPT, "srun python x.py", True),
    (CPT, "srun torchrun --standalone --nproc_per_node=4 x.py", True),
    (CPT, "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\nsrun python x.py", False),
    (CPT, "srun --cpus-per-task=$SLURM_CPUS_PER_TASK python x.py", False),
    (CPT, "srun -c 8 python x.py", False),
    (("--ntasks-per-node=4", "--cpus-per-task=1", "--gres=gpu:4"), "srun python x.py", False),
    (CPT, "python x.py", False),   # no srun: the batch step has every CPU of the job
], ids=["python", "torchrun", "exported", "srun-option", "srun-c", "one-cpu", "no-srun"])
def test_srun_without_the_cpus_sbatch_asked_for(sbatch, body, fires):
    # on a cluster that runs a Slurm whose srun drops sbatch's --cpus-per-task (22.05 to 23.02)
    narval = dataclasses.replace(load_profile("narval"), slurm_version="23.02.7")
    found: dict[str, set[str]] = {}
    for f in lint_text(job("--time=1:00:00", *sbatch, body=body), profile=narval).findings:
        found.setdefault(f.rule, set()).add(f.severity)
    assert ("srun-cpus-per-task" in found) == fires
    if fires:
        assert found["srun-cpus-per-task"] == {"warning"}


@pytest.mark.parametrize("cluster", ["jupiter", "juwels-booster"])
def test_our_own_booster_script_is_linted_against_the_cluster_it_was_planned_for(tmp_path, cluster):
    """A script scaletrain generated names its cluster in its header: no ambiguity left."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.plan import JobRequest, make_plan, render_script

    plan = make_plan(JobRequest(cluster=cluster, gpus=8, time="1:00:00", account="training2306",
                                script="train.py"), load_profile(cluster))
    script = tmp_path / "job.sh"
    script.write_text(render_script(plan))
    result = lint_file(str(script))
    assert result.cluster == cluster and result.candidates == ()
    assert "scaletrain header" in result.cluster_source
    # the same lines without our header are ambiguous again
    lines = script.read_text().splitlines()
    script.write_text("\n".join(line for line in lines if not line.startswith("# Generated by")) + "\n")
    assert lint_file(str(script)).cluster is None
