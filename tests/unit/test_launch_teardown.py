"""A finished run always ends (issue 39): the worker records that it tears its group down and
lets gloo's threads go idle before torch's shutdown; the launcher's watch waits for every
worker to be done, then stops only survivors that wait inside torch without using CPU.
The real launches are in tests/multiproc/test_launch_teardown.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types

import pytest

from scaletrain.contract.environ import TEARDOWN_WAIT_VAR
from scaletrain.launch import rundir, teardown
from scaletrain.launch.inproc import group_record


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


@pytest.mark.parametrize("text, seconds", [("", 30.0), ("5", 5.0), ("0", 30.0), ("-1", 30.0),
                                           ("inf", 30.0), ("nan", 30.0), ("x", 30.0)])
def test_the_teardown_wait_is_a_positive_number_of_seconds(text, seconds):
    assert teardown.teardown_wait({TEARDOWN_WAIT_VAR: text}) == seconds


def _publish(run_dir, rank: int, pid: int, thread: int = 0) -> None:
    rundir.write_rank_info(run_dir, rundir.RankInfo(rank=rank, host=socket.gethostname(),
                                                    pid=pid, thread=thread))


@pytest.fixture
def sleeper():
    """A live process that uses no CPU (as a deadlocked one) and cannot give a stack."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_watch_waits_until_every_worker_is_done(tmp_path, sleeper, monkeypatch):
    monkeypatch.setattr(teardown.hang, "stacks_of", lambda run_dir, skip: {})
    records = tmp_path / "groups"
    records.mkdir()
    _publish(tmp_path, 0, sleeper.pid)
    _publish(tmp_path, 1, sleeper.pid)
    watch = teardown.TeardownWatch(str(tmp_path), str(records), [0, 1], wait_s=5)
    rundir.write_finished(tmp_path, 0)
    watch.poll(0.0)
    watch.poll(100.0)
    assert sleeper.poll() is None and not watch.stopped  # rank 1 is still training
    rundir.write_finished(tmp_path, 1)
    watch.poll(200.0)                                     # the clock starts
    watch.poll(204.0)
    assert sleeper.poll() is None and not watch.ended_training()
    watch.poll(205.5)                                     # past the wait: no stack, no CPU
    assert sleeper.wait(timeout=30) == -9
    assert watch.ended_training() and set(watch.stopped) == {0, 1}


def test_the_watch_leaves_a_survivor_in_its_own_code(tmp_path, sleeper, monkeypatch):
    dump = (f"Current thread 0x{7:016x} (most recent call first):\n"
            '  File "/home/u/train.py", line 40 in evaluate\n')
    monkeypatch.setattr(teardown.hang, "stacks_of", lambda run_dir, skip: {0: dump})
    records = tmp_path / "groups"
    records.mkdir()
    _publish(tmp_path, 0, sleeper.pid, thread=7)
    rundir.write_finished(tmp_path, 0)
    watch = teardown.TeardownWatch(str(tmp_path), str(records), [0], wait_s=1)
    watch.poll(0.0)
    watch.poll(2.0)
    assert sleeper.poll() is None and not watch.stopped
