"""The centres' partition rules, frameworks and local-disk limits, as golden plans (issue 28, items 2, 3, 6).

Each CASE is a plan request on a live profile; its rendered script and summary (or its refusal) are
stored in ``golden_plans/CASE.txt`` and compared byte for byte. The facts each case rests on are also
asserted directly below, with the page they come from, so a regenerated golden file cannot hide a
wrong partition or limit. Regenerate after a deliberate change with::

    SCALETRAIN_REGEN_GOLDEN=1 PYTHONPATH=src python3 -m pytest tests/unit/test_partition_rules.py

Pages (checked 2026-11-26): CSC docs/computing/running/batch-job-partitions.md (Roihu: "`gpumedium`
| G | 36 hours | 1 - 4 | 1 | 4 per job", "`gpularge` | G | 36 hours | 1 - 10 | 4 | 4 per node | ... |
[scalability test]", $TMPDIR "G (GPU nodes) | 150 GiB" per user); CSC docs/apps/tensorflow.md
(Roihu `python-tensorflow`, LUMI `tensorflow/2.16` "Default on LUMI"); Alliance wiki Trillium
Quickstart ("default: 5 nodes ... with allocation: 25 nodes", def- / rrg- accounts, CPU jobs from the
CPU login nodes) and Trillium ("Trillium nodes have no local storage"); LUMI docs partitions.md
(small: LUMI-C, 4 nodes, 3 days).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain import __version__
from scaletrain.clusters.check import compare
from scaletrain.clusters.profile import _shipped_dir, load_profile
from scaletrain.clusters.resources import ERROR, WARNING, Resources
from scaletrain.clusters.schema import build_profile
from scaletrain.envs.create import known_packages, parse_with
from scaletrain.errors import PlanError, ProfileError, UsageError
from scaletrain.lint.engine import lint_text
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import render_script, setup_lines
from scaletrain.plan.request import JobRequest
from scaletrain.plan.summary import notes, render_summary

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GOLDEN = Path(__file__).parent / "golden_plans"

# case name -> (cluster, request fields)
CASES: dict[str, tuple[str, dict]] = {
    # Roihu: 4 GPUs fit gpumedium; 8 and 12 do not (4 per job) and go to gpularge; 44 (11 nodes) and
    # 12 nodes fit no partition (gpularge takes 1-10 nodes)
    "roihu-4gpus": ("roihu", {"gpus": 4}),
    "roihu-8gpus": ("roihu", {"gpus": 8}),
    "roihu-12gpus": ("roihu", {"gpus": 12}),
    "roihu-44gpus": ("roihu", {"gpus": 44}),
    "roihu-12nodes": ("roihu", {"nodes": 12}),
    # Trillium: 8 nodes need an allocation: refused on def-, planned on rrg-
    "trillium-8nodes-def": ("trillium", {"nodes": 8, "account": "def-someprof"}),
    "trillium-8nodes-rrg": ("trillium", {"nodes": 8, "account": "rrg-someprof"}),
    "trillium-container": ("trillium", {"nodes": 1, "account": "def-someprof", "container": "/scratch/u/pt.sif"}),
    "trillium-cpus": ("trillium", {"cpus": 192, "account": "def-someprof"}),
    # the frameworks where the stacks have them
    "roihu-tensorflow": ("roihu", {"nodes": 2, "launcher": "tensorflow"}),
    "lumi-tensorflow": ("lumi", {"nodes": 2, "launcher": "tensorflow"}),
    "fir-tensorflow": ("fir", {"nodes": 2, "launcher": "tensorflow", "account": "def-someprof"}),
    "trillium-tensorflow": ("trillium", {"gpus": 1, "launcher": "tensorflow", "account": "rrg-someprof"}),
    "lumi-mpi": ("lumi", {"nodes": 2, "launcher": "mpi"}),
    "nibi-mpi": ("nibi", {"nodes": 1, "launcher": "mpi", "account": "def-someprof"}),
    # ZeRO offload to NVMe against Roihu's 150 GiB per user of $TMPDIR
    "roihu-nvme-1node": ("roihu", {"nodes": 1, "launcher": "deepspeed", "deepspeed_config": "nvme",
                                   "params": 13e9}),
    "roihu-nvme-2nodes": ("roihu", {"nodes": 2, "launcher": "deepspeed", "deepspeed_config": "nvme",
                                    "params": 13e9}),
    # LUMI-C's small partition takes CPU-only jobs
    "lumi-cpus": ("lumi", {"cpus": 16}),
}


def _plan(cluster: str, fields: dict):
    kw = {"account": "project_2001234", "script": "train.py", "script_args": ("--epochs", "3"),
          "command": ("scaletrain", "plan", "--cluster", cluster), **fields}
    return make_plan(JobRequest(cluster=cluster, **kw), load_profile(cluster))


def _text(cluster: str, fields: dict) -> str:
    try:
        plan = _plan(cluster, fields)
    except (PlanError, UsageError) as exc:
        return f"refused (exit {exc.exit_code}): {exc.message}\nHINT: {exc.hint}\n"
    text = render_script(plan) + "\n----\n" + render_summary(plan) + "\n"
    return text.replace(f"scaletrain {__version__}", "scaletrain VERSION")


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_plan(case: str) -> None:
    cluster, fields = CASES[case]
    got = _text(cluster, fields)
    path = GOLDEN / f"{case}.txt"
    if os.environ.get("SCALETRAIN_REGEN_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert got == path.read_text(encoding="utf-8"), f"{case}: the plan differs from {path.name}"
    if not got.startswith("refused") and shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=got.split("\n----\n")[0], text=True, check=True)


def _sb(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^#SBATCH --([a-z-]+)=(\S+)", text, re.M))


@pytest.mark.parametrize("gpus, partition, nodes", [(4, "gpumedium", 1), (8, "gpularge", 2), (12, "gpularge", 3)])
def test_roihu_partition_takes_the_job(gpus: int, partition: str, nodes: int) -> None:
    plan = _plan("roihu", {"gpus": gpus})
    assert (plan.resources.partition, plan.resources.nodes, plan.resources.gpus_per_node) == (partition, nodes, 4)
    access = [n for n in notes(plan) if "scalability test" in n]
    assert bool(access) == (partition == "gpularge")     # the access condition is said in the summary
    # lint of the plan's own script finds nothing, with the same limits
    assert [f.rule for f in lint_text(render_script(plan), profile=load_profile("roihu")).findings] == []


@pytest.mark.parametrize("fields", [{"gpus": 44}, {"nodes": 12}, {"nodes": 11}])
def test_roihu_refuses_what_no_partition_takes(fields: dict) -> None:
    with pytest.raises(PlanError) as err:
        _plan("roihu", fields)
    assert "which allows at most 10" in err.value.message and "at most 40 GPUs" in err.value.hint


def test_roihu_small_multi_node_jobs_stay_in_gpumedium() -> None:
    # 2 nodes x 1 GPU is 2 GPUs a job: gpumedium takes it, gpularge (at least 4 GPUs) would not
    plan = _plan("roihu", {"nodes": 2, "gpus_per_node": 1})
    assert plan.resources.partition == "gpumedium"


def test_lint_knows_the_same_roihu_limits() -> None:
    roihu = load_profile("roihu")
    script = ("#!/bin/bash\n#SBATCH --account=project_2001234\n#SBATCH --partition={part}\n#SBATCH --nodes={n}\n"
              "#SBATCH --ntasks-per-node=4\n#SBATCH --cpus-per-task=72\n#SBATCH --gres=gpu:gh200:{g}\n"
              "#SBATCH --time=01:00:00\n\nmodule load python-pytorch\nsrun python3 train.py\n")
    found = lint_text(script.format(part="gpumedium", n=2, g=4), profile=roihu).findings
    limit = [f for f in found if f.rule == "partition-limit"]
    assert limit and limit[0].severity == "error" and "8 GPUs in partition 'gpumedium'" in limit[0].message
    assert "gpularge" in limit[0].hint
    found = lint_text(script.format(part="gpularge", n=12, g=4), profile=roihu).findings
    assert any("12 nodes in partition 'gpularge', which allows at most 10" in f.message for f in found)
    found = lint_text(script.format(part="gpularge", n=1, g=1).replace("ntasks-per-node=4", "ntasks-per-node=1"),
                      profile=roihu).findings
    assert any("which takes at least 4" in f.message for f in found)
    assert not [f for f in lint_text(script.format(part="gpularge", n=2, g=4), profile=roihu).findings
                if f.severity == "error"]


@pytest.mark.parametrize("account, severity", [("def-prof", ERROR), ("rrg-prof", None), ("rpp-prof", None),
                                               (None, WARNING)])
def test_trillium_node_limit_depends_on_the_account(account: str | None, severity: str | None) -> None:
    trillium = load_profile("trillium")
    res = Resources(nodes=8, gpus_per_node=4, tasks_per_node=4, cpus_per_task=24, seconds=3600,
                    partition="default", account=account)
    found = [(v.severity, v.message) for v in res.check(trillium) if v.rule == "partition-limit"]
    assert [s for s, _ in found] == ([severity] if severity else [])
    if found:
        assert "at most 5" in found[0][1] and "(25 with one)" in found[0][1]
    # 5 nodes are within the default limit on any account; 26 beyond the allocation's 25 on every one
    five = Resources(nodes=5, gpus_per_node=4, tasks_per_node=4, cpus_per_task=24, partition="default",
                     account=account)
    assert not [v for v in five.check(trillium) if v.rule == "partition-limit"]
    many = Resources(nodes=26, gpus_per_node=4, tasks_per_node=4, cpus_per_task=24, partition="default",
                     account=account)
    assert any(v.severity == ERROR and "at most 25" in v.message for v in many.check(trillium))


def test_trillium_lint_refuses_eight_nodes_on_a_def_account() -> None:
    script = render_script(_plan("trillium", {"nodes": 8, "account": "rrg-prof"}))
    trillium = load_profile("trillium")
    assert not [f for f in lint_text(script, profile=trillium).findings if f.severity == "error"]
    found = lint_text(script.replace("--account=rrg-prof", "--account=def-prof"), profile=trillium).findings
    assert any(f.rule == "partition-limit" and f.severity == "error" and "at most 5" in f.message for f in found)


def test_trillium_local_disk_is_memory() -> None:
    trillium = load_profile("trillium")
    assert trillium.scratch_in_memory and trillium.scratch_var == "$SLURM_TMPDIR"
    with pytest.raises(PlanError, match="their local /tmp is memory"):
        _plan("trillium", {"nodes": 1, "account": "rrg-p", "launcher": "deepspeed", "deepspeed_config": "nvme"})
    with pytest.raises(PlanError, match="is memory on trillium"):   # 3 x 250 GB unpacked > the node's 749 GB
        _plan("trillium", {"nodes": 1, "account": "rrg-p", "stage_data": "/scratch/d.tar.gz", "stage_data_gb": 250.0})
    plan = _plan("trillium", {"nodes": 1, "account": "rrg-p"})
    assert any("memory on trillium" in n and "venv" in n for n in notes(plan))
    assert not any("venv" in n for n in notes(_plan("trillium", {"nodes": 1, "account": "rrg-p", "venv": "/s/v"})))


def test_trillium_container_loads_apptainer_and_binds_like_the_other_alliance_clusters() -> None:
    plan = _plan("trillium", {"nodes": 1, "account": "rrg-p", "container": "/scratch/u/pt.sif"})
    fir = _plan("fir", {"nodes": 1, "account": "def-p", "container": "/scratch/u/pt.sif"})
    assert "module load apptainer" in setup_lines(plan) and setup_lines(plan) == setup_lines(fir)
    image = "apptainer exec --nv -B /project -B /scratch /scratch/u/pt.sif "
    assert plan.software.container == fir.software.container == image


def test_nvme_offload_against_roihus_per_user_quota() -> None:
    # 13e9 parameters: one replica of Adam's model state is 16 bytes a parameter = 193.7 GiB (the
    # summary's table), above the 150 GiB of $TMPDIR a user has on a GPU node; two nodes share it
    with pytest.raises(PlanError) as err:
        _plan("roihu", {"nodes": 1, "launcher": "deepspeed", "deepspeed_config": "nvme", "params": 13e9})
    assert "about 194 GiB of local disk per node" in err.value.message and "150 GiB per user" in err.value.message
    assert err.value.hint.startswith("use 2 nodes or more")
    plan = _plan("roihu", {"nodes": 2, "launcher": "deepspeed", "deepspeed_config": "nvme", "params": 13e9})
    assert plan.resources.partition == "gpularge" and plan.resources.disk_gb is None   # $TMPDIR needs no request
    one = _plan("roihu", {"nodes": 1, "launcher": "deepspeed", "deepspeed_config": "nvme", "params": 9e9})
    assert one.resources.nodes == 1


@pytest.mark.parametrize("cluster, setup", [
    ("roihu", ("module purge", "module load python-tensorflow")),
    ("lumi", ("module purge", "module use /appl/local/csc/modulefiles", "module load tensorflow/2.16")),
])
def test_tensorflow_gets_the_centres_module(cluster: str, setup: tuple[str, ...]) -> None:
    plan = _plan(cluster, {"nodes": 2, "launcher": "tensorflow"})
    assert setup_lines(plan) == setup and plan.software.container == "" and plan.settled.image is None


@pytest.mark.parametrize("cluster", ["fir", "nibi", "rorqual", "narval", "trillium"])
def test_alliance_tensorflow_comes_from_the_wheelhouse(cluster: str) -> None:
    plan = _plan(cluster, {"gpus": 1, "launcher": "tensorflow", "account": "rrg-p"})
    venv = [ln for ln in setup_lines(plan) if "pip" in ln]
    assert len(venv) == 1 and venv[0].endswith("install --no-index --quiet tensorflow'")
    # the job needs no scaletrain (TF_CONFIG comes from bash): the wheelhouse's venv is enough, and
    # the Alliance TensorFlow page's GPU job loads CUDA and cuDNN beside it
    assert not plan.software.warnings and "module load cuda cudnn" in setup_lines(plan)
    torch = _plan(cluster, {"gpus": 1, "account": "rrg-p"})
    assert [ln for ln in setup_lines(torch) if "pip" in ln][0].endswith("install --no-index --quiet torch'")
    assert parse_with("tensorflow,horovod", load_profile(cluster).wheels) == ("tensorflow", "horovod")


def test_env_create_with_a_framework_only_where_the_centre_has_it() -> None:
    # CSC has a TensorFlow module (the venv is made on it) but no Horovod; JSC no TensorFlow module
    assert parse_with("tensorflow", known_packages(load_profile("roihu"))) == ("tensorflow",)
    with pytest.raises(UsageError, match="not a launcher package"):
        parse_with("horovod", known_packages(load_profile("roihu")))
    with pytest.raises(UsageError, match="not a launcher package"):
        parse_with("tensorflow", known_packages(load_profile("jupiter")))
    with pytest.raises(UsageError, match="venv without lightning"):
        parse_with("tensorflow,lightning", known_packages(load_profile("narval")))
    assert parse_with("accelerate") == ("accelerate",)


@pytest.mark.parametrize("cluster, needle", [
    ("roihu", "CSC's modules on Roihu include no Horovod"),
    ("lumi", "neither the LUMI AI Factory image the job runs nor CSC's modules on LUMI include Horovod"),
    ("fir", "--with horovod"), ("nibi", "--with horovod"), ("rorqual", "--with horovod"),
    ("narval", "--with horovod"), ("trillium", "--with horovod"),
])
def test_horovod_note_names_the_real_reason(cluster: str, needle: str) -> None:
    plan = _plan(cluster, {"nodes": 1, "launcher": "mpi", "account": "rrg-p"})
    horovod = [n for n in notes(plan) if "Horovod" in n]
    assert len(horovod) == 1 and needle in horovod[0]


def test_lumi_cpu_only_jobs_go_to_lumi_c_small() -> None:
    plan = _plan("lumi", {"cpus": 16})
    r = plan.resources
    assert (r.partition, r.gpus, r.device, r.cpus_per_task) == ("small", 0, "cpu", 16)
    with pytest.raises(PlanError, match="a lumi node has 128"):
        _plan("lumi", {"cpus": 200})
    # GPU jobs never land in the CPU partition
    assert _plan("lumi", {"gpus": 1}).resources.partition == "small-g"


def test_clusters_check_compares_the_minimum_nodes() -> None:
    roihu = load_profile("roihu")
    nodes = "NodeName=g0001 Arch=aarch64 CPUEfctv=288 CPUTot=288 Gres=gpu:gh200:4 RealMemory=491520 " \
            "State=IDLE Partitions=gputest,gpumedium,gpularge,gpuinteractive"
    parts = "\n".join(f"PartitionName={n} Default=NO MaxNodes={m} MaxTime={t} MinNodes={lo} OverSubscribe=NO"
                      for n, m, t, lo in (("gpumedium", 4, "1-12:00:00", 0), ("gpularge", 10, "1-12:00:00", 2),
                                          ("gputest", 2, "00:15:00", 0), ("gpuinteractive", 1, "12:00:00", 0)))
    diffs = [d.line() for d in compare(roihu, nodes, parts)]
    assert diffs == ["partition gpularge minimum nodes: profile says 1, Slurm says 2"]


@pytest.mark.parametrize("changes, needle", [
    ({"wheels": {"tensorflow": "tensorflow; rm -rf /"}}, "trillium.toml: wheels must be"),
    ({"no_allocation_accounts": ["def- x"]}, "trillium.toml: no_allocation_accounts must be"),
    ({"cpu_jobs": "line one\nline two"}, "trillium.toml: cpu_jobs must be"),
    ({"partitions": {"p": {"min_gpus": -1}}}, "partitions.p.min_gpus"),
    ({"partitions": {"p": {"cores_per_node": 0}}}, "partitions.p.cores_per_node"),
    ({"partitions": {"p": {"access": "a\nb"}}}, "partitions.p.access"),
    ({"partitions": {"p": {"max_nodes_no_allocation": "five"}}}, "max_nodes_no_allocation"),
])
def test_the_new_profile_fields_are_checked(changes: dict, needle: str) -> None:
    data = tomllib.loads((_shipped_dir() / "trillium.toml").read_text())
    data.update(changes)
    with pytest.raises(ProfileError, match=re.escape(needle)):
        build_profile(data, path="trillium.toml")
