"""A finished run always ends, and nothing a program still does is lost: the worker records that
it tears its group down and lets gloo's threads go idle before torch's shutdown; the launcher's
watch waits for every worker to be done, then ends the survivors none of whose threads (daemon
threads aside) or child processes used CPU over a wait, wherever they wait, and leaves one that
works to finish, saying so, up to an outer bound. The real launches are in
tests/multiproc/test_launch_teardown.py."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import types

import pytest

from scaletrain.contract.environ import TEARDOWN_WAIT_VAR, TEARDOWN_WORK_VAR
from scaletrain.launch import busy, rundir, teardown
from scaletrain.launch.inproc import group_record, hang
from scaletrain.settings import SettingError


def test_destroying_the_default_group_records_then_settles_then_destroys(tmp_path, monkeypatch):
    order: list[str] = []
    c10d = types.SimpleNamespace(init_process_group=lambda *a, **k: None,
                                 destroy_process_group=lambda group=None: order.append(
                                     f"destroy {group}"))
    monkeypatch.setattr(group_record, "_STATE", {"folder": str(tmp_path), "rank": "1"})
    from scaletrain.runtime import settle

    monkeypatch.setattr(settle, "settle_gloo_workers", lambda: order.append("settle"))
    group_record.patch_c10d(c10d)
    c10d.destroy_process_group("sub")      # a subgroup: no record, no wait
    c10d.destroy_process_group()
    assert order == ["destroy sub", "settle", "destroy None"]
    records = group_record.read_records(tmp_path)
    assert len(records.torn_down) == 1 and records.torn_down == {os.getpid()}


@pytest.mark.parametrize("environ, wait, work", [
    ({}, 30.0, 3600.0), ({TEARDOWN_WAIT_VAR: "5"}, 5.0, 3600.0), ({TEARDOWN_WAIT_VAR: " "}, 30.0, 3600.0),
    ({TEARDOWN_WAIT_VAR: "0.5", TEARDOWN_WORK_VAR: "60"}, 0.5, 60.0)])
def test_the_bounds_are_positive_seconds(environ, wait, work):
    assert teardown.bounds(environ) == teardown.Bounds(wait_s=wait, work_s=work)


@pytest.mark.parametrize("name", [TEARDOWN_WAIT_VAR, TEARDOWN_WORK_VAR])
@pytest.mark.parametrize("text", ["x", "0", "-1", "inf", "nan", "1e400", "5s", "1e9"])
def test_a_bound_that_is_no_positive_number_is_one_line_naming_it(name, text):
    with pytest.raises(SettingError) as info:   # before: silently 30 s
        teardown.bounds({name: text})
    assert info.value.message == (f"{name} must be a finite number above 0 and at most 604800 (s), "
                                  f"got {text!r}")
    assert info.value.exit_code == 2 and info.value.hint


def test_the_run_refuses_a_garbage_bound_before_any_worker_starts(capsys, monkeypatch, tmp_path):
    from helpers import run_cli

    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    monkeypatch.setenv(TEARDOWN_WAIT_VAR, "thirty")
    code, out, err = run_cli(capsys, "run", "--nproc-per-node", "1", str(script))
    assert code == 2 and "ran" not in out + err and "Traceback" not in err
    assert err.startswith(f"scaletrain: error: {TEARDOWN_WAIT_VAR} must be a finite number")


def _publish(run_dir, rank: int, pid: int, thread: int = 0) -> None:
    rundir.write_rank_info(run_dir, rundir.RankInfo(rank=rank, host=socket.gethostname(),
                                                    pid=pid, thread=thread))


def _start(code: str) -> subprocess.Popen:
    """A live process running ``code``, once it printed its first line (its start-up's CPU
    is then behind it)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    proc.first_line = proc.stdout.readline().strip()  # type: ignore[attr-defined]
    return proc


