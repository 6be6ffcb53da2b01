"""``scaletrain port``: the centre guides' Puhti and Mahti scripts on Roihu, a LUMI module script
on LUMI's container. The result lints clean (no error, no warning the old script did not have)
and keeps the program and its arguments word for word; bad input is one line and exit 2."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import run_cli

from lint_seed_blocks import all_blocks
from scaletrain.clusters.profile import load_profile
from scaletrain.lint.engine import lint_text
from scaletrain.plan.render import render_script
from scaletrain.port.recover import recover
from scaletrain.port.translate import port

# the guides' jobs: ours in their shapes (tests/unit/guide_jobs), and the guides' own where present
BLOCKS = all_blocks()
OLD = [b for b in BLOCKS if b.doc in ("000", "001") and b.cluster in ("puhti", "mahti")]


def _program_words(old_text: str) -> list[str]:
    """The program and its arguments as the old script writes them (read here with shlex, not lint)."""
    m = re.search(r"(myprog\.py(?:\\\n|[^\n])*)", old_text)
    assert m, old_text
    return shlex.split(m.group(1).replace("\\\n", " ").rstrip().rstrip('"'))


def _rules(result) -> dict[str, set[str]]:
    return {sev: {f.rule for f in result.findings if f.severity == sev} for sev in ("error", "warning")}


def _check_port(old_text: str, source: str, target) -> str:
    ported = port(recover(old_text), target, load_profile(source), script_path="old.sh")
    new = render_script(ported.plan)
    after = lint_text(new, profile=target)
    before = lint_text(old_text, profile=load_profile(source))
    assert not after.errors, (new, after.findings)
    assert _rules(after)["warning"] <= _rules(before)["warning"], (new, after.findings)
    words = _program_words(old_text)
    assert _launch_words(new)[-len(words):] == words
    return new


def _launch_words(script: str) -> list[str]:
    launch = [ln for ln in script.splitlines() if ln.startswith("srun --kill-on-bad-exit")][-1]
    return shlex.split(launch)


@pytest.mark.parametrize("block", OLD, ids=lambda b: b.id)
def test_guide_scripts_port_to_roihu(block) -> None:
    new = _check_port(block.text, block.cluster, load_profile("roihu"))
    assert "--gres=gpu:gh200:" in new and "v100" not in new and "a100" not in new
    assert "#SBATCH --account=project_2001234" in new


def test_every_launch_form_is_recovered() -> None:
    forms = {
        "srun python3 myprog.py --epochs 1": ("srun", 1),
        "srun python3 -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=4 myprog.py": ("torchrun", 1),
        "srun torchrun --nproc_per_node=4 myprog.py": ("torchrun", 1),
        "srun accelerate launch --config_file=a.yaml myprog.py": ("accelerate", 1),
        "srun apptainer_wrapper exec deepspeed myprog.py --deepspeed": ("deepspeed", 1),
        "mpirun -np 4 python myprog.py": ("mpi", 1),
        "horovodrun -np 4 -H localhost:4 python myprog.py": ("mpi", 1),
        "srun python -m scaletrain run --nproc-per-node 4 myprog.py": ("scaletrain-run", 1),
    }
    for line, (launcher, per_proc) in forms.items():
        old = recover("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n"
                      f"#SBATCH --gres=gpu:v100:4\n{line}\n")
        assert (old.launcher, old.gpus_per_proc, old.script) == (launcher, per_proc, "myprog.py"), line


def test_mpirun_in_one_task_is_one_process_per_gpu() -> None:
    for line in ("mpirun -np 4 python myprog.py", "horovodrun -np 4 python myprog.py --lr 1"):
        old = recover(f"#!/bin/bash\n#SBATCH --ntasks=1\n#SBATCH --gres=gpu:v100:4\n{line}\n")
        assert (old.launcher, old.gpus_per_proc, old.gpus_per_node) == ("mpi", 1, 4), line


def test_one_process_on_two_gpus_stays_one_process() -> None:
    old = recover("#!/bin/bash\n#SBATCH --account=p_1\n#SBATCH --ntasks=1\n#SBATCH --gres=gpu:v100:2\n"
                  "srun python3 myprog.py\n")
    plan = port(old, load_profile("roihu"), load_profile("puhti"), script_path="o.sh").plan
    assert (plan.resources.gpus, plan.resources.world_size, plan.settled.request.gpus_per_proc) == (2, 1, 2)


def _lumi_container():
    """LUMI's profile: the AI Factory container by default, run with singularity."""
    lumi = load_profile("lumi")
    assert lumi.software == "container" and lumi.default_image and lumi.container == "singularity exec"
    return lumi


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.doc in ("000", "001") and b.cluster == "lumi"
                                   and "module load pytorch" in b.text and "myprog.py" in b.text],
                         ids=lambda b: b.id)
