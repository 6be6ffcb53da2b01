"""Lint on the shapes of real centre scripts (issue 17 items 7, 8, 11; issue 22 items 5, 7).

False alarms that must stay quiet and misses that must be found, each written in our own words.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.lint.engine import lint_file, lint_text
from test_lint_rules import FULL_PUHTI, PUHTI, job


def _found(text: str, cluster: str | None = None) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in lint_text(text, profile=load_profile(cluster) if cluster else None).findings:
        out.setdefault(f.rule, set()).add(f.severity)
    return out


# --- false alarms -----------------------------------------------------------------------------

def test_fixed_port_on_a_partition_no_profile_knows_is_quiet() -> None:
    # JSC's dc-gpu hands out whole nodes; without a profile lint cannot say other jobs share them
    text = job("--account=p", "--partition=dc-gpu", "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4",
               "--time=1:00:00", body="export MASTER_PORT=12345\nsrun python x.py")
    assert "master-port" not in _found(text)
    assert "master-port" not in _found(text, "juwels-booster")     # a partition it does not list
    shared = job("--account=def-x", "--gres=gpu:a100:1", "--time=1:00:00",
                 body="export MASTER_PORT=12345\nsrun python x.py")
    assert _found(shared, "narval")["master-port"] == {"warning"}   # narval shares nodes


@pytest.mark.parametrize(("line", "program"), [
    ("kernprof -l train.py --epochs 2", "train.py"),
    ("kernprof -l -v -o out.lprof train.py", "train.py"),
    ("nsys profile -o report -t cuda,nvtx python train.py", "train.py"),
    ("nsys profile --stats=true python3 -u train.py", "train.py"),
    ("python -m cProfile -o prof.out train.py", "train.py"),
    ("srun python3 -m cProfile -s cumtime train.py", "train.py"),
])
def test_a_profiler_starting_the_program_is_a_launch(line: str, program: str) -> None:
    from scaletrain.lint.invocation import classify
    from scaletrain.lint.shell import split_commands

    text = job("--time=1:00:00", "--ntasks=1", "--gres=gpu:1", body=f"module load pytorch\n{line}")
    assert "no-launch" not in _found(text)
    (cmd,) = split_commands(line)
    inv = classify(cmd)
    assert inv.kind == "python" and inv.script is not None and inv.script.value == program


def test_profiler_without_srun_on_two_nodes_is_still_not_started_everywhere() -> None:
    text = job("--time=1:00:00", "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:1",
               body="nsys profile -o r python train.py")
    assert _found(text)["no-srun"] == {"error"}


@pytest.mark.parametrize("arg", ["--rdzv_id='$SLURM_JOB_ID'", "--rdzv-id '$SLURM_JOB_ID'"])
def test_single_quoted_rendezvous_id_is_a_warning(arg: str) -> None:
    text = job("--time=1:00:00", "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4",
               body=f"srun torchrun --nnodes=2 --nproc_per_node=4 {arg} --rdzv_backend=c10d "
                    "--rdzv_endpoint=$H:29400 train.py")
    assert _found(text)["single-quoted-var"] == {"warning"}
    other = job("--time=1:00:00", body="srun python train.py --out '$SLURM_JOB_ID'")
    assert _found(other)["single-quoted-var"] == {"error"}


# --- misses ----------------------------------------------------------------------------------

BF16 = [
    "srun accelerate launch --mixed_precision=bf16 x.py",
    "srun python train.py --precision bf16-mixed",
    "srun python train.py --bf16",
    "cat > ds.json <<'EOF'\n{\n  \"bf16\": {\n    \"enabled\": true\n  }\n}\nEOF\nsrun python x.py --deepspeed ds.json",
]


@pytest.mark.parametrize("body", BF16)
def test_bf16_on_v100_is_found(body: str) -> None:
    base = ("--account=p", "--partition=gpu", "--time=1:00:00", "--ntasks=1", "--gres=gpu:v100:1")
    assert _found(job(*base, body=body), "puhti")["bf16-unsupported"] == {"warning"}
    # the GPU type in the request is enough without a profile; an A100 is fine
    assert "bf16-unsupported" in _found(job(*base, body=body))
    a100 = job("--account=p", "--partition=gpusmall", "--time=1:00:00", "--ntasks=1",
               "--gres=gpu:a100:1", body=body)
    assert "bf16-unsupported" not in _found(a100, "mahti")


def test_bf16_in_the_program_beside_the_script(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text('import lightning as L\ntrainer = L.Trainer(precision="bf16-mixed")\n')
    script = tmp_path / "job.sh"
    script.write_text(job(*PUHTI, "--ntasks=1", "--gres=gpu:v100:1", body="srun python train.py"))
    result = lint_file(str(script), cluster="puhti")
    (f,) = [f for f in result.findings if f.rule == "bf16-unsupported"]
    assert f.line == 6 and "train.py" in f.message and "V100" in f.message or "v100" in f.message
    (tmp_path / "train.py").write_text('trainer = L.Trainer(precision="16-mixed")\n')
    assert "bf16-unsupported" not in {f.rule for f in lint_file(str(script), cluster="puhti").findings}


def test_gpu_partition_without_a_gpu_request() -> None:
    assert _found(job(*PUHTI, "--ntasks=1", body="srun python train.py"), "puhti")["gpu-not-requested"] == {"warning"}
    # without a profile a partition named gpu is still known for what it is
    assert "gpu-not-requested" in _found(job("--partition=gpu", "--time=1:00:00", body="srun python train.py"))
    # a CPU partition, or a job that runs no program, is left alone
    assert "gpu-not-requested" not in _found(job("--partition=small", "--time=1:00:00"))
    assert "gpu-not-requested" not in _found(job(*PUHTI, "--ntasks=1", body="echo hi"), "puhti")


@pytest.mark.parametrize("body", [
    'test -f data.tar || (echo "missing data"; exit 1)',
    '[ -d "$DATA" ] || ( echo "no $DATA" >&2 ; exit 2 )',
    'module load pytorch && (echo loaded; exit 0)',
])
def test_exit_inside_a_subshell_is_found(body: str) -> None:
    assert _found(job("--time=1:00:00", body=body + "\nsrun python x.py"))["subshell-exit"] == {"error"}


def test_braces_and_arithmetic_are_not_a_subshell_exit() -> None:
    for body in ('test -f d || { echo no; exit 1; }', 'x=$(( 1 + 2 )) || exit 1',
                 '# a || (echo; exit 1) in a comment', "python - <<'EOF'\nok = a or (b and exit)\nEOF"):
        assert "subshell-exit" not in _found(job("--time=1:00:00", body=body + "\nsrun python x.py")), body


def test_local_world_size_from_the_world_on_two_nodes() -> None:
    for value in ("$WORLD_SIZE", "${SLURM_NTASKS}", '"$WORLD_SIZE"'):
        text = job(*FULL_PUHTI, body=f"export LOCAL_WORLD_SIZE={value}\nsrun python x.py")
        assert _found(text)["local-world-size"] == {"error"}, value
    one_node = job("--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4", "--time=1",
                   body="export LOCAL_WORLD_SIZE=$WORLD_SIZE\nsrun python x.py")
    assert "local-world-size" not in _found(one_node)


def _shared_gpus_job(tmp_path: Path, program: str, *extra: str, body: str = "srun python train.py") -> set[str]:
    (tmp_path / "train.py").write_text(program)
    script = tmp_path / "job.sh"
    script.write_text(job("--time=1:00:00", "--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4", *extra, body=body))
    return {f.rule for f in lint_file(str(script)).findings}


def test_gpus_shared_by_tasks(tmp_path: Path) -> None:
    naive = "import torch\nmodel = Net().cuda()\n"
    assert "gpus-shared-by-tasks" in _shared_gpus_job(tmp_path, naive)
    # the program picks its GPU, Slurm binds one per task, or the script narrows each task's view
    picks = "import os, torch\ntorch.cuda.set_device(int(os.environ['SLURM_LOCALID']))\n"
    assert "gpus-shared-by-tasks" not in _shared_gpus_job(tmp_path, picks)
    assert "gpus-shared-by-tasks" not in _shared_gpus_job(tmp_path, naive, "--gpu-bind=single:1")
    per_task = "srun bash -c 'export CUDA_VISIBLE_DEVICES=$SLURM_LOCALID; python train.py'"
    assert "gpus-shared-by-tasks" not in _shared_gpus_job(tmp_path, naive, body=per_task)
    # a program lint cannot read is not guessed at
    assert "gpus-shared-by-tasks" not in _shared_gpus_job(tmp_path, naive, body="srun python other.py")


@pytest.mark.parametrize("value", ["...", "\u2026"])
def test_ellipsis_left_as_an_sbatch_value_is_a_placeholder(value: str) -> None:
    text = job(f"--partition={value}", "--account=project_1", "--time=1:00:00")
    assert _found(text)["placeholder"] == {"error"}
    assert "placeholder" not in _found(job("--partition=gpu", "--comment=see...docs", "--time=1:00:00"))


@pytest.mark.parametrize("body, flagged", [
    ("srun python train.py <options>", True),                       # the guide's blank
    ("srun apptainer exec --nv -B /project '<A' python -c 'import x' 2>/dev/null", False),
    ("srun python train.py --tag '<run>' --out '<A'\"'\"'b>'", False),  # quoted values are literal
    ("srun python train.py --tag \"<run>\"", True),                    # double quotes: still a blank
])
def test_single_quoted_values_are_not_placeholders(body: str, flagged: bool) -> None:
    """scaletrain quotes every user value in single quotes: '<A' or '<run>' is the value the
    user gave (a property test found '<A' ... 2> read as one placeholder), not a blank."""
    found = _found(job("--partition=gpu", "--account=project_1", "--time=1:00:00", body=body))
    assert ("placeholder" in found) == flagged


@pytest.mark.parametrize("line", [
    "\u2014account=project_1",          # em dash, pasted from a web page
    "\u2013-gres=gpu:v100:4",           # en dash
    "--gr\u0435s=gpu:v100:4",           # Cyrillic e
    "--time=1:00:00\u00a0--mem=8G",     # no-break space
])
def test_lookalike_characters_on_sbatch_lines(line: str) -> None:
    text = "#!/bin/bash\n#SBATCH --ntasks=1\n#SBATCH " + line + "\n\nsrun python x.py\n"
    result = lint_text(text)
    (f,) = [f for f in result.findings if f.rule == "sbatch-unicode"]
    assert f.line == 3 and f.severity == "error" and "U+" in f.message


def test_a_job_name_in_cyrillic_is_not_a_lookalike() -> None:
    assert "sbatch-unicode" not in _found(job("--job-name=\u043e\u0431\u0443\u0447\u0435\u043d\u0438\u0435",
                                              "--time=1:00:00"))


def test_huge_gpu_count_is_a_finding_not_a_traceback() -> None:
    # issue 22: int() of 5000 digits raised ValueError out of lint
    result = lint_text(job("--gres=gpu:" + "9" * 5000, "--time=1:00:00"))
    assert result is not None
    result = lint_text(job("--gpus-per-node=" + "9" * 5000, "--nodes=" + "9" * 5000, "--time=1:00:00"),
                       profile=load_profile("puhti"))
    assert result is not None


def test_a_lookalike_inside_a_quoted_value_is_the_values_own() -> None:
    # plan writes odd job names in double quotes; sbatch keeps them whole there
    assert "sbatch-unicode" not in _found(job('--job-name="a\u00adb\u00a0c"', "--time=1:00:00"))