SLEEP = "import time; print('up', flush=True); time.sleep(120)"
SPIN = "print('up', flush=True)\nwhile True: pass"
# a daemon thread that spins, and a main thread asleep; prints the daemon's kernel thread id
DAEMON_SPINS = ("import threading, time\n"
                "def spin():\n    while True: pass\n"
                "t = threading.Thread(target=spin, daemon=True); t.start()\n"
                "print(t.native_id, flush=True); time.sleep(120)")
CHILD_SPINS = (f"import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', {SPIN!r}], "
               "stdout=subprocess.PIPE); child.stdout.readline(); print('up', flush=True); child.wait()")


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        started.append(_start(code))
        return started[-1]

    yield start
    for proc in started:
        for kid in busy.descendants(proc.pid):
            os.kill(kid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        proc.stdout.close()


def _until_worked(pid: int, ticks: int = 3 * busy.WORK_TICKS) -> None:
    """Let a spinning process run until it has used ``ticks`` more (bounded by the test's own
    timeout: a starved machine only makes the test slower)."""
    first = busy.sample(pid)
    while sum(busy.used(first, busy.sample(pid)).values()) < ticks:
        os.sched_yield()


def _watch(tmp_path, ranks, wait_s=5.0, work_s=3600.0) -> tuple[teardown.TeardownWatch, io.StringIO]:
    records = tmp_path / "groups"
    records.mkdir(exist_ok=True)
    out = io.StringIO()
    return teardown.TeardownWatch(str(tmp_path), str(records), ranks,
                                  teardown.Bounds(wait_s=wait_s, work_s=work_s), out=out), out


def _main_at(monkeypatch, path: str, line: int, func: str) -> list[int]:
    """Stacks asked for show the main thread (ident 7) at ``path:line in func``; returns the
    list each request appends to."""
    dump = (f"Current thread 0x{7:016x} (most recent call first):\n"
            f'  File "{path}", line {line} in {func}\n')
    asked: list[int] = []
    monkeypatch.setattr(teardown.hang, "stacks_of",
                        lambda run_dir, skip, infos=None: asked.append(1) or {0: dump})
    return asked


def test_the_watch_waits_until_every_worker_is_done(tmp_path, procs, monkeypatch):
    monkeypatch.setattr(teardown.hang, "stacks_of", lambda run_dir, skip, infos=None: {})
    sleepers = [procs(SLEEP), procs(SLEEP)]
    _publish(tmp_path, 0, sleepers[0].pid)
    _publish(tmp_path, 1, sleepers[1].pid)
    watch, out = _watch(tmp_path, [0, 1])
    rundir.write_finished(tmp_path, 0)
    watch.poll(0.0)
    watch.poll(100.0)
    assert sleepers[0].poll() is None and not watch.stopped  # rank 1 is still training
    rundir.write_finished(tmp_path, 1, [])
    watch.poll(200.0)                                     # the clock starts
    watch.poll(204.0)
    assert sleepers[0].poll() is None and not watch.ended_training()
    watch.poll(205.5)                                     # past the wait: no stack, no CPU
    assert [s.wait(timeout=30) for s in sleepers] == [-9, -9]
    assert watch.ended_training() and set(watch.stopped) == {0, 1}
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "its exit waits on its main thread (it gave no stack)" in lines[0]


def test_a_survivor_waiting_in_its_own_code_is_ended(tmp_path, procs, monkeypatch):
    _main_at(monkeypatch, "/home/u/train.py", 40, "evaluate")
    sleeper = procs(SLEEP)
    _publish(tmp_path, 0, sleeper.pid, thread=7)
    watch, out = _watch(tmp_path, [0], wait_s=1)
    # it called destroy_process_group() and its program has not returned (no thread record)
    (tmp_path / "groups" / "teardown-rank0-pid1.json").write_text(f'{{"pid": {sleeper.pid}}}')
    watch.poll(0.0)
    watch.poll(2.0)
    # before: left alone for ever (its innermost frame is the program's)
    assert sleeper.wait(timeout=30) == -9 and watch.stopped == {0: "/home/u/train.py:40 in evaluate"}
    assert out.getvalue() == (
        f"scaletrain: rank 0 (pid {sleeper.pid}) finished training but had not exited 2 s later; its "
        "exit waits on its main thread at /home/u/train.py:40 in evaluate; none of its threads "
        f"used CPU in the last 1 s: ended it (its stack: {rundir.stack_path(tmp_path, 0)})\n")


def test_a_survivor_that_works_is_told_once_left_then_ended_at_the_outer_bound(tmp_path, procs, monkeypatch):
    asked = _main_at(monkeypatch, "/home/u/train.py", 50, "upload")
    spinner = procs(SPIN)
    _publish(tmp_path, 0, spinner.pid, thread=7)
    rundir.write_finished(tmp_path, 0)   # a program that returned without saying its threads
    watch, out = _watch(tmp_path, [0], wait_s=1, work_s=10)
    watch.poll(0.0)
    for now in (2.0, 4.0, 6.0):
        _until_worked(spinner.pid)
        watch.poll(now)
    assert spinner.poll() is None and not watch.stopped
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and len(asked) == 1, lines   # said once, its stack asked once
    assert lines[0].startswith(f"scaletrain: rank 0 (pid {spinner.pid}) finished training but had "
                               "not exited 2 s later; its exit waits on its main thread at "
                               "/home/u/train.py:50 in upload; its main thread (")
    assert lines[0].endswith(" s of CPU) still works: left to finish, and ended if it has not "
                             f"exited 10 s after training ({TEARDOWN_WORK_VAR})")
    _until_worked(spinner.pid)
    watch.poll(11.0)                                   # past the outer bound
    assert spinner.wait(timeout=30) == -9 and watch.ended_training()
    last = out.getvalue().splitlines()[-1]
    assert "still worked 11 s after training: ended it" in last and f"{TEARDOWN_WORK_VAR}=10" in last


def test_a_daemon_threads_work_does_not_hold_the_exit(tmp_path, procs, monkeypatch):
    monkeypatch.setattr(teardown.hang, "stacks_of", lambda run_dir, skip, infos=None: {})
    proc = procs(DAEMON_SPINS)
    spinner = int(proc.first_line)
    _publish(tmp_path, 0, proc.pid)
    rundir.write_finished(tmp_path, 0, [rundir.ThreadInfo(ident=1, native_id=spinner,
                                                          name="heartbeat", daemon=True)])
    watch, _ = _watch(tmp_path, [0], wait_s=1)
    watch.poll(0.0)
    _until_worked(proc.pid)
    watch.poll(2.0)
    assert proc.wait(timeout=30) == -9


def test_a_child_process_that_works_keeps_its_worker(tmp_path, procs, monkeypatch):
    _main_at(monkeypatch, "/usr/lib/python3.11/subprocess.py", 2004, "_try_wait")
    parent = procs(CHILD_SPINS)
    _publish(tmp_path, 0, parent.pid, thread=7)
    rundir.write_finished(tmp_path, 0, [])
    watch, out = _watch(tmp_path, [0], wait_s=1)
    watch.poll(0.0)
    _until_worked(parent.pid)
    watch.poll(2.0)
    assert parent.poll() is None and not watch.stopped
    child = busy.descendants(parent.pid).pop()
    assert f"its child process {child} 'python" in out.getvalue()


def test_a_stack_request_never_kills_a_process_that_does_not_catch_it(tmp_path, procs):
    sleeper = procs(SLEEP)   # the stack signal at its default action: terminate
    _publish(tmp_path, 0, sleeper.pid)
    assert hang.stacks_of(str(tmp_path), skip=set()) == {}
    assert sleeper.poll() is None   # before: killed by signal 37


def test_the_stack_signal_is_ignored_once_the_handler_is_gone(tmp_path):
    code = ("import os, signal, sys\n"
            "from scaletrain.launch.inproc import hang\n"
            f"fh = hang.install_stack_dump({str(tmp_path)!r}, 0, 0)\n"
            "hang.remove_if_empty(fh)   # as the interpreter's exit removes faulthandler's handler\n"
            "os.kill(os.getpid(), hang.stack_signal())\n"
            "print('alive')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0 and proc.stdout == "alive\n", proc.stderr   # before: signal 37
