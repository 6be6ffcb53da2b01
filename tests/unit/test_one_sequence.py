"""One sequence from a request to a plan (issue 40): ``scaletrain plan``, ``scaletrain submit`` and
``scaletrain.submit()`` settle a request the same way - the profile, the data's measured size, the
program's imports, the account default, the running environment on a login node - so the same inputs
give the same plan, whichever door they came in by.

Two checks: the requests the planner settles from the three doors are equal over a set of cases
(watched at ``make_plan``, which every door reaches once), and each step of the sequence is called from
one module only (``scaletrain.jobs.submit``), so a fourth spelling is a decision this test names.
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
from scaletrain.envs.check import CheckResult
from scaletrain.plan import planner
from scaletrain.plan.request import JobRequest

SRC = Path(scaletrain.__file__).parent
# what differs between the doors by design: the argv in the provenance header, and where a
# submitted job runs and writes (plan leaves --chdir to the user; submit places it in its run folder,
# with the script's path made absolute)
_OWN_TO_EACH_DOOR = ("command", "chdir", "files_dir", "log", "script")


@pytest.fixture
def login_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine as a cluster's login node: a fake sbatch on PATH, a slurm.conf, a program."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=standin\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)
    # the job's Python is not asked here (test_submit_path.py does that): it is not what is compared
    monkeypatch.setattr("scaletrain.envs.check.check_job_python", lambda plan, **kw: CheckResult())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import numpy\nimport torch\n")
    return tmp_path


def _watch(monkeypatch: pytest.MonkeyPatch) -> list[JobRequest]:
    """The requests ``make_plan`` settles, in order (every door imports it when it runs)."""
    seen: list[JobRequest] = []
    real = planner.make_plan

    def recording(request: JobRequest, profile: Any, **kw: Any) -> Any:
        plan = real(request, profile, **kw)
        seen.append(plan.settled.request)
        return plan

    monkeypatch.setattr(planner, "make_plan", recording)
    return seen


def _settled(request: JobRequest) -> JobRequest:
    own = {"command": (), "script": "train.py"}
    return dataclasses.replace(request, **{name: own.get(name) for name in _OWN_TO_EACH_DOOR})


def _profile(where: Path) -> Path:
    """A profile file whose name differs from the cluster it describes (both doors must agree on it)."""
    path = where / "my-cluster.toml"
    path.write_text('name = "standin"\ngpus_per_node = 2\ncores_per_node = 8\nmem_per_node_gb = 64\n'
                    'scratch_var = "$TMPDIR"\nscratch_max_gb = 10\naccount_required = false\n[partitions.p]\ndefault = true\n')
    return path


def _finished_venv(where: Path) -> Path:
    (where / "bin").mkdir(parents=True)
    (where / "bin" / "python").write_text("")
    return where


CASES = {
    # cluster by name, the account from $SBATCH_ACCOUNT, a folder to stage (measured), a venv
    "named": lambda tmp: ({"SBATCH_ACCOUNT": "project_77"},
                          ["--cluster", "roihu", "--gpus", "4", "--stage-data", "data", "--venv", "venv"],
                          {"cluster": "roihu", "gpus": 4, "stage_data": "data", "venv": "venv"}),
    # a profile file named otherwise than its cluster; no venv: the running environment is given
    "profile file": lambda tmp: ({}, ["--profile", str(_profile(tmp)), "--gpus", "2", "--account", "p1",
                                      "--stage-data", str(tmp / "data")],
                                 {"cluster": str(_profile(tmp)), "gpus": 2, "account": "p1",
                                  "stage_data": str(tmp / "data")}),
    # a data path from home (~), a time and a launcher: values handed through, the path made absolute
    "home path": lambda tmp: ({"HOME": str(tmp), "SLURM_ACCOUNT": "from_slurm"},
                              ["--cluster", "roihu", "--nodes", "1", "--launcher", "torchrun", "--time", "02:00:00",
                               "--stage-data", "~/data"],
                              {"cluster": "roihu", "nodes": 1, "launcher": "torchrun", "time": "02:00:00",
                               "stage_data": "~/data"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_and_the_api_plan_the_same_request(capsys: pytest.CaptureFixture[str], login_node: Path,
                                                   monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    data = login_node / "data"
    data.mkdir()
    (data / "shard-0").write_bytes(b"x" * 300_000)      # measured: 300,000 bytes, on every door
    _finished_venv(login_node / "venv")
    environ, flags, keywords = CASES[case](login_node)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    seen = _watch(monkeypatch)

    code, _, err = run_cli(capsys, "plan", *flags, "--", "train.py")
    assert code == 0, err
    code, _, err = run_cli(capsys, "submit", "--dry-run", "--run-dir", str(login_node / "run-cli"), *flags,
                           "--", "train.py")
    assert code == 0, err
    job = scaletrain.submit(program=["train.py"], run_dir=login_node / "run-api", **keywords)
    assert job.job_id == "4242"

    # one plan each: plan; submit (CLI and API), in the run folder chosen before planning
    assert len(seen) == 3
    cli_plan, cli_submit, api_submit = seen
    assert _settled(cli_plan) == _settled(cli_submit) == _settled(api_submit)
    assert cli_submit.script == api_submit.script == str(login_node / "train.py")   # made absolute in both
    # and what was settled is what this machine says: measured, resolved, found
    settled = cli_plan
    assert settled.cluster in ("roihu", "standin")
    assert settled.stage_data == str(data) and settled.stage_data_gb == pytest.approx(300_000 / 1024 ** 3)
    assert settled.program_imports == ("numpy", "torch")
    assert settled.account == {"named": "project_77", "profile file": "p1", "home path": "from_slurm"}[case]
    if case == "named":
        assert settled.venv == str(login_node / "venv") and settled.env_origin is None
    else:   # nothing named: the environment running scaletrain, as submitit does
        assert settled.env_origin is not None


# -- one module runs the sequence -----------------------------------------------------------------

# each step of the sequence, and the modules that call it
SEQUENCE = {
    "found_here": {"jobs/submit.py"},
    "tree_size_gb": {"jobs/submit.py"},
    "program_imports": {"jobs/submit.py"},
    "account_or_env": {"jobs/submit.py",
                       "cli/bench.py",          # bench scaling --nodes: its own worker jobs, not a user's program
                       "cli/port.py"},          # port: the account of a script written for another cluster
    "make_plan": {"jobs/submit.py",             # bench's worker jobs too (plan_job: the running environment)
                  "port/translate.py"},         # a translation, settled for the target cluster, not here
}


def _callers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {name: set() for name in SEQUENCE}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in found:
                    found[name].add(path.relative_to(SRC).as_posix())
    return found


def test_one_module_runs_the_sequence_from_request_to_plan() -> None:
    assert _callers() == SEQUENCE


def test_bench_scalings_worker_jobs_get_the_environment_running_scaletrain(login_node: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench scaling --nodes`` submits its own worker jobs: on a login node they run in the
    environment running scaletrain, as a submitted program does (they import scaletrain)."""
    from scaletrain.bench import scaling_slurm
    from scaletrain.bench.scaling import ScalingRequest
    from scaletrain.clusters.profile import load_profile

    venv = _finished_venv(login_node / "st-venv")
    monkeypatch.setattr(sys, "prefix", str(venv))     # scaletrain runs from that venv
    slurm = scaling_slurm.SlurmScaling(cluster="roihu", nodes=(1, 2), account="project_1", out_dir=login_node)
    plan = scaling_slurm.plan_size(ScalingRequest(), slurm, load_profile("roihu"), 2, login_node / "job")
    assert plan.settled.request.venv == str(venv) and plan.settled.request.env_origin
    from scaletrain.jobs.submit import plan_job

    program = plan_job(JobRequest(cluster="roihu", script="train.py", gpus=4, account="project_1"))
    assert program.settled.request.venv == plan.settled.request.venv   # the same rule as a program's job
