"""The pipeline schedule probe: a hang or an abort of torch's schedule over gloo becomes a
choice of GPipe or one line naming torch and the schedule (parallel/pipeline_probe.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from scaletrain.errors import StrategyError
from scaletrain.parallel import pipeline_probe
from scaletrain.runtime.settle import destroy_group


@pytest.fixture
def fresh(monkeypatch):
    pipeline_probe.probe_schedule.cache_clear()
    yield
    pipeline_probe.probe_schedule.cache_clear()


def test_a_hanging_schedule_is_reported_after_the_time_limit(fresh, monkeypatch):
    monkeypatch.setattr(pipeline_probe, "_PROGRAM", "import time; time.sleep(60)")
    monkeypatch.setattr(pipeline_probe, "PROBE_TIMEOUT_S", 1.0)
    assert pipeline_probe.probe_schedule("1f1b") == \
        "waits for ever in its first step (no step within 1 s)"


def test_an_abort_in_gloo_is_reported_in_gloos_words(fresh, monkeypatch):
    program = ("import os, sys; sys.stderr.write(\"what():  [enforce fail at pair.cc:456] 8 vs 4. "
               "Received data size doesn't match expected size. Is there a mismatch\\n\"); "
               "sys.stderr.flush(); os.abort()")
    monkeypatch.setattr(pipeline_probe, "_PROGRAM", program)
    assert pipeline_probe.probe_schedule("gpipe") == \
        "aborts in gloo (8 vs 4. Received data size doesn't match expected size.)"


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path}/pg")
    yield
    destroy_group()


def test_gpipe_is_chosen_where_only_it_runs(group, monkeypatch, capsys):
    answers = {"1f1b": "waits for ever in its first step", "gpipe": None}
    monkeypatch.setattr(pipeline_probe, "probe_schedule", answers.get)
    assert pipeline_probe.choose_schedule("1f1b", "gloo") == "gpipe"
    line = capsys.readouterr().err.strip()
    assert line == (f"scaletrain: pipeline schedule '1f1b' over gloo on torch {torch.__version__}"
                    " waits for ever in its first step (probed); using 'gpipe' instead")


def test_a_torch_where_no_schedule_runs_is_refused_in_one_line(group, monkeypatch):
    monkeypatch.setattr(pipeline_probe, "probe_schedule", lambda name: "aborts in gloo (x)")
    with pytest.raises(StrategyError) as err:
        pipeline_probe.choose_schedule("1f1b", "gloo")
    assert err.value.message == (f"pipeline schedule '1f1b' over gloo on torch {torch.__version__} "
                              "aborts in gloo (x), and so does 'gpipe' (probed)")


def test_a_working_schedule_is_kept_and_other_backends_are_not_probed(group, monkeypatch):
    monkeypatch.setattr(pipeline_probe, "probe_schedule", lambda name: None)
    assert pipeline_probe.choose_schedule("1f1b", "gloo") == "1f1b"
    monkeypatch.setattr(pipeline_probe, "probe_schedule", lambda name: pytest.fail("probed"))
    assert pipeline_probe.choose_schedule("1f1b", "nccl") == "1f1b"


# Releases measured to abort every schedule over gloo (docs/torch-support.md): there the probe
# must find the abort; on every other release the range runs (2.6.0, 2.7.1, 2.8.0, 2.13.0,
# 2.15.0) GPipe runs, so a broken probe program (which would report an abort) fails the test.
GPIPE_ABORTS_OVER_GLOO = {"2.9": "Received data size doesn't match expected size"}


def test_this_torch_runs_gpipe_over_gloo_in_the_probe(fresh):
    import torch

    found = pipeline_probe.probe_schedule("gpipe")
    aborts = GPIPE_ABORTS_OVER_GLOO.get(".".join(torch.__version__.split(".")[:2]))
    if aborts is None:
        assert found is None
    else:
        assert found is not None and found.startswith("aborts in gloo (") and aborts in found
