"""Random strings, numbers and bytes on every verb's flags: the CLI answers, briefly, and harms nothing.

For each verb, hypothesis builds command lines from the verb's own flags (read from its parser,
so a new flag is fuzzed without editing this file) with values drawn from random text, random
numbers, bytes that are not UTF-8, and a list of known-nasty values. Every run must:

- return an exit code of the error hierarchy (0-4, or 5: a dry run written but not checked here),
  never raise (no traceback);
- finish within a bound far above any honest run (an alarm, not a speed target);
- leave every file that existed before byte-for-byte unchanged (except ``plan -o FILE`` when
  it succeeded: replacing that file is what was asked).

Verbs run in-process (fast). Each run gets a fresh folder as cwd and HOME, and a PATH with only
``bash``, so ``submit`` cannot reach sbatch and ``clusters probe`` cannot reach Slurm. A few
runs go through a real subprocess with arguments as raw bytes.

Budget: about 350 in-process examples and 6 subprocesses, well under a minute on a loaded machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaletrain.cli.main import build_parser, main
from scaletrain.errors import EXIT_NOT_CHECKED

CODES = (0, 1, 2, 3, 4, EXIT_NOT_CHECKED)   # the error hierarchy's, and a dry run not checked here
BOUND_S = 60          # one CLI call; honest ones take well under a second
NASTY = ["", " ", "-", "--", "0", "-1", "+4", "4.0", "1" * 30, "9" * 400, "1e400", "inf", "nan",
         "100K", "0.5", "1_0", "\u0663", "../..", "a/b", "..", ".", "/dev/null", "/dev/zero",
         "$(touch pwned)", "`touch pwned`", "x\ny", "a\rb", "\x1b[31m", "'\"", "%x%j", "\u202e",
         "UNLIMITED", "00:00:00", "99-99:99:99", "64G", "0M", "1T", "7e9", "auto", "probe", "~"]

_bytes_arg = st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b).map(
    lambda b: b.decode("utf-8", "surrogateescape"))
_value = st.one_of(
    st.sampled_from(NASTY),
    st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=30),
    st.integers(-(10 ** 40), 10 ** 40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    _bytes_arg,
)


def _flags(verb: str) -> list[tuple[str, bool]]:
    """(option, takes a value) for every optional flag of ``verb``, from its parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    verb_parser = sub.choices[verb]
    if verb == "env":   # its flags are those of its one action, 'env create'
        inner = next(a for a in verb_parser._actions if isinstance(a, argparse._SubParsersAction))
        verb_parser = inner.choices["create"]
    out = []
    for action in verb_parser._actions:
        if not action.option_strings or "--help" in action.option_strings:
            continue
        out.append((max(action.option_strings, key=len), action.nargs != 0))
    return out


def _pairs(verb: str, skip: tuple[str, ...] = ()) -> st.SearchStrategy[list[str]]:
    flags = [f for f in _flags(verb) if f[0] not in skip]

    def build(chosen: list[tuple[tuple[str, bool], str]]) -> list[str]:
        argv: list[str] = []
        for (flag, takes), value in chosen:
            argv += [flag, value] if takes else [flag]
        return argv
    return st.lists(st.tuples(st.sampled_from(flags), _value), max_size=6).map(build)


