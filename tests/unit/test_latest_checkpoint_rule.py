"""One rule for "the latest checkpoint" (``checkpoint.layout.choose``): ``status``, ``report`` and the
resume (``Checkpointer.load_latest``) name the same step on every layout the checkpoint tests make,
a damaged newest one and a step that went backwards included (issue 40, issue 39 item 9)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

import scaletrain
from scaletrain.checkpoint import layout
from scaletrain.jobs import report, report_page, status


def _run_folder(tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    ckpt = run / "checkpoints"
    ckpt.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"type": "start", "time": 1.0, "total_steps": 400}) + "\n")
    return run, ckpt


def _save(ckpt: Path, steps: list[int]) -> None:
    model = torch.nn.Linear(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with scaletrain.Checkpointer(ckpt, keep=10) as ck:
            for step in steps:
                with torch.no_grad():
                    model.weight.fill_(float(step))
                ck.save(step, {"model": model, "step": step})


def _views(run: Path) -> tuple[int | None, int | None, list[str], list[str]]:
    """(status's step, report's resume step, status's notes, report's text lines)."""
    row = status.collect([run])[0]
    rep = report.build(run, use_sacct=False)
    return row.checkpoint, rep.resume_step, row.notes, report_page.render_text(rep).splitlines()


def _resume(ckpt: Path) -> tuple[int | None, float, list[str]]:
    model = torch.nn.Linear(2, 2)
    state = {"model": model, "step": 0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with scaletrain.Checkpointer(ckpt, keep=10) as ck:
            step = ck.load_latest(state)
    return step, float(model.weight[0, 0].detach()), [str(w.message) for w in caught]


def _marker_only(ckpt: Path) -> None:   # a hand-edited marker: it names its step, nothing else
    (ckpt / "step-00000300" / "COMMIT.json").write_text(json.dumps({"step": 300}))


def _truncated(ckpt: Path) -> None:
    path = ckpt / "step-00000300" / "replicated.pt"
    path.write_bytes(path.read_bytes()[:20])


def _missing(ckpt: Path) -> None:
    os.unlink(ckpt / "step-00000300" / "replicated.pt")


def _swap_interrupted(ckpt: Path) -> None:  # a kill between moving step 300 aside and the new marker
    os.rename(ckpt / "step-00000300", ckpt / ".replaced-step-00000300-0a1b2c3d")


def _intact(ckpt: Path) -> None:
    pass


@pytest.mark.parametrize("damage, expected", [(_intact, 300), (_marker_only, 200), (_truncated, 200),
                                              (_missing, 200), (_swap_interrupted, 300)])
def test_status_report_and_resume_name_the_same_checkpoint(tmp_path, damage, expected):
    run, ckpt = _run_folder(tmp_path)
    _save(ckpt, [100, 200, 300])
    damage(ckpt)
    shown, reported, notes, lines = _views(run)
    loaded, weight, _ = _resume(ckpt)
    assert (shown, reported, loaded, weight) == (expected, expected, expected, float(expected))
    assert any(f"a resume loads step {expected}" in line for line in lines)
    if damage in (_truncated, _missing):
        assert any("step-00000300 is damaged" in n for n in notes)
    assert _views(run)[:2] == (expected, expected)      # after the resume set the damage aside too


def _flip_late_byte(ckpt: Path) -> None:   # sizes unchanged: only reading every byte finds it
    path = ckpt / "step-00000300" / "replicated.pt"
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_checksum_damage_is_named_by_every_reader_before_the_resume(tmp_path):
    """A small checkpoint's checksums are read by the rule itself: status and report name the step
    the resume will load before it runs, and pass over the damaged one saying why."""
    run, ckpt = _run_folder(tmp_path)
    _save(ckpt, [100, 200, 300])
    _flip_late_byte(ckpt)
    shown, reported, notes, lines = _views(run)
    assert (shown, reported) == (200, 200)
    assert any("step-00000300 is damaged (replicated.pt: its checksum is" in n for n in notes), notes
    assert not any("sizes checked" in line for line in lines)
    loaded, weight, messages = _resume(ckpt)
    assert (loaded, weight) == (200, 200.0)
    assert any("step-00000300" in m and "damaged" in m for m in messages)
    assert _views(run)[:2] == (200, 200)


def test_a_checkpoint_too_big_to_read_is_chosen_by_its_sizes_and_says_so(tmp_path, monkeypatch):
    """Over the bound the checksums are not read: status says "sizes checked" until the resume,
    which reads every byte, sets the damage aside; from then on every reader agrees."""
    run, ckpt = _run_folder(tmp_path)
    _save(ckpt, [100, 200, 300])
    size = sum(p.stat().st_size for p in (ckpt / "step-00000300").iterdir() if p.name != "COMMIT.json")
    monkeypatch.setattr(layout, "VERIFY_BYTES", size - 1)
    _flip_late_byte(ckpt)
    row = status.collect([run])[0]
    assert (row.checkpoint, row.checkpoint_unread) == (300, True)
    assert "checkpoint step 300 (sizes checked)" in status.format_row(row)
    assert any("a resume loads step 300 (sizes checked here; the resume reads its checksums)" in line
               for line in _views(run)[3])
    assert layout.choose(ckpt, verify_bytes=size).step == 200     # the same folder, read: passed over
    assert layout.choose(ckpt, verify_bytes=0).unread
    loaded, _, _ = _resume(ckpt)
    assert loaded == 200
    assert _views(run)[:2] == (200, 200)


def test_a_listing_of_many_runs_reads_at_most_one_checkpoints_worth_of_checksums(tmp_path, monkeypatch):
    """`status` over every run (and --watch, each refresh) shares the bound among the rows: each row
    beyond its share is chosen by its sizes and says so; one run alone is read whole."""
    runs = []
    for name in ("a", "b"):
        run, ckpt = _run_folder(tmp_path / name)
        _save(ckpt, [100, 300])
        _flip_late_byte(ckpt)
        runs.append(run)
    size = sum(p.stat().st_size for p in (runs[0] / "checkpoints" / "step-00000300").iterdir()
               if p.name != "COMMIT.json")
    monkeypatch.setattr(layout, "VERIFY_BYTES", size + size // 2)   # one whole, not two
    read: list[int] = []
    real = layout.choose

    def counting(directory, **kw):
        choice = real(directory, **kw)
        read.append(kw.get("verify_bytes"))
        return choice

    monkeypatch.setattr(status.runfolder, "choose", counting)
    rows = status.collect(runs)
    assert [(r.checkpoint, r.checkpoint_unread) for r in rows] == [(300, True), (300, True)]
    assert sum(read) <= layout.VERIFY_BYTES
    alone = status.collect(runs[:1])[0]
    assert alone.checkpoint == 100   # step 300 read whole: the damage found
    assert any("step-00000300 is damaged" in n for n in alone.notes), alone.notes


def test_a_step_that_went_backwards_is_warned_at_the_save_the_resume_and_in_status(tmp_path):
    run, ckpt = _run_folder(tmp_path)
    _save(ckpt, [100, 200, 300])
    model = torch.nn.Linear(2, 2)
    with pytest.warns(UserWarning, match=r"step 110 saved in .* already holds step 300: the step went backwards"):
        with scaletrain.Checkpointer(ckpt, keep=10) as ck:
            ck.save(110, {"model": model, "step": 110})
    assert layout.read_marker(ckpt / "step-00000110")[layout.SAVED_AFTER] == 300
    shown, reported, notes, lines = _views(run)
    loaded, _, messages = _resume(ckpt)
    assert (shown, reported, loaded) == (300, 300, 300)
    why = "checkpoint step 110 was saved after step 300 (the step went backwards"
    assert any(why in n for n in notes)
    assert any(why in line for line in lines)
    assert any(why in m for m in messages)


def test_a_step_saved_in_order_records_and_warns_nothing(tmp_path):
    _, ckpt = _run_folder(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _save_strict(ckpt)
    assert layout.SAVED_AFTER not in layout.read_marker(ckpt / "step-00000200")
    assert layout.choose(ckpt).notes() == []


def _save_strict(ckpt: Path) -> None:
    model = torch.nn.Linear(2, 2)
    with scaletrain.Checkpointer(ckpt, keep=10) as ck:
        for step in (100, 200):
            ck.save(step, {"model": model})
