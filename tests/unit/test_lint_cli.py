"""``scaletrain lint`` end to end: golden text and JSON, exit codes, bad input, cluster choice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli

from scaletrain.cli.main import main

CASES = Path(__file__).parent / "lint_cases"

GOLDEN_TEXT = """\
job.sh:5: warning cluster-retired mahti was retired on 2026-08-31: this script's jobs will not run there (successor: roihu) HINT: port it: scaletrain port job.sh --cluster roihu
job.sh:7: error cpu-limit 256 CPUs per node requested (64 per task x 4 tasks) but a mahti node has 128 HINT: #SBATCH --cpus-per-task=32
job.sh:9: error partition-limit 4 GPUs in partition 'gpusmall', which allows at most 2 HINT: use --partition=gpumedium
job.sh:14: error sbatch-after-command '#SBATCH --mem=200G' comes after the first command (line 11): sbatch stops reading #SBATCH lines there and silently ignores it HINT: move every #SBATCH line above the first command
"""

CLEAN = """#!/bin/bash
#SBATCH --account=project_2001234
#SBATCH --partition=gpumedium
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=72
#SBATCH --time=1:00:00
#SBATCH --gres=gpu:gh200:4

export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
srun python3 train.py
"""


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCALETRAIN_CLUSTER", raising=False)
    (tmp_path / "job.sh").write_text((CASES / "mahti_gpusmall.sh").read_text())
    (tmp_path / "clean.sh").write_text(CLEAN)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "lint", *argv)


def test_golden_text(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "job.sh", "--cluster", "mahti")
    assert code == 1
    assert out == GOLDEN_TEXT
    # no master-port warning: the job asks for all 4 GPUs of its nodes, nobody shares the port
    # no srun-cpus-per-task: the mahti profile records no Slurm release (the rule holds for 22.05-23.02 only)
    assert err == "scaletrain lint: 1 file(s), 3 error(s), 1 warning(s); cluster: mahti (--cluster)\n"


def test_golden_json(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "job.sh", "--format", "json")
    assert code == 1
    doc = json.loads(out)
    assert doc["version"] == 1
    assert doc["files"] == [{"path": "job.sh", "cluster": "mahti",
                             "cluster_source": "detected from partition 'gpusmall'", "candidates": [],
                             "errors": 3, "warnings": 1}]
    assert doc["summary"] == {"files": 1, "errors": 3, "warnings": 1}
    assert [(f["line"], f["severity"], f["rule"]) for f in doc["findings"]] == [
        (5, "warning", "cluster-retired"), (7, "error", "cpu-limit"), (9, "error", "partition-limit"),
        (14, "error", "sbatch-after-command")]
    assert doc["findings"][2] == {
        "file": "job.sh", "line": 9, "severity": "error", "rule": "partition-limit",
        "message": "4 GPUs in partition 'gpusmall', which allows at most 2", "hint": "use --partition=gpumedium"}
    # the text format is the JSON rendered one line per finding
    text_lines = GOLDEN_TEXT.splitlines()
    assert [f"{f['file']}:{f['line']}: {f['severity']} {f['rule']} {f['message']} HINT: {f['hint']}"
            for f in doc["findings"]] == text_lines


def test_clean_script_exits_0_and_prints_nothing(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "clean.sh")
    assert (code, out) == (0, "")
    assert "0 error(s), 0 warning(s); cluster: roihu (detected from partition 'gpumedium' + GPU type 'gh200')" in err


def test_warnings_alone_exit_0(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (work / "warn.sh").write_text(CLEAN.replace("#SBATCH --time=1:00:00\n", ""))
    code, out, _ = run(capsys, "warn.sh")
    assert code == 0 and " warning time-missing " in out


def test_several_files_one_bad(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "clean.sh", "job.sh")
    assert code == 1 and out.count("job.sh:") == 4 and "clean.sh:" not in out


@pytest.mark.parametrize("make,name,fragment", [
    (None, "missing.sh", "missing.sh: no such file"),
    (lambda p: p.mkdir(), "adir", "adir: is a directory"),
    (lambda p: p.write_bytes(b"\x7fELF\x00\x01\x02"), "prog", "prog: binary file"),
    (lambda p: p.write_text("import torch\nprint(1)\n"), "train.py", "no '#!' line and no #SBATCH lines"),
    (lambda p: p.write_text("#!/usr/bin/env python3\nprint(1)\n"), "run.sh", "a 'python3' script"),
    (lambda p: p.write_text("#!/bin/bash\necho hello\n"), "hello.sh", "no #SBATCH lines and no srun"),
])
def test_bad_input_exits_2_with_one_line_and_hint(work: Path, capsys: pytest.CaptureFixture[str],
                                                  make, name: str, fragment: str) -> None:  # noqa: ANN001
    if make:
        make(work / name)
    code, out, err = run(capsys, "clean.sh", name)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("scaletrain: error: ") and fragment in lines[0]
    assert lines[1].startswith("  HINT: ")


def test_unknown_cluster_lists_known(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "clean.sh", "--cluster", "nosuch")
    assert code == 2 and out == ""
    assert "nosuch" in err and "puhti" in err and "HINT:" in err


def test_cluster_from_environment_when_script_does_not_say(work: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (work / "nopart.sh").write_text("#!/bin/bash\n#SBATCH --time=1:00:00\n#SBATCH --gres=gpu:v100:8\n\n"
                                    "srun python x.py\n")
    code, out, _ = run(capsys, "nopart.sh")
    assert code == 0          # no cluster: nothing to compare 8 GPUs with
    monkeypatch.setenv("SCALETRAIN_CLUSTER", "mahti")
    code, out, err = run(capsys, "nopart.sh")
    assert code == 1 and "gpus-per-node" in out and "gpu-syntax" in out
    assert "mahti ($SCALETRAIN_CLUSTER)" in err


def test_shared_partition_name_is_told_apart_by_gpu_type(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = "#!/bin/bash\n#SBATCH --partition=gputest\n#SBATCH --time=00:10:00\n{gpu}\nsrun python x.py\n"
    (work / "t1.sh").write_text(base.format(gpu="#SBATCH --gres=gpu:v100:1"))
    (work / "t2.sh").write_text(base.format(gpu=""))
    _, out, _ = run(capsys, "t1.sh", "t2.sh", "--format", "json")
    files = {f["path"]: f["cluster"] for f in json.loads(out)["files"]}
    assert files == {"t1.sh": "puhti", "t2.sh": None}     # puhti and mahti both have gputest


def test_profile_file(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (work / "tiny.toml").write_text(
        'name = "tiny"\ndescription = "test"\nsite = "test"\ngpus_per_node = 2\ngpu_model = "T4"\n'
        'gpu_memory_gb = 16\ngpu_vendor = "nvidia"\ncores_per_node = 16\nmem_per_node_gb = 64\n'
        'gpu_request = "gres_typed"\ngres_type = "t4"\ngpu_request_accepts = ["gres_typed", "gres"]\n'
        'account_required = false\n[partitions.gpu]\nmax_gpus = 4\nmax_time = "04:00:00"\ndefault = true\n')
    code, out, _ = run(capsys, "clean.sh", "--profile", "tiny.toml")
    rules = {line.split()[2] for line in out.splitlines()}
    # gpumedium is not a tiny partition (warning); a100 is not a t4 and 4 > 2 GPUs (errors)
    assert code == 1 and {"partition-unknown", "gpu-syntax", "gpus-per-node"} <= rules


def test_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["lint", "--help"])
    out = capsys.readouterr().out
    for flag in ("--cluster", "--profile", "--format", "examples:", "exit status"):
        assert flag in out


def test_lint_does_not_import_torch(work: Path) -> None:
    code = ("import sys\nfrom scaletrain.cli.main import main\n"
            "rc = main(['lint', 'job.sh', '--format', 'json'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["summary"]["errors"] == 3


def test_script_with_srun_but_options_on_the_command_line_is_linted(work: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (work / "steps.sh").write_text("#!/usr/bin/env -S bash -e\nsrun --ntasks-per-node=1 torchrun --standalone "
                                   "--nproc_per_node=4 train.py\n")
    code, out, _ = run(capsys, "steps.sh")
    assert (code, out) == (0, "")


PLAN_LAUNCHERS = ("scaletrain", "torchrun", "srun", "lightning", "accelerate", "deepspeed", "mpi")


@pytest.mark.parametrize("cluster", ["roihu", "jupiter", "lumi", "juwels-booster", "narval", "fir", "trillium"])
def test_every_generated_plan_lints_without_error(cluster: str, work: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """What ``scaletrain plan`` writes must pass ``scaletrain lint`` (both sides of one contract)."""
    from scaletrain.cli.main import VERBS
    pytest.importorskip(VERBS["plan"])
    for launcher in PLAN_LAUNCHERS:
        for gpus in ("1", "8") if cluster == "trillium" else ("2", "8"):   # Trillium: 1 GPU or whole nodes
            code = main(["plan", "--cluster", cluster, "--gpus", gpus, "--launcher", launcher,
                         "--account", "project_1", "--time", "01:00:00", "--", "train.py", "--lr", "0.1"])
            script, _ = capsys.readouterr()
            assert code == 0, (launcher, gpus)
            (work / "plan.sh").write_text(script)
            code, out, _ = run(capsys, "plan.sh", "--cluster", cluster)
            assert " error " not in out, f"{launcher} x {gpus} GPUs:\n{out}\n{script}"
            assert code == 0