@contextlib.contextmanager
def _sandbox() -> Iterator[Path]:
    """A fresh folder as cwd and HOME, PATH with only bash, the environment restored after."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None   # thousands of folders: keep them in memory
    with tempfile.TemporaryDirectory(prefix="scaletrain-fuzz-", dir=shm) as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        os.symlink(shutil.which("bash") or "/bin/bash", root / "bin" / "bash")
        (root / "precious.txt").write_text("keep me\n")
        (root / "job.sh").write_text("#!/bin/bash\n#SBATCH --nodes=2\nsrun python train.py\n")
        (root / "folder").mkdir()
        (root / "folder" / "notes.md").write_text("mine\n")
        for key in [k for k in os.environ if k.startswith(("SLURM_", "SBATCH_", "SCALETRAIN_", "MASTER_"))]:
            del os.environ[key]
        os.environ.update(PATH=str(root / "bin"), HOME=str(root),
                          SCALETRAIN_CLUSTERS_DIR=str(root / "clusters"))
        os.chdir(root)
        try:
            yield root
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def _alarm(signum, frame):  # noqa: ANN001
    raise TimeoutError(f"a CLI call ran past {BOUND_S} s")


def _check(argv: list[str]) -> None:
    """Run ``argv`` in a sandbox and assert the three promises of the module docstring."""
    with _sandbox() as root:
        before = _snapshot(root)
        # strict UTF-8 like a real terminal: a surrogate that reaches an output fails here too
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
        err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(BOUND_S)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        out.flush()
        err.flush()
        stdout, stderr = (s.buffer.getvalue().decode() for s in (out, err))   # type: ignore[attr-defined]
        assert code in CODES, (code, argv)
        assert "Traceback" not in stderr, argv
        if code == 2:
            assert "HINT:" in stderr or "usage:" in stdout, (argv, stderr)
        replaced = set()
        if code == 0 and argv[0] in ("plan", "port"):
            for flag in ("--output", "-o"):
                if flag in argv and argv.index(flag) + 1 < len(argv):
                    replaced.add((root / os.path.expanduser(argv[argv.index(flag) + 1])).resolve())
        for path, data in before.items():
            if path.resolve() in replaced:
                continue
            assert path.exists() and path.read_bytes() == data, (f"{path.name} changed", argv)
        assert not (root / "pwned").exists(), argv


# A valid command per verb; the sweep and the fuzz change one or two flags of it, so a bad value
# is not hidden behind another flag's error.
VALID = {
    "plan": ["plan", "--cluster", "roihu", "--account", "p1", "--gpus", "4"],
    "submit": ["submit", "--dry-run", "--cluster", "roihu", "--account", "p1", "--gpus", "4"],
    "lint": ["lint", "--cluster", "roihu"],
    "run": ["run", "--nproc-per-node", "1"],
    "clusters": ["clusters"],
    "doctor": ["doctor"],
    "port": ["port", "--cluster", "roihu", "--account", "p1"],
    "env": ["env", "create", "--cluster", "roihu", "--dry-run"],   # --dry-run: never builds here
    "status": ["status"],
    "logs": ["logs"],
    "cancel": ["cancel"],
    "report": ["report"],
}
TAIL = {"status": ["--", "runs/gone"], "logs": ["--", "runs/gone"], "cancel": ["--", "runs/gone"],
        "report": ["--", "runs/gone"],
        "plan": ["--", "train.py"], "submit": ["--", "train.py"], "lint": ["--", "job.sh"],
        "run": ["--", "no_such_training_script.py"], "clusters": [], "doctor": [],
        "port": ["--", "job.sh"], "env": []}
SKIP = {"submit": ("--wait",), "run": ("--module",)}   # follow a job / start a module: never here
OWN_SUBMIT = ("--run-dir", "--job-name", "--output", "--json", "--dry-run")  # decide submit's own paths


@pytest.mark.parametrize("verb", sorted(VALID))
def test_every_flag_with_every_nasty_value(verb: str) -> None:
    """Deterministic sweep: each flag of the verb, alone, with each value of NASTY."""
    for flag, takes in _flags(verb):
        if flag in SKIP.get(verb, ()) or (verb == "submit" and flag not in OWN_SUBMIT):
            continue   # submit's plan flags are swept under plan (the same definitions)
        for value in (NASTY if takes else [""]):
            middle = [flag, value] if takes else [flag]
            _check([*VALID[verb], *middle, *TAIL[verb]])
    for value in NASTY:                       # the value as the positional argument
        if verb in ("plan", "submit"):
            _check([*VALID[verb], "--", value or "x.py", value])
        elif verb in ("lint", "clusters", "port", "env", "status", "logs", "cancel", "report"):
            _check([*VALID[verb], "--", value])


# CI runs a fixed sample; SCALETRAIN_FUZZ_EXAMPLES=2000 digs deeper (random, not derandomized).
_DEEP = int(os.environ.get("SCALETRAIN_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_DEEP or 60, deadline=None, derandomize=not _DEEP, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
_script = st.one_of(st.just("train.py"), _value)
_plan_base = st.sampled_from([VALID["plan"][1:], VALID["plan"][1:], ["--cluster", "local", "--gpus", "2"],
                              ["--cluster", "lumi", "--account", "p1", "--nodes", "2"], []])


@FUZZ
@given(base=_plan_base, pairs=_pairs("plan"), script=_script, rest=st.lists(_value, max_size=3))
def test_plan_fuzz(base: list[str], pairs: list[str], script: str, rest: list[str]) -> None:
    _check(["plan", *base, *pairs, "--", script, *rest])


@FUZZ
@given(base=_plan_base, pairs=_pairs("submit", skip=("--wait",)), script=_script,
       rest=st.lists(_value, max_size=3))
def test_submit_fuzz(base: list[str], pairs: list[str], script: str, rest: list[str]) -> None:
    _check(["submit", "--dry-run", *base, *pairs, "--", script, *rest])


@FUZZ
@given(pairs=_pairs("lint"), files=st.lists(st.one_of(st.just("job.sh"), st.just("folder"), _value),
                                              min_size=1, max_size=3))
def test_lint_fuzz(pairs: list[str], files: list[str]) -> None:
    _check(["lint", *pairs, "--", *files])


@FUZZ
@given(pairs=_pairs("run", skip=("--module",)), rest=st.lists(_value, max_size=2))
def test_run_fuzz(pairs: list[str], rest: list[str]) -> None:
    # the target never exists and -m is left out, so no worker is ever started
    _check(["run", *pairs, "--", "no_such_training_script.py", *rest])


@FUZZ
@given(name=st.one_of(st.just([]), _value.map(lambda v: [v])), pairs=_pairs("clusters"))
def test_clusters_fuzz(name: list[str], pairs: list[str]) -> None:
    _check(["clusters", *pairs, *name])


@FUZZ
@given(pairs=_pairs("port"), files=st.lists(st.one_of(st.just("job.sh"), st.just("folder"), _value),
                                              min_size=1, max_size=1))
def test_port_fuzz(pairs: list[str], files: list[str]) -> None:
    _check(["port", "--cluster", "roihu", *pairs, "--", *files])


@FUZZ
@given(pairs=_pairs("env", skip=("--dry-run",)), rest=st.lists(_value, max_size=1))
def test_env_create_fuzz(pairs: list[str], rest: list[str]) -> None:
    _check(["env", "create", "--dry-run", *pairs, "--", *rest])


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(verb=st.sampled_from(["plan", "lint", "submit", "clusters"]),
       raw=st.lists(st.binary(min_size=1, max_size=10).filter(lambda b: b"\0" not in b), max_size=4))
def test_real_process_with_raw_bytes(verb: str, raw: list[bytes]) -> None:
    """The same promises through a real interpreter, arguments as the OS hands them over."""
    with _sandbox() as root:
        before = _snapshot(root)
        extra = [b"--dry-run"] if verb == "submit" else []
        argv = [sys.executable.encode(), b"-m", b"scaletrain", verb.encode(), *extra, *raw]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        proc = subprocess.run(argv, capture_output=True, timeout=120, env=env, check=False)
        assert proc.returncode in CODES, proc.stderr
        assert b"Traceback" not in proc.stderr, proc.stderr
        for path, data in before.items():
            assert path.read_bytes() == data, path


def test_fuzz_sees_every_verb() -> None:
    """A verb added to the CLI must be added here too."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    fuzzed = {"plan", "submit", "lint", "run", "clusters", "doctor", "bench", "port", "env", "status", "logs",
              "cancel", "report"}
    missing = set(sub.choices) - fuzzed
    if missing:
        pytest.fail(f"verbs without a fuzz test: {sorted(missing)}")


