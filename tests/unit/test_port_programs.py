"""``port`` never drops a line of the job silently (issue 39 items 3 and 4, issue 38 item 4).

Each ported script is run, not only read: ``bash`` with stub ``srun`` (one task), ``module``,
``scontrol`` and ``virtualenv`` (whose ``pip`` records its arguments and copies a package from
a folder index the test builds, so the program's imports work only when the package list
reached pip). The program is real Python and prints what it got.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from port_examples import ALLIANCE_DDP

from scaletrain.lint.engine import lint_text

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")

HEAD = "#!/bin/bash\n#SBATCH --gres=gpu:4\n#SBATCH --account=def-x\n#SBATCH --time=1:00:00\n"

STUB_SRUN = """#!/bin/bash
# one task of the step: skip srun's options, run the rest as task 0 of 1
while [ $# -gt 0 ] && [[ $1 == -* ]]; do shift; done
export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=1
exec "$@"
"""
STUB_VIRTUALENV = """#!/bin/bash
for a; do d=$a; done
mkdir -p "$d/bin" "$d/site"
printf 'export PATH="%s/bin:$PATH" PYTHONPATH="%s/site"\\n' "$d" "$d" > "$d/bin/activate"
cat > "$d/bin/pip" <<EOF
#!/bin/bash
printf '%s\\n' "\\$*" >> "$PIP_LOG"
for a; do if [ -d "$WHEELS/\\$a" ]; then cp -r "$WHEELS/\\$a" "$d/site/"; fi; done
EOF
chmod +x "$d/bin/pip"
"""
# the program: its imports come from the folder index only through the job's pip
PROGRAM = """import sys
import torch
try:
    import torchvision
    vision = torchvision.FROM
except ImportError:
    vision = "no-torchvision"
print("PROGRAM", torch.FROM, vision, *sys.argv[1:])
"""


@pytest.fixture
def job(tmp_path: Path):
    """Port a script (CLI, to narval unless told) and run what port wrote under the stubs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", STUB_SRUN), ("virtualenv", STUB_VIRTUALENV), ("module", "#!/bin/sh\n"),
                       ("scontrol", "#!/bin/sh\necho node1\n")):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(sys.executable)
    for pkg in ("torch", "torchvision"):     # the folder index: a package is a folder
        (tmp_path / "wheels" / pkg).mkdir(parents=True)
        (tmp_path / "wheels" / pkg / "__init__.py").write_text(f"FROM = 'index-{pkg}'\n")
    for name in ("train.py", "ddp_job.py"):     # the programs the old scripts start
        (tmp_path / name).write_text(PROGRAM)

    def run(old: str, capsys, *extra: str) -> tuple[subprocess.CompletedProcess[str], str, str]:
        (tmp_path / "old.sh").write_text(old)
        code, script, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval",
                                    "--account", "def-x", *extra)
        assert code == 0, err
        assert subprocess.run([BASH, "-n"], input=script, text=True).returncode == 0
        assert not lint_text(script).errors
        (tmp_path / "job.sh").write_text(script)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_LOG": str(tmp_path / "pip.log"),
               "WHEELS": str(tmp_path / "wheels"), "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node1",
               "SLURM_CPUS_PER_TASK": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
               "SLURM_NTASKS_PER_NODE": "1", "SLURM_TMPDIR": str(tmp_path / "tmpdir"), "SLURM_NTASKS": "1"}
        proc = subprocess.run([BASH, str(tmp_path / "job.sh")], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        return proc, script, err

    run.tmp = tmp_path  # type: ignore[attr-defined]
    return run


# --------------------------------------------------------------------------- item 3: programs

def test_a_multi_line_python_c_is_carried_exactly(job, capsys) -> None:
    """It was joined with '; ' into a SyntaxError that stopped the job before training."""
    old = HEAD + 'python3 -c "\nimport sys\nx = 6 * 7\nprint(\'SETUP\', x, \\"q\\")\n"\nsrun python train.py\n'
    proc, _, err = job(old, capsys)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == ['SETUP 42 q', "PROGRAM index-torch no-torchvision"]
    assert "not carried over: nothing" in err


def test_a_trailing_backslash_does_not_swallow_the_next_line(job, capsys) -> None:
    """``mkdir -p out \\`` before a blank line took the generated 'set -u' as its arguments."""
    old = HEAD + "echo one \\\n  two\nmkdir -p out \\\n\nsrun python train.py --x 1\n"
    proc, script, _ = job(old, capsys)
    assert "mkdir -p out\n" in script and "echo one   two\n" in script
    assert proc.returncode == 0, proc.stderr
    assert not (job.tmp / "set").exists() and (job.tmp / "out").is_dir()
    assert proc.stdout.splitlines() == ["one two", "PROGRAM index-torch no-torchvision --x 1"]


def test_commands_sharing_a_line_are_carried_once(job, capsys) -> None:
    old = HEAD + "mkdir -p d && echo made | tee made.txt\nsrun python train.py\n"
    proc, _, _ = job(old, capsys)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["made", "PROGRAM index-torch no-torchvision"]


def test_commands_on_the_training_line_are_listed(capsys, tmp_path: Path) -> None:
    (tmp_path / "old.sh").write_text(HEAD + "srun python train.py | tee log\n")
    code, script, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval")
    assert code == 0 and "tee" not in script
    assert "not carried over: line 5: srun python train.py | tee log (the other commands on the training line" in err


@pytest.mark.parametrize("launch, how", [
    ("srun python - <<'PY'\nimport os\nprint(os.environ['RANK'])\nPY\n", "read from standard input"),
    ("srun python3 -u - << EOF\nprint(1)\nEOF\n", "read from standard input"),
    ('srun python3 -c "\nimport os\nprint(1)\n"\n', "given with -c"),
    ("srun python -c 'import train; train.main()'\n", "given with -c"),
])
def test_a_program_written_into_the_script_is_refused_not_dropped(capsys, tmp_path: Path, launch: str,
                                                                   how: str) -> None:
    (tmp_path / "old.sh").write_text(HEAD + launch)
    code, out, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval")
    assert code == 2 and out == "" and "not carried over: nothing" not in err
    assert f"old.sh:5: the training program is {how}" in err and "save the program as a file" in err


@pytest.mark.parametrize("launch, found", [
    ("srun python train.py --x 1 > out.log 2>&1\n", "(>...)"),
    ("srun python train.py < input.txt\n", "(<...)"),
    ("srun python train.py <<EOF\nanswer\nEOF\n", "(<<EOF...)"),
])
def test_redirections_on_the_training_line_are_refused(capsys, tmp_path: Path, launch: str, found: str) -> None:
    """They reached the program as arguments ('>' out.log '2>'), or the here-document was dropped."""
    (tmp_path / "old.sh").write_text(HEAD + launch)
    code, out, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval")
    assert code == 2 and out == ""
    assert f"old.sh:5: the training line redirects the program's input or output {found}" in err


def test_a_quoted_angle_bracket_is_an_argument(capsys, tmp_path: Path) -> None:
    (tmp_path / "old.sh").write_text(HEAD + "srun python train.py --sep '>' --tag \"<a>\"\n")
    code, out, _ = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval")
    assert code == 0 and out.rstrip().endswith("train.py --sep '>' --tag '<a>'")


@pytest.mark.parametrize("launch, listed", [
    ("srun --cpu-bind=cores --export=ALL,FOO=1 python -O -W ignore train.py --a 1",
     "srun --cpu-bind=cores --export=ALL,FOO=1 -O -W ignore"),
    ("srun torchrun --nnodes=1 --nproc_per_node=4 --max-restarts 3 train.py", "--max_restarts=3"),
    ("srun env FOO=1 python train.py", "env FOO=1"),
    ("srun nsys profile -o rep python train.py", "nsys profile -o rep"),
])
def test_the_old_launch_lines_own_options_are_listed(capsys, tmp_path: Path, launch: str, listed: str) -> None:
    """They were dropped with 'not carried over: nothing' (FOO=1 never reached the program)."""
    (tmp_path / "old.sh").write_text(HEAD + "#SBATCH --ntasks-per-node=4\n" + launch + "\n")
    code, _, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval")
    assert code == 0, err
    assert f"not carried over: line 6: {listed} (on the old launch line;" in err


def test_sizes_on_the_old_launch_line_are_planned_not_listed(capsys, tmp_path: Path) -> None:
    (tmp_path / "old.sh").write_text(HEAD + "srun -N 1 -n 4 --gres=gpu:4 --kill-on-bad-exit=1 python -u train.py\n")
    code, _, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval")
    assert code == 0 and "not carried over: nothing" in err


def test_a_module_program_stays_a_module(job, capsys) -> None:
    """'srun python -m pkg.train' became 'python -u pkg.train', a file that does not exist."""
    (job.tmp / "pkg").mkdir()
    (job.tmp / "pkg" / "__init__.py").write_text("")
    (job.tmp / "pkg" / "train.py").write_text("import sys\nprint('MODULE', __name__, *sys.argv[1:])\n")
    proc, script, _ = job(HEAD + "srun python -m pkg.train --a 1\n", capsys)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["MODULE __main__ --a 1"]


@pytest.mark.parametrize("value", ["a", "c", "z"])
def test_a_case_block_is_one_line_that_chooses_the_same(value: str) -> None:
    """'case X in' + newline was joined as 'case X in;', a syntax error that stopped the port."""
    from scaletrain.port.oneline import one_line

    text = "case $X in\n  a) echo A;;\n  b|c)\n    echo BC\n    ;;\n  *) echo other;;\nesac"
    joined = one_line(text)
    assert joined is not None and "\n" not in joined
    runs = [subprocess.run([BASH, "-c", code], env={"X": value}, capture_output=True, text=True, timeout=30)
            for code in (text, joined)]
    assert runs[1].stdout == runs[0].stdout and runs[0].stdout.strip() in ("A", "BC", "other")


_SINGLE = st.text("ab \n$\"\\`#", max_size=8).map(lambda t: f"'{t}'")
_DOUBLE = st.lists(st.sampled_from(["a", " ", "\n", "'", "#", '\\"', "\\$", "\\\\", "\\\n"]),
                   max_size=8).map(lambda parts: '"' + "".join(parts) + '"')
_ANSI = st.text("ab \n", max_size=6).map(lambda t: f"$'{t}'")
_BARE = st.text("abz019=._-", min_size=1, max_size=6)
_BREAK = st.sampled_from([" ", " \\\n  ", "\\\n", " \\\n"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.tuples(st.one_of(_SINGLE, _DOUBLE, _ANSI, _BARE), _BREAK), min_size=1, max_size=5),
       comment=st.booleans())
def test_one_line_means_what_the_lines_meant(words: list[tuple[str, str]], comment: bool) -> None:
    """Quoted newlines, continuations and comments: bash prints the same for the lines and for
    their one line (each word between < >, so joined or split words show)."""
    from scaletrain.port.oneline import one_line

    text = "printf '<%s>' " + "".join(w + b for w, b in words).rstrip("\\\n ") + "\n"
    text += "# a comment \\\n" if comment else ""
    text += "echo end"
    joined = one_line(text)
    assert joined is not None and "\n" not in joined
    runs = [subprocess.run([BASH, "-c", code], capture_output=True, text=True, timeout=30) for code in (text, joined)]
    assert (runs[1].stdout, runs[1].returncode) == (runs[0].stdout, runs[0].returncode), (text, joined)


# --------------------------------------------------------------------------- item 4: look-alikes

@pytest.mark.parametrize("line, column, name", [
    ("#S\u0412ATCH --gres=gpu:4", 3, "CYRILLIC CAPITAL LETTER VE (U+0412)"),
    ("#SB\u0391TCH --gres=gpu:4", 4, "GREEK CAPITAL LETTER ALPHA (U+0391)"),
    ("\u200b#SBATCH --gres=gpu:4", 1, "ZERO WIDTH SPACE (U+200B)"),
    ("#\u200bSBATCH --gres=gpu:4", 2, "ZERO WIDTH SPACE (U+200B)"),
    ("\uff03SBATCH --gres=gpu:4", 1, "FULLWIDTH NUMBER SIGN (U+FF03)"),
    ("#S\u0301BATCH --gres=gpu:4", 3, "COMBINING ACUTE ACCENT (U+0301)"),
    ("\ufeff#SBATCH --gres=gpu:4", 1, "ZERO WIDTH NO-BREAK SPACE (U+FEFF)"),
    ("#SBATCH\u00a0--gres=gpu:4", 8, "NO-BREAK SPACE (U+00A0)"),
    ("#SBATCH \u2013-gres=gpu:4", 9, "EN DASH (U+2013)"),
    ("#SBATCH --gres=gpu:4\u00a0--exclusive", 21, "NO-BREAK SPACE (U+00A0)"),
])
def test_a_lookalike_directive_is_an_error_in_lint_and_port(capsys, tmp_path: Path, line: str, column: int,
                                                            name: str) -> None:
    """sbatch ignores such a line (or its option): port planned 1 GPU for a job that asked 4."""
    text = "#!/bin/bash\n#SBATCH --account=def-x\n" + line + "\n#SBATCH --time=1:00:00\nsrun python train.py\n"
    found = [f for f in lint_text(text).findings if f.rule == "sbatch-unicode"]
    assert [(f.line, f.severity) for f in found][:1] == [(3, "error")]
    assert f"column {column} is {name}" in found[0].message
    (tmp_path / "old.sh").write_text(text)
    code, out, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval")
    assert code == 2 and out == ""
    assert f"old.sh:3: {line!r}: column {column} is {name}" in err


@pytest.mark.parametrize("line", ["# \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
                                  "#\u041f\u0440\u0438\u0432\u0435\u0442\u043c\u0438\u0440 comment",
                                  "#SBATCH --job-name=\u043e\u0431\u0443\u0447\u0435\u043d\u0438\u0435"])
def test_a_comment_or_a_value_in_cyrillic_is_not_a_lookalike(line: str) -> None:
    text = "#!/bin/bash\n#SBATCH --account=def-x\n" + line + "\n#SBATCH --time=1:00:00\nsrun python train.py\n"
    assert not [f for f in lint_text(text).findings if f.rule == "sbatch-unicode"]


# --------------------------------------------------------------------------- issue 38 item 4: the venv

GUIDE_FORM = ALLIANCE_DDP.replace("pip install --no-index torchvision", "pip install torch torchvision --no-index")


@pytest.mark.parametrize("old", [GUIDE_FORM, ALLIANCE_DDP, HEAD + "module load python\nvirtualenv --no-download "
                                 "$SLURM_TMPDIR/env\nsource $SLURM_TMPDIR/env/bin/activate\n"
                                 "pip install torch torchvision --no-index\nsrun python train.py\n"],
                         ids=["guide", "example", "plain-lines"])
def test_the_old_venvs_packages_reach_the_new_jobs_venv(job, capsys, old: str) -> None:
    """The Alliance guide's job built its venv with torch and torchvision; the port installed torch only."""
    proc, script, err = job(old, capsys)
    assert proc.returncode == 0, proc.stderr
    assert (job.tmp / "pip.log").read_text().splitlines() == ["install --no-index --quiet torch torchvision"]
    assert proc.stdout.splitlines()[-1].startswith("PROGRAM index-torch index-torchvision")
    assert "(torch torchvision only)" in err
    # the old venv's activation is the new job's own now: replaced, and nothing else was left behind
    assert "-> the new job activates its own Python environment" in err and "not carried over: nothing" in err


def test_a_venv_build_port_cannot_carry_is_refused_with_venv_as_the_fix(job, capsys, tmp_path: Path) -> None:
    old = ALLIANCE_DDP.replace("pip install --no-index torchvision", "pip install -r requirements.txt")
    (tmp_path / "old.sh").write_text(old)
    code, out, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "narval", "--account", "d")
    assert code == 2 and out == ""
    assert "old.sh:10: the old script builds its Python environment" in err and "pip option -r" in err
    assert "port with --venv DIR" in err
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "activate").write_text(f'export PYTHONPATH="{tmp_path}/wheels"\n')
    proc, script, err = job(old, capsys, "--venv", str(tmp_path / "env"))
    assert proc.returncode == 0, proc.stderr
    assert f"source {tmp_path}/env/bin/activate" in script and "pip install" not in script
    assert proc.stdout.splitlines()[-1].startswith("PROGRAM index-torch index-torchvision")


def test_a_target_without_a_job_venv_refuses_the_packages_with_the_fix(capsys, tmp_path: Path) -> None:
    (tmp_path / "old.sh").write_text(GUIDE_FORM)
    code, out, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "roihu", "--account", "p_1")
    assert code == 2 and out == ""
    assert "venv installs torchvision, and a roihu job does not build a venv of its own" in err
    code, out, err = run_cli(capsys, "port", str(tmp_path / "old.sh"), "--cluster", "roihu", "--account", "p_1",
                             "--venv", "/projappl/p_1/env")
    assert code == 0 and "source /projappl/p_1/env/bin/activate" in out
    assert "--venv /projappl/p_1/env replaces the venv the old script built; it must have torch torchvision" in err
