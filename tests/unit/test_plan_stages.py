"""The planner as named stages: each stage's record for a few requests, the renderer's imports, and
one plan per submit.

A request becomes a batch script through settle, resources, software and files (each a function
from the records before it to one frozen record) and render. The records are pinned here field by
field for three requests that reach every stage (staged data and --requeue on Roihu, a DeepSpeed
config in LUMI's default image, an Accelerate config in the venv an Alliance job builds); their
figures are the ones the planner gave before it had stages.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli

import scaletrain
from scaletrain.clusters.profile import load_profile
from scaletrain.envs.check import CheckResult
from scaletrain.plan import planner
from scaletrain.plan.request import JobRequest

SRC = Path(scaletrain.__file__).parent
LUMI_IMAGE = load_profile("lumi").default_image


def _plan(cluster: str, **kw: Any) -> Any:
    return planner.make_plan(JobRequest(cluster=cluster, script="train.py", **kw), load_profile(cluster))


def _fields(record: Any, names: str) -> tuple[Any, ...]:
    return tuple(getattr(record, n) for n in names.split())


# -- each stage's record -----------------------------------------------------------------------------

def test_roihu_with_staged_data_and_requeue() -> None:
    p = _plan("roihu", gpus=8, account="project_1", requeue=True, stage_data="/scratch/p/d.tar", stage_data_gb=20.0,
              time="02:00:00")
    from scaletrain.plan.records import Settled

    assert isinstance(p.settled, Settled)
    assert p.settled.image is None
    assert (p.settled.request.cluster, p.settled.request.venv, p.settled.request.slurm_job_name) == ("roihu", None, "train")
    res = p.resources
    assert _fields(res, "nodes gpus_per_node gpus tasks_per_node ntasks gpus_per_task procs_per_node world_size") == \
        (2, 4, 8, 4, 8, 1, 4, 8)
    assert _fields(res, "cpus_per_task threads_per_proc mem mem_per_proc_gb") == (72, 72, None, None)
    assert _fields(res, "partition partition_family time time_seconds gpu_hours") == \
        ("gpularge", "gpularge", "02:00:00", 7200, 16.0)
    assert _fields(res, "signal_seconds max_requeues disk_gb whole_nodes exclusive_nodes requests_gpus") == \
        (300, 5, None, True, False, True)
    assert _fields(res.stage, "source kind scratch_var dest_name disk_gb") == \
        ("/scratch/p/d.tar", "tar", "$TMPDIR", "d", None)
    assert res.cpu_bind is not None and res.cpu_bind.startswith("mask_cpu:") and res.cpu_bind.count(",") == 3
    assert any("at most 5 times" in n for n in res.notes) and any("gpularge" in n for n in res.notes)
    sw = p.software
    assert _fields(sw, "setup mps python container container_here builds_venv wheels check_scaletrain") == \
        (("module purge", "module load python-pytorch"), (), "python3", "", "", False, "torch", True)
    assert dict(sw.env)["OMP_NUM_THREADS"] == "72" and dict(sw.env)["SCALETRAIN_CLUSTER"] == "roihu"
    assert sw.description == "the centre's modules (module load python-pytorch)"
    assert len(sw.warnings) == 1 and "will not find scaletrain" in sw.warnings[0]
    assert p.files == type(p.files)()   # no framework config, nothing to write


def test_lumi_deepspeed_in_the_default_image() -> None:
    p = _plan("lumi", gpus=16, account="project_1", launcher="deepspeed", deepspeed_config="zero3")
    assert p.settled.image == LUMI_IMAGE
    res = p.resources
    assert _fields(res, "nodes gpus_per_node tasks_per_node gpus_per_task procs_per_node world_size") == \
        (2, 8, 1, 8, 8, 16)
    assert _fields(res, "cpus_per_task threads_per_proc mem mem_per_proc_gb") == (56, 7, "480G", 60.0)
    assert _fields(res, "partition partition_family exclusive_nodes gpu_hours cpu_bind") == \
        ("standard-g", "lumi-g", True, 8.0, None)
    assert res.notes == ("deepspeed launcher: one task per node, nodes joined with --no_ssh and "
                         "--node_rank=$SLURM_NODEID (needs DeepSpeed >= 0.14)",)
    sw = p.software
    assert sw.container == sw.container_here == f"singularity exec {LUMI_IMAGE} "
    assert _fields(sw, "python check_scaletrain builds_venv warnings") == ("python3", False, False, ())
    assert sw.setup[0] == "module purge" and "module load lumi-aif-singularity-bindings" in sw.setup
    (job_file,) = p.files.job_files
    assert _fields(job_file, "var name scratch") == ("SCALETRAIN_DEEPSPEED_CONFIG", "ds_config.json", None)
    assert '"stage": 3' in job_file.text
    assert p.files.program_extra == ("--deepspeed", "--deepspeed_config", '"$SCALETRAIN_DEEPSPEED_CONFIG"')


def test_alliance_accelerate_in_the_venv_the_job_builds() -> None:
    p = _plan("narval", gpus=4, account="def-p", launcher="accelerate", accelerate_config="fsdp")
    assert p.settled.image is None
    res = p.resources
    assert _fields(res, "nodes tasks_per_node gpus_per_task procs_per_node cpus_per_task threads_per_proc") == \
        (1, 1, 4, 4, 48, 12)
    assert _fields(res, "partition partition_family mem mem_per_proc_gb gpu_hours") == \
        (None, "default", "498G", 124.5, 4.0)
    sw = p.software
    assert _fields(sw, "builds_venv wheels python container check_scaletrain") == (True, "torch", "python", "", False)
    assert sw.description == "a venv the job builds from the centre's wheels (torch only)"
    assert sw.setup[0] == "module load python" and "install --no-index --quiet torch" in sw.setup[1]
    assert len(sw.warnings) == 1 and "not accelerate" in sw.warnings[0]
    assert p.files.accelerate_config == '"$SCALETRAIN_ACCELERATE_CONFIG"'
    assert [f.name for f in p.files.job_files] == ["accelerate.yaml"]


@pytest.mark.parametrize("cluster, kw, takes", [
    ("roihu", {}, True),                                    # names none: the running environment
    ("roihu", {"venv": "/proj/own"}, False),                # its own environment
    ("roihu", {"container": "/p/img.sif"}, False),          # an image's Python
    ("lumi", {}, False),                                    # the profile's default image
    ("lumi", {"modules": ("pytorch",)}, True),              # the centre's module instead of the image
    ("local", {}, False),                                   # no Slurm: nothing to give
])
def test_settle_gives_the_running_environment_only_to_a_job_that_names_none(cluster, kw, takes) -> None:
    from scaletrain.plan.records import RunningEnv

    running = RunningEnv("venv", "/login/st-env")
    request = JobRequest(cluster=cluster, script="train.py", gpus=2, account="project_1", **kw)
    p = planner.make_plan(request, load_profile(cluster), running=running)
    assert (p.settled.request.venv == "/login/st-env") is takes
    assert (p.settled.request.env_origin == running.origin) is takes
    assert (p.software.description.startswith("venv /login/st-env (the venv running")) is takes


# -- render reads records and text only -----------------------------------------------------------------

# What the renderer may import: the records (the request's and the profile's types among them), and
# modules of text and fixed words (quoting, the launch lines, the script's contract words, Slurm's
# version facts, the exit codes).
RENDER_MAY_IMPORT = {"__future__", "shlex", "scaletrain._version", "scaletrain.contract.environ",
                     "scaletrain.contract.files", "scaletrain.contract.script", "scaletrain.errors",
                     "scaletrain.slurm.parse", "scaletrain.clusters.model", "scaletrain.plan.records",
                     "scaletrain.plan.request", "scaletrain.plan.values", "scaletrain.plan.launchers"}
STAGES = {"scaletrain.plan.settle", "scaletrain.plan.resources", "scaletrain.plan.layout",
          "scaletrain.plan.disk", "scaletrain.plan.software", "scaletrain.plan.jobfiles",
          "scaletrain.plan.planner"}


def _imports(module: str) -> set[str]:
    path = SRC.parent / (module.replace(".", "/") + ".py")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_render_imports_records_and_text_helpers_only() -> None:
    direct = _imports("scaletrain.plan.render")
    assert direct <= RENDER_MAY_IMPORT, direct - RENDER_MAY_IMPORT
    # nor through a helper: the plan's modules render reaches import no stage
    seen, todo = set(), [m for m in direct if m.startswith("scaletrain.plan.")]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        assert module not in STAGES, f"render reaches the stage {module}"
        todo += [m for m in _imports(module) if m.startswith("scaletrain.plan.")]


# -- one plan per submit --------------------------------------------------------------------------------

@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[JobRequest]:
    """The requests the planner is run for (``make_plan``, which every door reaches)."""
    seen: list[JobRequest] = []
    real = planner.make_plan

    def counting(request: JobRequest, profile: Any, **kw: Any) -> Any:
        seen.append(request)
        return real(request, profile, **kw)

    monkeypatch.setattr(planner, "make_plan", counting)
    monkeypatch.setattr("scaletrain.envs.check.check_job_python", lambda plan, **kw: CheckResult())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin")
    return seen


def test_submit_plans_the_job_once_in_its_run_folder(counted: list[JobRequest], capsys, tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "submit", "--dry-run", "--run-dir", str(tmp_path / "cli"), "--cluster",
                             "roihu", "--gpus", "4", "--account", "project_1", "--", "train.py")
    assert code == 0, err
    assert len(counted) == 1 and counted[0].files_dir == str(tmp_path / "cli")   # planned in the folder
    job = scaletrain.submit(cluster="roihu", program=["train.py"], gpus=4, account="project_1",
                            run_dir=tmp_path / "api")
    assert job.job_id == "4242"
    assert len(counted) == 2 and counted[1].files_dir == str(tmp_path / "api")


def test_a_job_that_cannot_be_planned_leaves_no_run_folder(counted: list[JobRequest], capsys,
                                                           tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "submit", "--dry-run", "--cluster", "roihu", "--gpus", "5000",
                           "--account", "project_1", "--", "train.py")
    assert code == 2 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()            # neither the folder nor runs/ it would have gone in
    code, _, err = run_cli(capsys, "submit", "--dry-run", "--run-dir", str(tmp_path / "a" / "b"), "--cluster",
                           "roihu", "--gpus", "5000", "--account", "project_1", "--", "train.py")
    assert code == 2 and not (tmp_path / "a").exists()


def test_records_are_frozen() -> None:
    p = _plan("roihu", gpus=4, account="project_1")
    for record in (p, p.settled, p.resources, p.software, p.files):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, dataclasses.fields(record)[0].name, None)
