"""A lint hint is given only where following it gives a working line: each test lints a script,
applies the fix its hint gives (the line it writes out, or the option it names), lints the result
again, and runs it under stub commands (``srun`` starting one process per task with that task's
SLURM_NODEID/SLURM_PROCID/SLURM_LOCALID; ``torchrun`` and ``python`` recording their arguments
and the variables they were started with). Also the rules' false alarms and silences of the same
round: a comment or an ``echo`` naming SLURM_LOCALID, an escaped ``\\"\\$SLURM_LOCALID\\"``,
``SRUN_CPUS_PER_TASK=7 srun``, a template's blank on a cluster, and ``port`` of a
``torch.distributed.launch`` line."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import run_cli

from scaletrain.clusters.profile import load_profile
from scaletrain.lint.engine import lint_text

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")

# srun: options as --opt=value or flags; one process per task, in turn, numbered as Slurm does
STUB_SRUN = """#!/bin/bash
while [ $# -gt 0 ] && [[ $1 == -* ]]; do shift; done
for ((node = 0; node < STUB_NODES; node++)); do
  for ((local = 0; local < STUB_TASKS_PER_NODE; local++)); do
    SLURM_NODEID=$node SLURM_LOCALID=$local SLURM_PROCID=$((node * STUB_TASKS_PER_NODE + local)) "$@" || exit
  done
done
"""
STUB_RECORD = """#!/bin/bash
printf '%s %s | CUDA_VISIBLE_DEVICES=%s SRUN_CPUS_PER_TASK=%s\\n' "$(basename "$0")" "$*" \
  "${CUDA_VISIBLE_DEVICES-}" "${SRUN_CPUS_PER_TASK-}" >> "$STUB_LOG"
"""
STUB_SCONTROL = """#!/bin/bash
for ((node = 1; node <= STUB_NODES; node++)); do echo "node$node"; done
"""
PROGRAM = "import torch\nmodel = torch.nn.Linear(2, 2).cuda()\n"   # picks no GPU of its own


@pytest.fixture
def stubs(tmp_path: Path):
    """Run a script under the stubs: returns the commands the tasks ran, in order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", STUB_SRUN), ("torchrun", STUB_RECORD), ("python", STUB_RECORD),
                       ("scontrol", STUB_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "train.py").write_text(PROGRAM)

    def run(text: str, *, nodes: int, tasks_per_node: int, cpus: int = 8) -> list[str]:
        (tmp_path / "job.sh").write_text(text)
        log = tmp_path / "log"
        log.unlink(missing_ok=True)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_LOG": str(log), "STUB_NODES": str(nodes),
               "STUB_TASKS_PER_NODE": str(tasks_per_node), "SLURM_JOB_ID": "77",
               "SLURM_JOB_NODELIST": f"node[1-{nodes}]", "SLURM_CPUS_PER_TASK": str(cpus),
               "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}  # the batch step's
        proc = subprocess.run([BASH, "job.sh"], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return log.read_text().splitlines()

    run.path = tmp_path / "job.sh"  # type: ignore[attr-defined]
    return run


def _lint(text: str, path: Path, cluster: str | None = None, **fields: object):
    profile = load_profile(cluster) if cluster else None
    if profile is not None and fields:
        profile = dataclasses.replace(profile, **fields)
    path.write_text(text)
    return lint_text(text, path=str(path), profile=profile).findings


def _one(findings, rule: str):
    found = [f for f in findings if f.rule == rule]
    assert len(found) == 1, findings
    return found[0]


def _written_line(hint: str) -> str:
    assert "write the line as: " in hint, hint
    return hint.split("write the line as: ", 1)[1].split(" (or ", 1)[0]


TWO_NODES = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=40
#SBATCH --gres=gpu:4
#SBATCH --time=1:00:00
NNODES=2
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
"""
BARE = ("srun torchrun --nnodes=$NNODES --nproc_per_node=4 --node_rank=$SLURM_NODEID "
        "--master_addr=$MASTER_ADDR --master_port=29500 train.py --epochs 3")


def test_the_early_expansion_fix_on_a_bare_srun_line_gives_each_node_its_rank(stubs):
    """The hint said to escape it "inside the double quotes": the line has none, and escaping
    there hands torchrun the text $SLURM_NODEID (shown below, under the same stubs)."""
    text = TWO_NODES + BARE + "\n"
    finding = _one(_lint(text, stubs.path), "early-expansion")
    fixed = text.replace(BARE, _written_line(finding.hint))
    assert not [f for f in _lint(fixed, stubs.path) if f.severity == "error"]
    ran = stubs(fixed, nodes=2, tasks_per_node=1)
    assert [re.search(r"--node_rank=(\S+)", line).group(1) for line in ran] == ["0", "1"], ran
    assert all("--nnodes=2 " in line and "--master_addr=node1 " in line and "train.py --epochs 3" in line
               for line in ran)
    escaped = text.replace("=$SLURM_NODEID", "=\\$SLURM_NODEID")   # the old hint, followed
    assert "early-expansion" not in {f.rule for f in _lint(escaped, stubs.path)}
    assert all("--node_rank=$SLURM_NODEID" in line for line in stubs(escaped, nodes=2, tasks_per_node=1))


def test_inside_bash_c_the_hint_still_says_to_escape_within_its_quotes(stubs):
    line = 'srun bash -c "torchrun --nnodes=2 --nproc_per_node=4 --node_rank=$SLURM_NODEID train.py"'
    finding = _one(_lint(TWO_NODES + line + "\n", stubs.path), "early-expansion")
    assert finding.hint == "escape it (\\$SLURM_NODEID) inside the double quotes"
    fixed = TWO_NODES + line.replace("=$SLURM", "=\\$SLURM") + "\n"
    assert "early-expansion" not in {f.rule for f in _lint(fixed, stubs.path)}
    assert [line.split("--node_rank=")[1].split()[0] for line in stubs(fixed, nodes=2, tasks_per_node=1)] \
        == ["0", "1"]


SHARED = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=8
#SBATCH --gres=gpu:2
#SBATCH --time=1:00:00
"""


@pytest.mark.parametrize("mention", ["# export CUDA_VISIBLE_DEVICES=$SLURM_LOCALID (each task its GPU)",
                                     'echo "each task uses CUDA_VISIBLE_DEVICES=$SLURM_LOCALID"'])
def test_a_comment_or_echo_naming_the_local_rank_does_not_silence_shared_gpus(stubs, mention):
    text = SHARED + mention + "\nsrun python train.py\n"
    finding = _one(_lint(text, stubs.path), "gpus-shared-by-tasks")
    fixed = text.replace("srun python train.py", _written_line(finding.hint))
    assert "gpus-shared-by-tasks" not in {f.rule for f in _lint(fixed, stubs.path)}
    ran = stubs(fixed, nodes=1, tasks_per_node=2)
    assert [line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for line in ran] == ["0", "1"], ran


def test_an_escaped_quoted_local_rank_in_bash_c_is_a_gpu_per_task(stubs):
    text = SHARED + 'srun bash -c "CUDA_VISIBLE_DEVICES=\\"\\$SLURM_LOCALID\\" python train.py"\n'
    assert "gpus-shared-by-tasks" not in {f.rule for f in _lint(text, stubs.path)}
    ran = stubs(text, nodes=1, tasks_per_node=2)
    assert [line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for line in ran] == ["0", "1"], ran


CPT = SHARED.replace("--ntasks-per-node=2", "--ntasks-per-node=1").replace("gpu:2", "gpu:1")


def test_srun_cpus_per_task_sees_the_variable_given_to_srun_alone(stubs):
    old_slurm = {"slurm_version": "23.02.7"}
    assert "srun-cpus-per-task" not in {f.rule for f in _lint(
        CPT + "SRUN_CPUS_PER_TASK=7 srun python train.py\n", stubs.path, "narval", **old_slurm)}
    text = CPT + "srun python train.py\n"
    finding = _one(_lint(text, stubs.path, "narval", **old_slurm), "srun-cpus-per-task")
    export = finding.hint.split(" before srun", 1)[0]
    assert export == "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"
    fixed = text.replace("srun python", f"{export}\nsrun python")
    assert "srun-cpus-per-task" not in {f.rule for f in _lint(fixed, stubs.path, "narval", **old_slurm)}
    assert stubs(fixed, nodes=1, tasks_per_node=1)[0].endswith("SRUN_CPUS_PER_TASK=8")


def test_a_blank_partition_is_the_placeholder_rules_alone(tmp_path):
    text = ("#!/bin/bash\n#SBATCH --account=<project>\n#SBATCH --partition=<partition>\n"
            "#SBATCH --gpus-per-node=<gpus>\n#SBATCH --time=00:15:00\nsrun python train.py\n")
    assert {f.rule for f in _lint(text, tmp_path / "job.sh", "lumi")} == {"placeholder"}


BOOSTER = """#!/bin/bash
#SBATCH --account=a
#SBATCH --partition=booster
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=12
#SBATCH --gres=gpu:4
#SBATCH --time=1:00:00
srun torchrun --standalone --nproc_per_node=4 train.py
"""


def test_one_task_for_a_launcher_keeps_the_cpus_of_the_tasks_it_replaces(stubs):
    finding = _one(_lint(BOOSTER, stubs.path, "juwels-booster"), "launcher-tasks")
    tasks, cpus = re.search(r"#SBATCH --ntasks-per-node=(\d+) and --cpus-per-task=(\d+)", finding.hint).groups()
    assert (tasks, cpus) == ("1", "48")
    half = BOOSTER.replace("--ntasks-per-node=4", f"--ntasks-per-node={tasks}")
    # the fix the hint gave before: one task keeps 12 cores for its 4 workers
    short = _one(_lint(half, stubs.path, "juwels-booster"), "launcher-cpus")
    assert "starts 4 workers in one task of 12 CPUs (3 each" in short.message
    assert short.hint == "#SBATCH --cpus-per-task=96"
    for cpus_given in (cpus, short.hint.rsplit("=", 1)[1]):
        fixed = half.replace("--cpus-per-task=12", f"--cpus-per-task={cpus_given}")
        rules = {f.rule for f in _lint(fixed, stubs.path, "juwels-booster")}
        assert not rules & {"launcher-tasks", "launcher-cpus", "cpu-limit"}, rules
        assert len(stubs(fixed, nodes=1, tasks_per_node=1)) == 1   # torchrun once per node


LAUNCH = """#!/bin/bash
#SBATCH --account=project_2001234
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=40
#SBATCH --gres=gpu:v100:4
#SBATCH --time=1:00:00
srun python -m torch.distributed.launch {flags}--nproc_per_node=4 train.py --epochs 3
"""


@pytest.mark.parametrize("flags, lost", [("", True), ("--use_env ", False), ("--use-env ", False)])
def test_port_of_torch_distributed_launch_names_the_local_rank_argument(capsys, tmp_path, flags, lost):
    """torch.distributed.launch passed --local-rank to the program; the torchrun line port
    writes does not: "not carried over: nothing" hid it."""
    old = tmp_path / "old.sh"
    old.write_text(LAUNCH.format(flags=flags))
    code, script, err = run_cli(capsys, "port", str(old), "--cluster", "roihu")
    assert code == 0, err
    assert ("--local-rank=N, which torch.distributed.launch passed to each process" in err) is lost
    assert ("not carried over: nothing" in err) is not lost
    assert "train.py --epochs 3" in script and "use_env" not in script and "use-env" not in script
