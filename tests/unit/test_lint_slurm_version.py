"""Lint knows the Slurm it judges (issue 36 item 3): the profile's Slurm release, the rule that
holds only for some releases, ``clusters check`` reading the release, and the escaped per-task
variable that gpus-shared-by-tasks must recognise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.clusters.check import compare, render_report
from scaletrain.clusters.profile import load_profile
from scaletrain.clusters.schema import build_profile
from scaletrain.errors import ProfileError
from scaletrain.lint.engine import lint_file, lint_text
from scaletrain.lint.rules_launch import srun_drops_cpus_per_task
from test_lint_rules import job

# SchedMD's changelog: 22.05.0rc1 "Make it so srun no longer inherits SLURM_CPUS_PER_TASK";
# 23.11.0rc1 "... get back the previous behavior before Slurm 22.05"
CPT = job("--time=1:00:00", "--nodes=1", "--ntasks-per-node=4", "--cpus-per-task=8", "--gres=gpu:4",
          body="srun python x.py")


def _on(version: str | None, cluster: str = "narval") -> dict[str, str]:
    prof = dataclasses.replace(load_profile(cluster), slurm_version=version)
    return {f.rule: f.message for f in lint_text(CPT, profile=prof).findings}


@pytest.mark.parametrize("version, warns", [
    ("22.05", True), ("22.05.9", True), ("23.02.7", True),
    ("23.11", False), ("23.11.0", False), ("24.05.4", False), ("21.08.8", False), (None, False),
])
def test_srun_cpus_per_task_only_where_the_release_drops_it(version: str | None, warns: bool) -> None:
    found = _on(version)
    assert ("srun-cpus-per-task" in found) == warns, found
    if warns:   # the warning says which release it holds for
        assert f"narval runs Slurm {version}, whose srun does not inherit it" in found["srun-cpus-per-task"]


def test_no_such_warning_for_an_unknown_cluster_or_a_shipped_profile() -> None:
    assert "srun-cpus-per-task" not in {f.rule for f in lint_text(CPT).findings}
    assert "srun-cpus-per-task" not in {f.rule for f in lint_text(CPT, profile=load_profile("narval")).findings}


def test_the_release_window() -> None:
    assert [srun_drops_cpus_per_task(v) for v in ("22.04", "22.05", "23.02.9", "23.11.0", "slurm 23.02.1", "x")] \
        == [False, True, True, False, True, False]


def test_slurm_version_is_checked_when_a_profile_is_read() -> None:
    from test_profile_provenance import _roihu

    assert build_profile(_roihu(slurm_version="23.11.4"), path="r.toml").slurm_version == "23.11.4"
    with pytest.raises(ProfileError, match="slurm_version must be a Slurm version such as '23.11'"):
        build_profile(_roihu(slurm_version="new"), path="r.toml")


def test_every_live_profile_says_why_its_slurm_release_is_unknown() -> None:
    for name in ("roihu", "jupiter", "lumi", "fir", "nibi", "rorqual", "trillium", "narval", "juwels-booster"):
        prof = load_profile(name)
        assert prof.slurm_version is None and "no stored page" in prof.unconfirmed_facts["slurm_version"], name


def test_clusters_check_reads_the_release() -> None:
    from test_clusters_check import _nodes, _parts

    roihu = load_profile("roihu")
    assert compare(roihu, _nodes(), _parts(), "slurm 24.05.4") == []
    report = render_report(roihu, [], "slurm 24.05.4")
    assert 'Slurm 24.05.4 here; the profile records no release: add slurm_version = "24.05.4"' in report
    old = dataclasses.replace(roihu, slurm_version="22.05")
    assert [d.line() for d in compare(old, _nodes(), _parts(), "slurm 24.05.4")] == [
        "Slurm release: profile says 22.05, Slurm says 24.05.4"]
    assert compare(old, _nodes(), _parts(), "") == []   # sinfo --version not readable: nothing said
    assert "records no release" not in render_report(old, [], "slurm 22.05.2")


# LUMI user guide lumig-job.md, a wrapper whose line is `export ROCR_VISIBLE_DEVICES=\$SLURM_LOCALID`;
# the same escaped form inside srun ... bash -c "..." is what LUMI's container scripts write
ESCAPED = ('srun singularity exec $SIF bash -c "export ROCR_VISIBLE_DEVICES=\\$SLURM_LOCALID; '
           'python train.py"')


@pytest.mark.parametrize("body, fires", [
    (ESCAPED, False),
    (ESCAPED.replace("ROCR", "CUDA"), False),
    ('srun bash -c "export ROCR_VISIBLE_DEVICES=\\${SLURM_LOCALID}; python train.py"', False),
    ('srun bash -c "export SOMETHING_ELSE=\\$SLURM_LOCALID; python train.py"', True),
    ("srun python train.py", True),
], ids=["escaped", "escaped-cuda", "escaped-braces", "other-variable", "nothing"])
def test_gpus_shared_by_tasks_knows_the_escaped_local_id(tmp_path: Path, body: str, fires: bool) -> None:
    (tmp_path / "train.py").write_text("import torch\nmodel = Net().cuda()\n")
    script = tmp_path / "job.sh"
    script.write_text(job("--time=1:00:00", "--nodes=1", "--ntasks-per-node=8", "--gpus-per-node=8", body=body))
    assert ("gpus-shared-by-tasks" in {f.rule for f in lint_file(str(script)).findings}) == fires


def test_probe_records_the_release_and_lint_then_applies_the_rule(tmp_path: Path, monkeypatch) -> None:
    from scaletrain.cli.main import main
    from test_clusters_check import _nodes, _parts

    (tmp_path / "nodes.txt").write_text(_nodes() + "\n")
    (tmp_path / "parts.txt").write_text(_parts() + "\n")
    for name, body in (("scontrol", f'case "$2" in node) cat {tmp_path}/nodes.txt;; partition) cat '
                                    f"{tmp_path}/parts.txt;; config) echo 'ClusterName = probed';; esac"),
                       ("sinfo", 'test "$1" = --version && echo "slurm 23.02.7"')):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    out = tmp_path / "probed.toml"
    assert main(["clusters", "probe", "--output", str(out)]) == 0
    prof = load_profile(str(out))
    assert prof.slurm_version == "23.02.7"
    assert "srun-cpus-per-task" in {f.rule for f in lint_text(CPT, profile=prof).findings}


@pytest.mark.parametrize("version, exports", [
    (None, True), ("22.05.9", True), ("23.02.7", True), ("23.11.4", False), ("24.05", False), ("21.08.8", False),
])
def test_planned_script_says_which_slurm_needs_the_export(version: str | None, exports: bool) -> None:
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.render import render_script
    from scaletrain.plan.request import JobRequest

    prof = dataclasses.replace(load_profile("narval"), slurm_version=version)
    req = JobRequest(cluster="narval", nodes=1, account="def-someprof", script="train.py")
    text = render_script(make_plan(req, prof))
    lines = text.splitlines()
    # the comment names the releases whose srun drops --cpus-per-task (not "Slurm >= 22.05": 23.11 restored it)
    assert "Slurm >= 22.05" not in text
    assert ('export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"' in lines) == exports
    if exports:
        at = lines.index('export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"')
        assert lines[at - 1] == ("# Slurm 22.05 until 23.11: srun does not inherit --cpus-per-task from sbatch "
                                 "(23.11 restored it; elsewhere this line is harmless)")
    # with or without the export, lint of the planned script on that Slurm finds no srun-cpus-per-task
    assert "srun-cpus-per-task" not in {f.rule for f in lint_text(text, profile=prof).findings}
