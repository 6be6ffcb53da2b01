"""Error locations are printed as a user finds them: relative below the working directory, absolute
outside it (``../../tmp/x/train.py`` was printed for a program in /tmp)."""

from __future__ import annotations

import os

from scaletrain.launch.frames import short_path


def test_a_path_below_the_working_directory_is_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert short_path(str(tmp_path / "src" / "train.py")) == os.path.join("src", "train.py")


def test_a_path_outside_the_working_directory_stays_absolute(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    outside = str(tmp_path / "other" / "train.py")
    assert short_path(outside) == outside
    assert short_path(str(tmp_path)) == str(tmp_path)
    sibling_like = str(tmp_path / "work..x" / "t.py")   # a name that starts with '..' is not outside
    assert short_path(str(tmp_path / "work" / "..x" / "t.py")) == os.path.join("..x", "t.py")
    assert short_path(sibling_like) == sibling_like
