"""The commit marker is complete, deep JSON is refused, retention finishes, and one rule chooses.

- A checkpoint whose folder holds a file COMMIT.json does not list, or whose marker leaves out a
  file the format needs (``replicated.pt``, a rank file, DCP's metadata), is refused with one line
  and the resume falls back to the previous checkpoint; ``layout.choose`` (status, report) agrees.
- A COMMIT.json nested 100,000 levels is a damaged marker: the resume falls back with one line,
  ``report`` says one line.
- A ``step-N`` folder that an interrupted retention or save left without its marker is removed by
  the next retention pass, unless its writer still holds it or it holds files that are not ours.
- ``layout.choose`` gives the refusals the reader needs (a newer layout, a checksum this Python
  cannot compute) and the reader loads what it chose; ``layout.latest`` is no more.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from helpers import reseal, save_steps, seeded_linear

import scaletrain
from scaletrain.checkpoint import layout, stepfolder
from scaletrain.checkpoint.errors import CheckpointError


_model = seeded_linear


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return save_steps(tmp_path_factory.mktemp("complete") / "ck")


@pytest.fixture
def ck(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "ck"))


def _load(directory: Path, *, strict: bool = False) -> tuple[int | None, list[str], torch.nn.Module]:
    model = _model(0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        step = scaletrain.Checkpointer(directory, strict=strict).load_latest({"model": model, "epoch": 0})
    return step, [str(w.message) for w in seen], model


def _marker(folder: Path) -> dict:
    return json.loads((folder / "COMMIT.json").read_text())


def _write_marker(folder: Path, marker: dict) -> None:
    (folder / "COMMIT.json").write_text(json.dumps(marker))


def _falls_back_naming(ck: Path, words: str) -> None:
    """The resume loads step 20 with one warning naming step 30 and ``words``; strict stops with
    one line; the rule that status and report use chose step 20 too."""
    assert layout.choose(ck).step == 20
    with pytest.raises(CheckpointError) as info:
        _load(ck, strict=True)
    assert len(info.value.message.splitlines()) == 1 and words in info.value.message
    step, notes, model = _load(ck)
    assert step == 20 and torch.equal(model.weight, _model(20).weight)
    named = [n for n in notes if "step-00000030" in n]
    assert len(named) == 1 and words in named[0] and len(named[0].splitlines()) == 1, notes


# -- the marker lists every file of the folder, and every file the format needs --------------

@pytest.mark.parametrize("where", ["notes.txt", "sharded/__1_0.distcp", ".hidden"])
def test_a_file_the_marker_does_not_list_is_refused(ck, where):
    extra = ck / "step-00000030" / where
    extra.parent.mkdir(exist_ok=True)
    extra.write_bytes(b"not listed")
    _falls_back_naming(ck, f"{where!r} is in the folder but not in the commit marker")


def test_a_replicated_file_left_out_of_the_marker_is_refused_not_loaded_unchecked(ck):
    folder = ck / "step-00000030"
    marker = _marker(folder)
    for table in (marker["files"], marker["crc32c" if "crc32c" in marker else "crc32"],
                  marker["blocks"][next(k for k in marker["blocks"] if k != "bytes")]):
        del table["replicated.pt"]
    _write_marker(folder, marker)
    # its bytes damaged: before, nothing checked a file the marker did not list
    data = bytearray((folder / "replicated.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "replicated.pt").write_bytes(bytes(data))
    _falls_back_naming(ck, "does not list replicated.pt")


def test_a_rank_file_left_out_of_a_larger_world_is_refused(ck):
    folder = ck / "step-00000030"
    marker = _marker(folder)
    marker["world_size"] = 2          # rank 1's file neither listed nor there
    _write_marker(folder, marker)
    _falls_back_naming(ck, "does not list rank-00001.pt")


def test_a_world_of_ten_to_the_twelve_is_not_walked(ck):
    folder = ck / "step-00000030"
    marker = _marker(folder)
    marker["world_size"] = 10 ** 12
    _write_marker(folder, marker)
    _falls_back_naming(ck, "does not list rank-00001.pt")


def test_a_sharded_object_without_dcp_metadata_is_refused(ck):
    folder = ck / "step-00000030"
    marker = _marker(folder)
    marker["objects"]["model"]["sharded"] = True
    _write_marker(folder, marker)
    _falls_back_naming(ck, "does not list sharded/.metadata")


def test_the_writers_lock_left_by_a_kill_after_the_marker_does_not_count_as_a_stranger(ck):
    folder = ck / "step-00000030"
    (folder / stepfolder.LOCK).write_bytes(b"")
    (folder / stepfolder.OWNER).write_text("{}")
    assert layout.choose(ck).step == 30
    assert _load(ck, strict=True)[0] == 30


# -- deep JSON ------------------------------------------------------------------------------

def test_a_marker_nested_100000_levels_falls_back_with_one_line(ck):
    (ck / "step-00000030" / "COMMIT.json").write_text("[" * 100_000 + "]" * 100_000)
    _falls_back_naming(ck, "COMMIT.json: it is not valid JSON (JSON nested deeper than 64 levels)")


def test_report_says_one_line_of_a_deep_marker(ck, tmp_path, capsys):
    from scaletrain.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    shutil.move(str(ck), run / "checkpoints")
    (run / "metrics.jsonl").write_text(json.dumps({"type": "start", "time": 1.0, "total_steps": 30}) + "\n")
    (run / "checkpoints" / "step-00000030" / "COMMIT.json").write_text("{\"a\":" * 100_000)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text
    said = [line for line in text.splitlines() if "step-00000030" in line]
    assert len(said) == 1 and "nested deeper than 64 levels" in said[0], text


def test_a_marker_naming_a_key_twice_is_refused(ck):
    folder = ck / "step-00000030"
    text = (folder / "COMMIT.json").read_text()
    (folder / "COMMIT.json").write_text(text.replace('"step": 30', '"step": 30, "step": 30', 1))
    _falls_back_naming(ck, "appears twice")


# -- retention finishes what a kill interrupted ----------------------------------------------

def _aged(path: Path) -> None:
    past = os.stat(path).st_mtime - stepfolder.GRACE_S - 1
    os.utime(path, (past, past))


def test_retention_removes_a_step_folder_left_without_its_marker(ck):
    half = ck / "step-00000010"          # a deletion killed after the marker went
    shutil.copytree(ck / "step-00000020", half)
    (half / "COMMIT.json").unlink()
    _aged(half)
    stepfolder.apply_retention(ck, keep=3, protect={30})
    assert not half.exists()
    assert [c.step for c in layout.committed(ck)] == [20, 30]


def test_retention_leaves_a_live_writers_commit_and_folders_not_ours(ck):
    live = stepfolder.PartialFolder(ck, 40)
    live.create()                         # this process holds the lock...
    shutil.copy(ck / "step-00000030" / "replicated.pt", live.path / "replicated.pt")
    os.rename(live.path, ck / "step-00000040")   # ...through the rename, before its marker
    theirs = ck / "step-00000050"
    theirs.mkdir()
    (theirs / "my-notes.txt").write_text("a folder someone else made")
    young = ck / "step-00000060"          # neither lock nor owner, just made: being created
    young.mkdir()
    _aged(theirs)
    stepfolder.apply_retention(ck, keep=3, protect={30})
    assert (ck / "step-00000040").is_dir() and theirs.is_dir() and young.is_dir()
    live.release()
    _aged(ck / "step-00000040")
    stepfolder.apply_retention(ck, keep=3, protect={30})
    assert not (ck / "step-00000040").exists() and theirs.is_dir()


def test_a_save_after_a_killed_retention_cleans_up(ck):
    half = ck / "step-00000010"
    shutil.copytree(ck / "step-00000020", half)
    (half / "COMMIT.json").unlink()
    _aged(half)
    ckpt = scaletrain.Checkpointer(ck, keep=2)
    ckpt.save(40, {"model": _model(40), "epoch": 40})
    ckpt.close()
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("step-")) == \
        ["step-00000030", "step-00000040"]


# -- one rule: choose gives the refusals, the reader loads what it chose ----------------------

def test_choose_refuses_a_newer_layout_and_the_reader_says_it(ck):
    folder = ck / "step-00000030"
    marker = _marker(folder)
    marker["format"] = 99
    _write_marker(folder, marker)
    choice = layout.choose(ck)
    assert choice.step == 30 and choice.refusal is not None and "format 99" in choice.refusal[0]
    assert any("format 99" in note for note in choice.notes())
    with pytest.raises(CheckpointError) as info:
        _load(ck)
    assert info.value.message == choice.refusal[0] and info.value.hint == choice.refusal[1]


def test_choose_refuses_checksums_this_python_cannot_compute(ck, monkeypatch):
    from scaletrain.checkpoint import checksum

    algorithm = next(a for a in checksum.ALGORITHMS if a in _marker(ck / "step-00000030"))
    monkeypatch.delitem(checksum._FUNCTIONS, algorithm)
    choice = layout.choose(ck)
    assert choice.refusal is not None and "crc32c package is missing" in choice.refusal[0]
    with pytest.raises(CheckpointError, match="crc32c package is missing"):
        _load(ck)


def test_the_reader_loads_what_the_rule_chose(ck, monkeypatch):
    real = layout.choose
    asked = []

    def older_rule(directory, **kwargs):   # a rule that prefers step 20: the reader must follow it
        asked.append(kwargs)
        return real(directory, skip={ck / "step-00000030": "a stand-in rule"}, verify_bytes=0)

    monkeypatch.setattr(layout, "choose", older_rule)
    step, _, model = _load(ck)
    assert asked and step == 20 and torch.equal(model.weight, _model(20).weight)


def test_the_latest_of_the_files_unchecked_has_a_name_of_its_own():
    assert not hasattr(layout, "latest") and callable(layout.highest_committed)
