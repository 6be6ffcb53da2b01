"""Checkpoint folder rules (scaletrain.checkpoint.layout, the readers' rule, and .stepfolder, the writer's side):
pure file-system logic, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaletrain.checkpoint import layout, stepfolder
from scaletrain.errors import UsageError


def _commit(directory, step, files=None):
    folder = stepfolder.PartialFolder(directory, step)
    folder.create()
    files = files or {"a.bin": b"x" * (step % 7 + 1)}
    for name, data in files.items():
        (folder.path / name).write_bytes(data)
    marker = {"format": 1, "step": step, "files": {n: len(d) for n, d in files.items()}}
    return folder.commit(marker)


def test_names_sort_like_steps():
    assert layout.step_dirname(1200) == "step-00001200"
    assert layout.step_dirname(123456789) == "step-123456789"
    names = [layout.step_dirname(s) for s in (5, 40, 300, 2000)]
    assert sorted(names) == names
    assert layout.partial_dirname(7).startswith(".partial-step-00000007-")


def test_fresh_directory_has_no_latest(tmp_path):
    assert layout.highest_committed(tmp_path) is None
    assert layout.highest_committed(tmp_path / "missing") is None


def test_latest_is_highest_committed_step(tmp_path):
    for step in (10, 30):
        _commit(tmp_path, step)
    with pytest.warns(UserWarning, match="step 20 saved in .* already holds step 30: the step went backwards"):
        _commit(tmp_path, 20)
    assert [c.step for c in layout.committed(tmp_path)] == [10, 20, 30]
    assert layout.highest_committed(tmp_path).step == 30 and layout.choose(tmp_path).step == 30
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_folder_without_marker_or_partial_is_ignored(tmp_path):
    _commit(tmp_path, 10)
    (tmp_path / "step-00000050").mkdir()  # renamed but marker never written (killed)
    (tmp_path / "step-00000050" / "replicated.pt").write_bytes(b"half")
    partial = stepfolder.PartialFolder(tmp_path, 60)
    partial.create()  # a save in progress
    (tmp_path / "step-00000070").mkdir()  # marker naming another step: not ours
    (tmp_path / "step-00000070" / layout.MARKER).write_text(json.dumps({"step": 9, "files": {}}))
    (tmp_path / "step-00000080").mkdir()  # garbage marker
    (tmp_path / "step-00000080" / layout.MARKER).write_text("{not json")
    (tmp_path / "notes.txt").write_text("user file")
    assert layout.highest_committed(tmp_path).step == 10
    partial.abandon()


def test_verify_files_reports_missing_and_truncated(tmp_path):
    path = _commit(tmp_path, 5, {"a.bin": b"12345", "b.bin": b"xy"})
    marker = layout.read_marker(path)
    assert layout.verify_files(path, marker) is None
    (path / "a.bin").write_bytes(b"12")
    assert "a.bin has 2 bytes" in layout.verify_files(path, marker)
    (path / "b.bin").unlink()
    (path / "a.bin").write_bytes(b"12345")
    assert layout.verify_files(path, marker) == "b.bin is missing"


@given(st.lists(st.integers(0, 10_000), max_size=30), st.integers(1, 6),
       st.sets(st.integers(0, 10_000), max_size=3))
def test_retention_keeps_newest_k_and_protected(steps, keep, protect):
    doomed = stepfolder.to_delete(steps, keep, protect)
    survivors = sorted(set(steps) - set(doomed))
    assert not set(doomed) & protect
    if steps:
        assert max(steps) in survivors  # the last valid checkpoint is never deleted
        newest = sorted(set(steps))[-keep:]
        assert set(newest) <= set(survivors)
        assert len(survivors) <= keep + len(protect & set(steps))
    assert set(doomed) <= set(steps)


def test_retention_rejects_keep_zero():
    with pytest.raises(ValueError):
        stepfolder.to_delete([1, 2], 0, set())


def test_apply_retention_deletes_oldest_and_marker_first(tmp_path):
    for step in (1, 2, 3, 4):
        _commit(tmp_path, step)
    assert stepfolder.apply_retention(tmp_path, 2, protect={4}) == [1, 2]
    assert [c.step for c in layout.committed(tmp_path)] == [3, 4]
    assert sorted(os.listdir(tmp_path)) == ["step-00000003", "step-00000004"]


def test_protected_older_step_survives_retention(tmp_path):
    for step in (10, 20, 30):
        _commit(tmp_path, step)
    with pytest.warns(UserWarning, match="the step went backwards"):
        _commit(tmp_path, 5)  # a lower step just written (e.g. a restarted schedule)
    stepfolder.apply_retention(tmp_path, 1, protect={5})
    assert [c.step for c in layout.committed(tmp_path)] == [5, 30]


def test_resave_same_step_replaces_it(tmp_path):
    _commit(tmp_path, 7, {"a.bin": b"old"})
    path = _commit(tmp_path, 7, {"a.bin": b"newer"})
    assert (path / "a.bin").read_bytes() == b"newer"
    assert [c.step for c in layout.committed(tmp_path)] == [7]
    assert sorted(os.listdir(tmp_path)) == ["step-00000007"]


def test_moved_aside_copy_counts_when_swap_was_interrupted(tmp_path):
    path = _commit(tmp_path, 7, {"a.bin": b"old"})
    # a kill between "move the old step-7 aside" and "write the new marker"
    aside = tmp_path / ".replaced-step-00000007-abcd1234"
    os.replace(path, aside)
    (tmp_path / "step-00000007").mkdir()
    latest = layout.highest_committed(tmp_path)
    assert latest.step == 7 and latest.path == aside


def test_clean_partials_removes_dead_writers_only(tmp_path):
    live = stepfolder.PartialFolder(tmp_path, 3)
    live.create()  # this process holds the lock
    dead = tmp_path / layout.partial_dirname(2)
    dead.mkdir()
    (dead / "replicated.pt").write_bytes(b"half")
    # a writer that died: its owner file names a PID that no longer exists
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = tmp_path / layout.partial_dirname(4)
    gone.mkdir()
    (gone / stepfolder.OWNER).write_text(json.dumps({"host": os.uname().nodename,
                                                 "pid": int(proc.stdout), "time": 0}))
    # without lock and owner record, a fresh folder is one being created (mkdir, then the lock)
    assert stepfolder.clean_partials(tmp_path) == [gone.name] and dead.is_dir()
    past = os.stat(dead).st_mtime - stepfolder.GRACE_S - 1
    os.utime(dead, (past, past))
    removed = stepfolder.clean_partials(tmp_path)
    assert removed == [dead.name]
    assert live.path.is_dir()
    live.abandon()
    assert not live.path.exists()


def test_clean_partials_keeps_folder_of_live_process(tmp_path):
    folder = tmp_path / layout.partial_dirname(9)
    folder.mkdir()
    # the parent of this test is alive: a live writer on this host
    (folder / stepfolder.OWNER).write_text(json.dumps({"host": os.uname().nodename,
                                                   "pid": os.getppid(), "time": 0}))
    assert stepfolder.clean_partials(tmp_path) == []
    assert folder.is_dir()


def test_check_directory_refuses_file_and_unwritable(tmp_path):
    stepfolder.check_directory(tmp_path / "new" / "ckpt")
    assert (tmp_path / "new" / "ckpt").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        stepfolder.check_directory(tmp_path / "file")
    with pytest.raises(UsageError, match="cannot create"):
        stepfolder.check_directory(tmp_path / "file" / "sub")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(UsageError, match="not writable"):
            stepfolder.check_directory(ro)
