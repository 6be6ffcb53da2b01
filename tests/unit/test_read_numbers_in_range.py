"""Every number we read is checked for range before arithmetic: a metrics.jsonl, a summary.json or a
cluster profile holding 10**400, 1e400, NaN or Infinity gives a figure "not known" or one line
naming the field, never an OverflowError (``report``, ``status``, ``plan --explain`` and profile
fields raised one); and ``status`` says why a row has no step."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from helpers import run_cli

from scaletrain.clusters.profile import profile_from_dict
from scaletrain.errors import ProfileError
from scaletrain.jobs import runfolder, status
from scaletrain.observe import monitorfiles
from scaletrain.observe.monitorfiles import summary_step

BIG = "1" + "0" * 400
OUT_OF_RANGE = [BIG, "-" + BIG, "1e400", "-1e400", "NaN", "Infinity", "-Infinity"]
FIELDS = ("t", "step", "samples", "samples_per_s", "loss", "step_s", "data_wait_s", "comm_s", "tokens", "mfu",
          "time", "total_steps", "start_step", "world_size", "steps", "step_s_median", "peak_mem_gb")


def _run(folder: Path, value: str) -> Path:
    """A run folder whose every figure, in each kind of record, is ``value`` (one good step first)."""
    folder.mkdir(parents=True)
    every = ", ".join(f'"{f}": {value}' for f in FIELDS)
    (folder / "metrics.jsonl").write_text(
        '{"type": "start", "time": 1000.0, "total_steps": 10}\n'
        '{"type": "step", "step": 1, "t": 1.5, "samples": 64, "samples_per_s": 640.5, "loss": 1.25, "step_s": 0.1}\n'
        f'{{"type": "start", {every}}}\n{{"type": "step", {every}}}\n{{"type": "summary", {every}}}\n')
    (folder / "summary.json").write_text(
        "{" + ", ".join(f'"{f}": {value}' for f in ("step_s_median", "samples_per_step", "world_size",
                                                     "total_samples", "data_wait_frac", "grad_bytes")) + "}")
    return folder


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_report_status_and_explain_take_a_number_out_of_range_as_not_known(capsys, tmp_path, value):
    run = _run(tmp_path / "run", value)
    for argv in (("report", str(run), "--output", str(tmp_path / "r.html")), ("status", str(run)),
                 ("plan", "--explain", str(run), "--cluster", "roihu", "--gpus", "4", "--account", "p",
                  "--", "t.py")):
        code, out, err = run_cli(capsys, *argv)
        assert "Traceback" not in err and "Overflow" not in err, (argv, err)
        assert code in (0, 2), (argv, code, err)


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_the_parser_refuses_the_number_as_it_refuses_text_that_is_not_json(value):
    from scaletrain.jsonfile import loads as parse_json

    with pytest.raises(ValueError):
        parse_json(f'{{"step": {value}}}')
    assert parse_json('{"step": 9223372036854775807, "t": 1.5e300, "x": null}')["step"] == 2**63 - 1


@pytest.mark.parametrize("value", [10**400, float("inf"), float("nan"), -3, "x", True])
def test_the_summary_reader_keeps_only_figures_in_range(value):
    good = {"step_s_median": 0.5, "samples_per_step": 32, "world_size": 4, "total_samples": 1000,
            "data_wait_frac": 0.1, "grad_bytes": 4096}
    assert summary_step({**good, "step_s_median": value}) is None
    step = summary_step({**good, "world_size": value, "grad_bytes": value, "data_wait_frac": value})
    assert step is not None and step.world_size == 1 and step.grad_bytes is None and step.data_wait_frac == 0.0


def _roihu() -> dict:
    root = Path(__file__).resolve().parents[2] / "src" / "scaletrain" / "clusters" / "profiles"
    return tomllib.loads((root / "roihu.toml").read_text())


@pytest.mark.parametrize("field", ["gpus_per_node", "gpu_memory_gb", "cores_per_node", "mem_per_node_gb",
                                   "billing_rate", "partitions.gpumedium.max_nodes"])
def test_a_profile_integer_past_64_bits_is_one_line_naming_the_field(field):
    data = _roihu()
    table = data
    *parents, key = field.split(".")
    for name in parents:
        table = table[name]
    table[key] = 10**400
    with pytest.raises(ProfileError) as info:
        profile_from_dict(data, path="p.toml")
    message = info.value.message
    assert f"field '{field}'" in message and "TOML integers are 64-bit" in message and "\n" not in message


def test_status_says_why_a_row_has_no_step(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"type": "step", "step": 3, "t": 1.0}\n')

    def eio(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(monitorfiles, "open_regular", eio)
    row = status.RunStatus(run=runfolder.open_run(run))
    status._progress(row)
    assert row.step is None and f"cannot read {run / 'metrics.jsonl'}: Input/output error" in row.notes
    monkeypatch.undo()
    (run / "metrics.jsonl").write_text('{"type": "start", "time": 1e400}\n{"type": "step", "step": 1e400}\n')
    row = status.RunStatus(run=runfolder.open_run(run))
    status._progress(row)
    assert any("holds no record the Monitor wrote that can be read" in n for n in row.notes)
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    assert any("is not a regular file: left unread" in n for n in runfolder.open_run(run).notes)
