"""Tier 1: the `scaletrain run` verb at the CLI edge, in-process (no worker is started).

Errors are one line plus a HINT with the right exit code; the flag list of every verb is
checked against a list kept here, so that growing the CLI is a decision, not an accident.
"""

from __future__ import annotations

import argparse
import socket

import pytest
from helpers import run_cli

from scaletrain.cli.main import build_parser

# Every verb's flags and positionals. Changing the CLI means changing this list on purpose.
EXPECTED_FLAGS: dict[str, list[str]] = {
    "": ["--help", "--version"],
    "run": ["--help", "--nproc-per-node", "--procs-per-gpu", "--max-restarts", "--ranks",
            "--emulate", "--cpu", "--strict", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--module",
            "--timeout", "--run-dir", "target", "args"],
    "plan": ["--help", "--cluster", "--profile", "--partition", "--account", "--gpus", "--nodes",
             "--gpus-per-node", "--time", "--cpus-per-gpu", "--mem-per-gpu", "--launcher",
             "--device", "--container", "--stage-data", "--requeue", "--job-name", "--params",
             "--output", "--json", "script", "script_args",
             "--accelerate-config", "--deepspeed-config", "--precision", "--micro-batch", "--expand-args", "--mail-type", "--mail-user", "--array", "--constraint",
             "--dependency", "--reservation", "--qos", "--log", "--error", "--chdir", "--exclusive", "--sbatch",
             "--module", "--venv", "--conda", "--env", "--setup", "--gpus-per-proc", "--procs-per-gpu", "--cpus", "--mem", "--explain",
             "--sample-gpus"],
    "submit": ["--help", "--cluster", "--profile", "--partition", "--account", "--gpus",
               "--nodes", "--gpus-per-node", "--time", "--cpus-per-gpu", "--mem-per-gpu",
               "--launcher", "--device", "--container", "--stage-data", "--requeue",
               "--job-name", "--params", "--output", "--json", "script", "script_args",
               "--run-dir", "--dry-run", "--no-check", "--wait",
             "--accelerate-config", "--deepspeed-config", "--precision", "--micro-batch", "--expand-args", "--mail-type", "--mail-user", "--array", "--constraint",
             "--dependency", "--reservation", "--qos", "--log", "--error", "--chdir", "--exclusive", "--sbatch",
             "--module", "--venv", "--conda", "--env", "--setup", "--gpus-per-proc", "--procs-per-gpu", "--cpus", "--mem",
             "--sample-gpus"],
    "status": ["--help", "runs", "--watch", "--interval"],
    "logs": ["--help", "run", "--follow", "--rank"],
    "cancel": ["--help", "run", "--save", "--wait"],
    "report": ["--help", "run", "--output"],
    "lint": ["--help", "files", "--cluster", "--profile", "--format"],
    "clusters": ["--help", "cluster", "target", "--json", "--output", "--name", "--partition"],
    "doctor": ["--help", "--timeout", "--size-mb", "--json"],
    "bench": ["--help"],  # its sub-commands' flags: tests/unit/test_bench_units.py
    "port": ["--help", "old", "--cluster", "--profile", "--from", "--account", "--venv", "--output"],
    "env": ["--help"],    # its one action's flags: ENV_CREATE_FLAGS
}
ENV_CREATE_FLAGS = ["--help", "directory", "--cluster", "--profile", "--with", "--container", "--module",
                    "--dry-run"]


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    names = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        long = [o for o in action.option_strings if o.startswith("--")]
        names.append(long[0] if long else (action.option_strings or [action.dest])[0])
    return names


def test_every_verb_flag_is_listed():
    parser = build_parser()
    found = {"": _flags(parser)}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for verb, sub_parser in sub.choices.items():
        found[verb] = _flags(sub_parser)
    for verb, flags in found.items():
        assert verb in EXPECTED_FLAGS, f"new verb {verb!r}: add its flags to EXPECTED_FLAGS"
        assert sorted(flags) == sorted(EXPECTED_FLAGS[verb]), (
            f"`scaletrain {verb}` flags changed: update EXPECTED_FLAGS deliberately")


def test_env_create_flags_are_listed():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    env = next(a for a in sub.choices["env"]._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(_flags(env.choices["create"])) == sorted(ENV_CREATE_FLAGS), (
        "`scaletrain env create` flags changed: update ENV_CREATE_FLAGS deliberately")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


def _run(capsys, argv):
    code, _out, err = run_cli(capsys, *argv)
    return code, [line for line in err.splitlines() if not line.startswith("scaletrain: ") or
                  line.startswith("scaletrain: error:")]


@pytest.mark.parametrize("argv, needle", [
    (["run", "does_not_exist.py"], "script not found: does_not_exist.py"),
    (["run", "--nproc-per-node", "0", "{script}"], "--nproc-per-node must be at least 1"),
    (["run", "--nproc-per-node", "lots", "{script}"], "expected a number or 'auto'"),
    (["run", "--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "{script}"], "outside 0..1"),
    (["run", "--ranks", "3", "{script}"], "invalid choice"),
    (["run"], "required"),
])
def test_usage_errors_are_one_line_with_hint(capsys, clean_env, script, argv, needle):
    code, lines = _run(capsys, [a.format(script=script) for a in argv])
    assert code == 2
    assert lines[0].startswith("scaletrain: error: ") and needle in lines[0]
    assert lines[1].startswith("  HINT: ") and len(lines) == 2  # no traceback


def test_nproc_above_visible_gpus(capsys, clean_env, script):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    code, lines = _run(capsys, ["run", "--nproc-per-node", "3", script])
    assert code == 2 and "more than the 2 GPU(s)" in lines[0]


def test_fixed_port_in_use_is_a_launch_error(capsys, clean_env, script):
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code, lines = _run(capsys, ["run", "--master-port", str(port), script])
    assert code == 1
    assert f"port {port}" in lines[0] and "already in use" in lines[0]
    assert lines[1].startswith("  HINT: ")


def test_environment_contradicting_a_flag(capsys, clean_env, script):
    clean_env.setenv("MASTER_PORT", "29999")
    code, lines = _run(capsys, ["run", "--master-port", "29998", script])
    assert code == 2 and "contradicts MASTER_PORT=29999" in lines[0]


def test_script_args_that_look_like_flags_are_not_parsed(script):
    args = build_parser().parse_args(["run", "--nproc-per-node", "2", script, "--nproc-per-node",
                                      "5", "-m", "--", "x"])
    assert args.nproc_per_node == 2 and args.target == script
    assert args.args == ["--nproc-per-node", "5", "-m", "--", "x"]
    mod = build_parser().parse_args(["run", "-m", "pkg.train", "--lr", "1"])
    assert mod.module and mod.target == "pkg.train" and mod.args == ["--lr", "1"]


def test_run_dir_that_cannot_be_written_is_one_line(capsys, clean_env, script, tmp_path, monkeypatch):
    # issue 22: a read-only or file --run-dir was a FileExistsError/PermissionError traceback
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    code, lines = _run(capsys, ["run", "--run-dir", str(a_file), script])
    assert code == 2 and "is a file, not a folder" in lines[0] and lines[1].startswith("  HINT: ")
    import errno
    import tempfile as tempfile_mod

    def read_only(*_a, **_k):   # root ignores permission bits: the refusal of a read-only mount
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(tempfile_mod, "mkstemp", read_only)
    code, lines = _run(capsys, ["run", "--run-dir", str(tmp_path / "ro"), script])
    assert code == 2 and "Read-only file system" in lines[0]
