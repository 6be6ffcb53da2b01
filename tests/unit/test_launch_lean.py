"""The launcher's own process (launch/lean.py, issue 23): the collector is paused while torch
loads and the imported objects frozen after; once torch is imported under the CLI, the exit
skips only the interpreter's teardown - threads joined, atexit handlers run, output flushed,
the exit code kept. Each case runs in a fresh interpreter (the state is the process's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from workers import worker_env

from scaletrain.launch import lean


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = worker_env()
    env.pop("PYTHONUNBUFFERED")  # stdout to a pipe is then block-buffered: leave() must flush it
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_collector_is_paused_until_the_imports_are_done_then_frozen():
    proc = _python("""
import gc, json
from scaletrain.launch import lean
seen = {}
before = gc.get_freeze_count()  # not 0 everywhere: Python 3.12 starts with objects frozen
with lean.cli_launch():
    seen["paused"] = not gc.isenabled()
    lean.imports_done()
    seen["after"] = gc.isenabled()
    seen["frozen"] = gc.get_freeze_count() > before
seen["end"] = gc.isenabled()
print(json.dumps(seen))
""")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"paused": True, "after": True, "frozen": True, "end": True}


def test_a_block_that_ends_before_torch_restores_the_collector_and_keeps_the_teardown():
    proc = _python("""
import gc
from scaletrain.launch import lean
before = gc.get_freeze_count()  # not 0 everywhere: Python 3.12 starts with objects frozen
try:
    with lean.cli_launch():
        raise ValueError("a usage error before any import")
except ValueError:
    pass
assert gc.isenabled() and gc.get_freeze_count() == before
class Goodbye:
    def __del__(self):
        print("teardown ran", flush=True)
keep = Goodbye()
lean.leave(3)
""")
    assert proc.returncode == 3, proc.stderr
    assert "teardown ran" in proc.stdout  # a plain sys.exit: the interpreter tore down


EXIT_CASE = """
import atexit, threading, time
from scaletrain.launch import lean

class Goodbye:
    def __del__(self):
        print("teardown ran", flush=True)

keep = Goodbye()   # a module global: only the interpreter's teardown deletes it
atexit.register(lambda: print("atexit ran"))
def late():
    time.sleep(0.2)
    print("thread finished")
threading.Thread(target=late).start()   # not a daemon: the exit waits for it
with lean.cli_launch():
    lean.imports_done()
print("buffered, no newline", end="")
lean.leave(7)
"""


def test_the_exit_after_torch_skips_only_the_teardown():
    proc = _python(EXIT_CASE)
    assert proc.returncode == 7, proc.stderr
    out = proc.stdout
    assert "thread finished" in out and "atexit ran" in out and "buffered, no newline" in out
    assert out.index("thread finished") < out.index("atexit ran")  # the interpreter's order
    assert "teardown ran" not in out


def test_outside_the_cli_leave_is_sys_exit(monkeypatch):
    # as in a process that never launched under the CLI (tests here may have, in-process)
    monkeypatch.setattr(lean, "_STATE", {"cli": False, "collector_paused": False, "skip_teardown": False})
    with pytest.raises(SystemExit) as exc:
        lean.leave(5)
    assert exc.value.code == 5
