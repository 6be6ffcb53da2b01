"""``port`` keeps the script's meaning: here-documents, ``$((...))`` arithmetic, a bare ``python``,
its own output linted, and sizes within the GPU bound."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import run_cli
from port_examples import ALLIANCE_DDP

from scaletrain.clusters.profile import load_profile
from scaletrain.port.heredoc import heredoc_line
from scaletrain.port.recover import recover
from scaletrain.port.translate import check_ported, port
from scaletrain.plan.render import render_script

BASH = shutil.which("bash")

def _port(text: str, target: str = "narval"):
    old = recover(text, "old.sh")
    ported = port(old, load_profile(target), None, script_path="old.sh", account="def-someone")
    return ported, render_script(ported.plan)


@pytest.mark.skipif(BASH is None, reason="bash not installed")
def test_alliance_ddp_ports_to_a_script_bash_and_lint_accept() -> None:
    ported, script = _port(ALLIANCE_DDP)
    assert subprocess.run([BASH, "-n"], input=script, text=True, capture_output=True).returncode == 0
    check_ported(script, ported.plan)            # no lint error
    launch = script.strip().splitlines()[-1]
    assert '"$((SLURM_NTASKS_PER_NODE * SLURM_JOB_NUM_NODES))"' in launch    # evaluated in the job
    assert "<<" not in script                     # no here-document left open to swallow the rest
    assert """printf '%s\\n' "nodes: $SLURM_JOB_NUM_NODES \\"from the here-document\\"" | cat > run.cfg""" in script
    # the venv the old script built on every node: its packages are the new job venv's (issue 38)
    changes = "\n".join(ported.changes)
    assert "line 10: srun -N $SLURM_NNODES" in changes and "(installs torchvision)" in changes
    assert "install --no-index --quiet torch torchvision'" in script


@pytest.mark.skipif(BASH is None, reason="bash not installed")
@pytest.mark.parametrize("op, body", [
    ("<< EOF", 'lr: 0.1\njob: $JOB "quoted" \\$HOME \\\\ back\nsub: $(echo hi) `echo tick`\n\ntab\there \\"x\\"'),
    ("<<'EOF'", 'literal $JOB `y` "q" \\n\n'),
    ("<<-EOF", "\tindented $JOB\n\t\tmore"),
    ('<< "EOF"', "quoted delimiter $JOB"),
])
def test_a_here_document_becomes_one_line_that_writes_the_same_text(tmp_path: Path, op: str, body: str) -> None:
    original = f"cat > out.txt {op}\n{body}\nEOF\n"
    if op == "<<-EOF":
        original = original.replace("\nEOF\n", "\n\tEOF\n")
    old = recover(f"#!/bin/bash\n#SBATCH --gres=gpu:1\n{original}srun python t.py\n")
    (line,) = [ln.text for ln in old.setup]
    assert "\n" not in line
    for name, code in (("a", original), ("b", line + "\n")):
        (tmp_path / name).mkdir()
        subprocess.run([BASH, "-c", code], cwd=tmp_path / name, check=True, env={**os.environ, "JOB": "77"},
                       timeout=30)
    assert (tmp_path / "a" / "out.txt").read_bytes() == (tmp_path / "b" / "out.txt").read_bytes()


def test_a_here_document_that_cannot_be_one_line_is_listed() -> None:
    assert heredoc_line("cat << EOF", "a \\", quoted=False) is None      # a continued line
    old = recover("#!/bin/bash\n#SBATCH --gres=gpu:1\ncat << A << B\nx\nA\ny\nB\nsrun python t.py\n")
    assert not old.setup and "cannot be written as one line" in old.lost[0].why


def test_a_bare_python_line_is_a_one_gpu_job() -> None:
    ported, script = _port("#!/bin/bash\n#SBATCH --gres=gpu:1\n#SBATCH --time=01:00:00\n"
                           "#SBATCH --account=def-someone\nmodule load python\npython prog.py --epochs 3\n")
    plan = ported.plan
    assert (plan.resources.gpus, plan.resources.world_size, plan.resources.nodes) == (1, 1, 1)
    assert script.strip().endswith("prog.py --epochs 3")
    ported, _ = _port("#!/bin/bash\n#SBATCH --account=def-someone\npython prog.py\n")
    assert ported.plan.resources.gpus == 1


def test_port_refuses_when_its_own_output_fails_lint(capsys, tmp_path: Path) -> None:
    old = tmp_path / "old.sh"
    old.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\n#SBATCH --account=def-someone\n"
                   "[ -f data.tar ] || (echo 'no data'; exit 1)\nsrun python prog.py\n")
    out = tmp_path / "new.sh"
    code, stdout, err = run_cli(capsys, "port", str(old), "--cluster", "narval", "-o", str(out))
    assert code == 2 and "ported script would fail lint" in err and "exits only the subshell" in err
    assert not out.exists() and stdout == ""


def test_arithmetic_on_per_task_values_is_refused_with_the_fix(capsys, tmp_path: Path) -> None:
    old = tmp_path / "old.sh"
    old.write_text("#!/bin/bash\n#SBATCH --gres=gpu:2\n#SBATCH --ntasks-per-node=2\n#SBATCH --account=def-x\n"
                   "srun python prog.py --rank $((SLURM_PROCID + 0))\n")
    code, _, err = run_cli(capsys, "port", str(old), "--cluster", "narval")
    assert code == 2 and "$SLURM_PROCID" in err and "os.environ" in err


def test_expand_args_arithmetic_expands_and_nothing_else_runs(capsys) -> None:
    code, out, err = run_cli(capsys, "plan", "--cluster", "narval", "--gpus", "1", "--account", "def-x",
                             "--expand-args", "--", "t.py", "--n", "$((SLURM_NNODES * 4))", "$(( $(id) ))",
                             "$((a[$(id)]))")
    assert code == 0, err
    assert '"$((SLURM_NNODES * 4))" "\\$(( \\$(id) ))" "\\$((a[\\$(id)]))"' in out


def test_a_ported_size_beyond_the_gpu_bound_is_refused(capsys, tmp_path: Path) -> None:
    old = tmp_path / "old.sh"
    old.write_text("#!/bin/bash\n#SBATCH --nodes=250000000000000000\n#SBATCH --gres=gpu:4\n"
                   "#SBATCH --account=def-x\nsrun python prog.py\n")
    code, _, err = run_cli(capsys, "port", str(old), "--cluster", "narval")
    assert code == 2 and "--nodes" in err and "100,000" in err and "Traceback" not in err
    old.write_text("#!/bin/bash\n#SBATCH --nodes=30000\n#SBATCH --gres=gpu:4\n#SBATCH --account=def-x\n"
                   "srun python prog.py\n")
    code, _, err = run_cli(capsys, "port", str(old), "--cluster", "narval")
    assert code == 2 and "more than 100,000 GPUs" in err