def test_lumi_module_script_ports_to_the_container(block) -> None:
    target = _lumi_container()
    new = _check_port(block.text, "lumi", target)
    assert "module load pytorch" not in new and "/appl/local/csc/modulefiles" not in new
    launch = [ln for ln in new.splitlines() if ln.startswith("srun --kill-on-bad-exit")][-1]
    assert f"singularity exec" in launch and target.default_image in launch
    assert "command -v singularity" in new      # the runtime is checked before the launch


def test_program_arguments_and_exports_are_kept_exactly() -> None:
    text = ("#!/bin/bash\n#SBATCH --account=project_1\n#SBATCH --partition=gpu\n#SBATCH --gres=gpu:v100:4\n"
            "#SBATCH --ntasks-per-node=4\n#SBATCH --time=2:00:00\n#SBATCH --qos=high\n"
            "export HF_HOME=/scratch/project_1/hf\nexport OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK\n"
            "source /projappl/project_1/venv/bin/activate\n"
            "tar xf /scratch/project_1/data.tar -C $LOCAL_SCRATCH\n"
            "srun python3 train.py --data \"$LOCAL_SCRATCH/data\" --name 'a b' --lr=3e-4\n"
            "seff $SLURM_JOB_ID\n")
    ported = port(recover(text), load_profile("roihu"), load_profile("puhti"), script_path="o.sh")
    new = render_script(ported.plan)
    assert _launch_words(new)[-6:] == ["train.py", "--data", "$LOCAL_SCRATCH/data", "--name", "a b", "--lr=3e-4"]
    assert '"$LOCAL_SCRATCH/data"' in new       # expands in the job, as it did in the old script
    assert 'export LOCAL_SCRATCH="$TMPDIR"' in new          # the old name points at Roihu's disk
    assert "tar xf /scratch/project_1/data.tar -C $LOCAL_SCRATCH" in new
    assert "export HF_HOME=/scratch/project_1/hf" in new
    assert "#SBATCH --time=02:00:00" in new and "qos" not in new
    lost = "\n".join(ported.lost)
    assert "seff" in lost and "--qos=high" in lost and "activate" in lost
    assert any("OMP_NUM_THREADS" in c for c in ported.changes)
    assert not lint_text(new, profile=load_profile("roihu")).errors


def test_test_partition_stays_a_test_partition() -> None:
    base = ("#!/bin/bash\n#SBATCH --account=project_1\n#SBATCH --partition=gputest\n"
            "#SBATCH --gres=gpu:v100:4\n#SBATCH --ntasks-per-node=4\n#SBATCH --time={t}\nsrun python3 t.py\n")
    roihu, puhti = load_profile("roihu"), load_profile("puhti")
    short = port(recover(base.format(t="00:10:00")), roihu, puhti, script_path="o.sh")
    assert short.plan.resources.partition == "gputest"
    long = port(recover(base.format(t="05:00:00")), roihu, puhti, script_path="o.sh")
    assert long.plan.resources.partition == "gpumedium"
    assert any("does not take this job" in c for c in long.changes)


