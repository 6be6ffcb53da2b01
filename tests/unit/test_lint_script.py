"""The batch-script parser: #SBATCH options, commands, quoting contexts, heredocs, invocations."""

from __future__ import annotations

import pytest

from scaletrain.lint.findings import LintContext
from scaletrain.lint.invocation import classify
from scaletrain.lint.job import parse_memory_mb, parse_time_s, read_request
from scaletrain.lint.script import interpreter, parse_sbatch_line, parse_script
from scaletrain.lint.shell import split_commands


def test_sbatch_line_forms_and_trailing_comment() -> None:
    opts = parse_sbatch_line("#SBATCH --gres=gpu:2          # Request 2 GPU", 3)
    assert [(o.name, o.value, o.line) for o in opts] == [("gres", "gpu:2", 3)]
    assert [(o.name, o.value) for o in parse_sbatch_line("#SBATCH --nodes 1", 1)] == [("nodes", "1")]
    assert [(o.name, o.value) for o in parse_sbatch_line("#SBATCH -N2 -n 8 -p gpu", 1)] == [
        ("nodes", "2"), ("ntasks", "8"), ("partition", "gpu")]
    assert parse_sbatch_line("#SBATCH --tasks-per-node=2", 1)[0].name == "ntasks-per-node"


def test_header_stops_at_first_command_and_last_option_wins() -> None:
    script = parse_script("#!/bin/bash\n#SBATCH --time=1:00\n\n# note\n#SBATCH --time=2:00\necho hi\n"
                          "#SBATCH --mem=1G\n")
    assert script.header_end == 6
    assert script.option("time").value == "2:00"    # type: ignore[union-attr]
    assert script.option("mem") is None


@pytest.mark.parametrize("text,seconds", [
    ("1:00:00", 3600), ("0-03:00", 3 * 3600), ("0:05:00", 300), ("30", 1800), ("2-00:00:00", 172800),
    ("1-12", 36 * 3600), ("10:30", 630), ("junk", None)])
def test_time_formats(text: str, seconds: int | None) -> None:
    assert parse_time_s(text) == seconds


@pytest.mark.parametrize("text,mb", [("64G", 65536.0), ("32000M", 32000.0), ("500", 500.0), ("0", 0.0),
                                     ("1T", 1048576.0), ("8GB", 8192.0), ("lots", None)])
def test_memory_formats(text: str, mb: float | None) -> None:
    assert parse_memory_mb(text) == mb


def test_gpu_requests_fold_to_per_node() -> None:
    def gpn(*lines: str) -> int | None:
        return read_request(parse_script("#!/bin/bash\n" + "\n".join(lines) + "\n")).gpus_per_node
    assert gpn("#SBATCH --gres=gpu:v100:4,nvme:100") == 4
    assert gpn("#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-task=1") == 8
    assert gpn("#SBATCH --nodes=2", "#SBATCH --gpus=8") == 4
    assert gpn("#SBATCH --gpus-per-node=mi250:8") == 8
    assert gpn("#SBATCH --nodes=2") is None


def test_continuations_and_lines() -> None:
    cmds = split_commands("module load x\nsrun python3 -m torch.distributed.run \\\n    --nnodes=2 \\\n"
                          "    --nproc_per_node=4 \\\n    train.py --lr 0.1; echo done\n")
    assert [c.line for c in cmds] == [1, 2, 5]
    inv = classify(cmds[1])
    assert inv.srun is not None and inv.kind == "torchrun"
    assert inv.launcher_opts["nproc_per_node"] == "4"
    assert inv.launcher_words["nproc_per_node"].line == 4
    assert [w.value for w in inv.args] == ["--lr", "0.1"]


def test_quote_contexts_of_expansions() -> None:
    (cmd,) = split_commands("""srun x "a $SLURM_PROCID" 'b $SLURM_JOB_ID' \\$SLURM_NODEID "\\$SLURM_LOCALID" $HOME""")
    quotes = {e.name: e.quote for w in cmd.words for e in w.expansions}
    assert quotes == {"SLURM_PROCID": "double", "SLURM_JOB_ID": "single", "SLURM_NODEID": "escaped",
                      "SLURM_LOCALID": "escaped", "HOME": "bare"}
    assert cmd.words[2].value == "a $SLURM_PROCID"
    assert cmd.words[3].value == "b $SLURM_JOB_ID"


def test_multiline_double_quoted_assignment() -> None:
    script = parse_script('#!/bin/bash\nRUN="accelerate launch \\\n  --machine_rank=\\$SLURM_NODEID \\\n'
                          '  --ip=$IP x.py"\nsrun bash -c "$RUN"\n')
    ctx = LintContext(script=script)
    word, _ = ctx.variables["RUN"][0]
    assert {e.name: (e.quote, e.line) for e in word.expansions} == {
        "SLURM_NODEID": ("escaped", 3), "IP": ("double", 4)}
    inner = [s for s in ctx.steps if s.via_shell]
    assert len(inner) == 1 and inner[0].invocation.kind == "accelerate" and inner[0].under_srun
    assert inner[0].invocation.launcher_opts["machine_rank"] == "$SLURM_NODEID"


def test_heredoc_body_is_not_commands() -> None:
    script = parse_script("#!/bin/bash\nsrun -N 2 -n 2 bash << EOF\npython setup.py\necho $SLURM_NODEID\nEOF\n"
                          "srun python train.py\n")
    assert [c.line for c in script.commands] == [2, 6]
    (hd,) = script.commands[0].heredocs
    assert not hd.quoted and hd.line == 3
    assert [(e.name, e.line) for e in hd.expansions] == [("SLURM_NODEID", 4)]
    quoted = parse_script("#!/bin/bash\ncat <<'EOF' > x\n$SLURM_NODEID\nEOF\n")
    assert quoted.commands[0].heredocs[0].quoted and not quoted.commands[0].heredocs[0].expansions


@pytest.mark.parametrize("line,kind,program", [
    ("srun python3 myprog.py --epochs 1", "python", "python3"),
    ("time srun --cpus-per-task=$SLURM_CPUS_PER_TASK python x.py", "python", "python"),
    ("srun singularity_wrapper exec deepspeed myprog.py --deepspeed", "deepspeed", "deepspeed"),
    ("srun apptainer exec --nv -B /scratch img.sif torchrun --standalone x.py", "torchrun", "torchrun"),
    ("srun accelerate launch --num_processes=4 x.py", "accelerate", "accelerate"),
    ("mpirun -np 8 python x.py", "python", "python"),
    ("python -m pip install torch", "other", "python"),
    ("srun bash -c 'echo hi'", "shell", "bash"),
    ("module load pytorch", "other", "module"),
])
def test_classify(line: str, kind: str, program: str) -> None:
    inv = classify(split_commands(line)[0])
    assert (inv.kind, inv.program) == (kind, program)


@pytest.mark.parametrize("shebang,name", [("/bin/bash", "bash"), ("/bin/bash -x", "bash"),
                                          ("/usr/bin/env -S bash -e", "bash"), ("/usr/bin/env python3", "python3"),
                                          ("/bin/sh", "sh"), ("", "")])
def test_interpreter(shebang: str, name: str) -> None:
    assert interpreter(shebang) == name


def test_public_api_is_lazy_and_complete() -> None:
    import scaletrain.lint as lint
    result = lint.lint_text("#!/bin/bash\n#SBATCH --time=1\nsrun python x.py\n")
    assert isinstance(result, lint.LintResult) and result.findings == []
    assert "bash-syntax" in lint.RULES