class _Launched(Exception):
    """A bench command got past its checks and would start workers now."""


@pytest.mark.parametrize("kind", ["comm", "scaling"])
def test_bench_flags_with_every_nasty_value(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flag of ``bench KIND`` with each NASTY value: one line and a hint, or past the checks
    (where the benchmark's own runs are stubbed: they start processes for minutes)."""
    import scaletrain.bench.scaling as scaling
    import scaletrain.bench.scaling_slurm as scaling_slurm
    import scaletrain.cli.bench as bench

    def launched(*args: object, **kwargs: object) -> None:
        raise _Launched()

    monkeypatch.setattr(bench.subprocess, "run", launched)
    monkeypatch.setattr(scaling, "run_scaling", launched)
    monkeypatch.setattr(scaling_slurm, "run_slurm_scaling", launched)   # --nodes: would submit jobs
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    kinds = next(a for a in sub.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction))
    flags = [(max(a.option_strings, key=len), a.nargs != 0) for a in kinds.choices[kind]._actions
             if a.option_strings and "--help" not in a.option_strings]
    for flag, takes in flags:
        for value in (NASTY if takes else [""]):
            try:
                _check(["bench", kind, flag, value] if takes else ["bench", kind, flag])
            except _Launched:
                pass
    for value in NASTY:
        _check(["bench", value])