def test_cli_prints_the_script_and_the_changes(capsys, tmp_path: Path) -> None:
    old = tmp_path / "old.sh"
    old.write_text("#!/bin/bash\n#SBATCH --account=project_1\n#SBATCH --partition=gpumedium\n"
                   "#SBATCH --gres=gpu:a100:4\n#SBATCH --ntasks-per-node=4\nsrun python3 t.py --x 1\n")
    code, out, err = run_cli(capsys, "port", str(old), "--cluster", "roihu")
    assert code == 0 and out.startswith("#!/bin/bash") and "(mahti) -> roihu" in err
    assert "changed: GPUs: 1 node(s) x 4 a100 -> 1 node(s) x 4 GH200" in err
    dest = tmp_path / "new.sh"
    dest.write_text("keep me")
    code, _, err = run_cli(capsys, "port", str(old), "--cluster", "roihu", "--account", "project_9", "-o", str(dest))
    assert code == 0 and "#SBATCH --account=project_9" in dest.read_text()
    dest.write_text("keep me")
    code, _, err = run_cli(capsys, "port", str(old), "--cluster", "roihu", "--account", "bad name!", "-o", str(dest))
    assert code == 2 and dest.read_text() == "keep me"
    before = old.read_text()
    code, _, err = run_cli(capsys, "port", str(old), "--cluster", "roihu", "-o", str(old))
    assert code == 2 and "the script being ported" in err and old.read_text() == before


