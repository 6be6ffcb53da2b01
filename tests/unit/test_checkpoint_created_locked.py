"""A save's ``.partial-`` folder appears only with its lock and owner record in it, so a save
killed at any moment of making it leaves nothing that the next load keeps: the folder a kill
left between ``mkdir`` and the lock (``.creating-``) is never taken for a live writer's
``.partial-`` one, which clean-up leaves alone for a grace period."""

from __future__ import annotations

import os
from pathlib import Path

from scaletrain.checkpoint import stepfolder


def _killed_while_creating(directory: Path, at: str) -> None:
    """A process that starts a save of step 26 and dies (os._exit, no clean-up) at ``at``."""
    pid = os.fork()
    if pid == 0:
        if at == "lock":
            os.open = lambda *a, **k: os._exit(0)   # dies between its mkdir and its lock file
        else:
            real = os.rename
            os.rename = lambda *a: os._exit(0) if at == "rename" else real(*a)
        try:
            stepfolder.PartialFolder(directory, 26).create()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_a_save_killed_before_its_lock_leaves_no_partial_folder_a_load_keeps(tmp_path):
    _killed_while_creating(tmp_path, "lock")
    stepfolder.clean_partials(tmp_path)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".partial-")]
    # what it left is the not-yet-partial folder, removed once older than the grace period
    left = os.listdir(tmp_path)
    assert len(left) == 1 and left[0].startswith(".creating-partial-step-00000026-")
    old = os.stat(tmp_path / left[0]).st_mtime - stepfolder.GRACE_S - 1
    os.utime(tmp_path / left[0], (old, old))
    assert stepfolder.clean_partials(tmp_path) == left and os.listdir(tmp_path) == []


def test_a_save_killed_once_locked_leaves_a_partial_folder_removed_at_once(tmp_path):
    _killed_while_creating(tmp_path, "rename")
    assert len(os.listdir(tmp_path)) == 1
    stepfolder.clean_partials(tmp_path)   # its owner is dead and its lock free: not a live writer
    assert os.listdir(tmp_path) == []


def test_a_live_writers_new_folder_is_left_alone(tmp_path):
    mine = stepfolder.PartialFolder(tmp_path, 26)
    mine.create()
    try:
        assert [n for n in os.listdir(tmp_path)] == [mine.path.name]
        pid = os.fork()
        if pid == 0:   # another process cleaning up meanwhile
            os._exit(0 if stepfolder.clean_partials(tmp_path) == [] else 1)
        assert os.waitpid(pid, 0)[1] == 0 and mine.path.is_dir()
    finally:
        mine.abandon()