@pytest.mark.parametrize("body, needle", [
    ("#!/bin/bash\n#SBATCH --gres=gpu:v100:1\necho hello\n", "no line that starts a Python training program"),
    ("#!/bin/bash\n#SBATCH --gres=gpu:v100:1\nsrun python3 a.py\nsrun python3 b.py\n", "2 lines start training"),
    ("print('not a batch script')\n", "not a Slurm batch script"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path: Path, body: str, needle: str) -> None:
    old = tmp_path / "old.sh"
    old.write_text(body)
    code, out, err = run_cli(capsys, "port", str(old), "--cluster", "roihu")
    assert code == 2 and out == "" and needle in err
    assert len(err.strip().splitlines()) == 2 and "hint:" in err.lower()


def test_missing_file_and_missing_cluster_are_exit_2(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "port", str(tmp_path / "nope.sh"), "--cluster", "roihu")
    assert code == 2 and "Traceback" not in err
    (tmp_path / "a.sh").write_text("#!/bin/bash\nsrun python3 a.py\n")
    code, _, err = run_cli(capsys, "port", str(tmp_path / "a.sh"))
    assert code == 2 and "--cluster" in err


def test_every_flag_of_port_and_env_create_is_documented() -> None:
    import argparse

    from scaletrain.cli.main import build_parser

    docs = Path(__file__).resolve().parents[2] / "docs"
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    env = next(a for a in sub.choices["env"]._actions if isinstance(a, argparse._SubParsersAction))
    for parser, page in ((sub.choices["port"], "porting.md"), (env.choices["create"], "clusters.md")):
        text = (docs / page).read_text()
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text, f"{flag} is not in docs/{page}"


def test_a_retired_system_ports_to_its_successor_by_default(capsys, tmp_path: Path, monkeypatch) -> None:
    assert load_profile("puhti").successor == "roihu"
    old = tmp_path / "old.sh"
    old.write_text("#!/bin/bash\n#SBATCH --account=project_1\n#SBATCH --partition=gpu\n"
                   "#SBATCH --gres=gpu:v100:4\n#SBATCH --ntasks-per-node=4\nsrun python3 t.py\n")
    code, out, err = run_cli(capsys, "port", str(old))
    assert code == 0 and "(puhti) -> roihu" in err and "--gres=gpu:gh200:4" in out


def test_control_flow_is_carried_whole_unless_it_holds_the_launch() -> None:
    head = "#!/bin/bash\n#SBATCH --account=p_1\n#SBATCH --gres=gpu:v100:4\n#SBATCH --ntasks-per-node=4\n"
    old = recover(head + 'if [ ! -d out ]; then\n  mkdir out\nfi\nsrun python3 t.py\n')
    assert [ln.text for ln in old.setup] == ["if [ ! -d out ]; then mkdir out; fi"]
    new = render_script(port(old, load_profile("roihu"), load_profile("puhti"), script_path="o.sh").plan)
    assert "if [ ! -d out ]; then mkdir out; fi" in new
    assert not lint_text(new, profile=load_profile("roihu")).errors
    wrapped = recover(head + 'for i in 1 2; do\n  srun python3 t.py --seed $i\ndone\n')
    assert not wrapped.setup and "launches once" in wrapped.lost[0].why


def test_a_per_task_variable_in_the_arguments_is_refused_with_the_fix() -> None:
    from scaletrain.errors import UsageError

    with pytest.raises(UsageError, match=r"SLURM_PROCID"):
        recover("#!/bin/bash\n#SBATCH --gres=gpu:v100:4\nsrun python3 t.py --rank $SLURM_PROCID\n")


def test_multi_line_commands_become_one_line_or_are_listed() -> None:
    from scaletrain.port.oneline import one_line

    # a continuation is removed as bash removes it: the next line's indentation stays in the line
    assert one_line("python3 prep.py \\\n    --out x") == "python3 prep.py     --out x"
    assert one_line("for f in a b; do\n  cp $f x/\ndone") == "for f in a b; do cp $f x/; done"
    assert one_line("if true; then\n  echo a # why\nfi") == "if true; then echo a; fi"   # comments dropped
    assert one_line("cat > f <<EOF\nx\nEOF") is None


def test_staging_and_disk_are_listed_against_the_new_nodes() -> None:
    text = ("#!/bin/bash\n#SBATCH --account=p_1\n#SBATCH --gres=gpu:v100:4,nvme:500\n#SBATCH --ntasks-per-node=4\n"
            "#SBATCH --requeue\ntar xf /scratch/p_1/d.tar -C $LOCAL_SCRATCH\nsrun python3 t.py\n")
    ported = port(recover(text), load_profile("roihu"), load_profile("puhti"), script_path="o.sh")
    changes, lost = "\n".join(ported.changes), "\n".join(ported.lost)
    assert "data staging: line 6 carried as written" in changes
    assert "node-local disk: $TMPDIR on roihu (at most 150 GB, no request needed)" in changes
    assert "asked 500 GB; roihu allows 150 GB" in changes
    assert "nvme:500" in lost and "--requeue" in lost


def test_scratch_alias_to_a_path_when_the_target_names_no_variable() -> None:
    text = ("#!/bin/bash\n#SBATCH --account=p_1\n#SBATCH --gres=gpu:v100:4\n#SBATCH --ntasks-per-node=4\n"
            "srun python3 t.py --data \"$LOCAL_SCRATCH/d\"\n")
    ported = port(recover(text), load_profile("lumi"), load_profile("puhti"), script_path="o.sh")
    new = render_script(ported.plan)
    assert "export LOCAL_SCRATCH=/tmp" in new and _launch_words(new)[-3:] == ["t.py", "--data", "$LOCAL_SCRATCH/d"]
    assert not lint_text(new, profile=load_profile("lumi")).errors


def test_a_time_beyond_the_target_limits_is_cut_to_the_longest_and_said() -> None:
    text = ("#!/bin/bash\n#SBATCH --account=p_1\n#SBATCH --partition=gpu\n#SBATCH --time=3-00:00:00\n"
            "#SBATCH --gres=gpu:v100:4\n#SBATCH --ntasks-per-node=4\nsrun python3 t.py\n")
    ported = port(recover(text), load_profile("roihu"), load_profile("puhti"), script_path="o.sh")
    assert ported.plan.resources.time == "1-12:00:00"
    assert any("more than any roihu partition allows" in c for c in ported.changes)
