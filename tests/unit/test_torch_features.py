"""The torch range (scaletrain.torch_features, docs/torch-support.md): every API that differs
between the oldest supported torch and the newest is a feature test, and each has a fallback
that works where the feature is missing. Here the missing features are simulated on this
machine's torch; scripts/test_torch_range.sh runs the tiers on the oldest and newest for real."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import types
import warnings
from pathlib import Path

import pytest
import torch

from scaletrain import torch_features
from scaletrain.launch import local, patches, signals
from scaletrain.launch.spec import RunRequest, plan_launch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_answers():
    """Each feature test caches its answer for the process; a simulated torch needs new ones."""
    torch_features.forget_answers()
    yield
    torch_features.forget_answers()


def test_ci_tests_the_floor_that_pyproject_declares():
    floor = re.search(r'"torch>=([0-9.]+)"', (REPO / "pyproject.toml").read_text())
    pins = {name: (REPO / "constraints" / name).read_text()
            for name in ("torch-oldest.txt", "torch-newest.txt")}
    oldest = re.search(r"^torch==([0-9.]+)$", pins["torch-oldest.txt"], re.MULTILINE)
    newest = re.search(r"^torch==([0-9.]+)$", pins["torch-newest.txt"], re.MULTILINE)
    assert floor is not None and oldest is not None and newest is not None
    assert oldest.group(1) in (floor.group(1), floor.group(1) + ".0")


def test_this_torchs_answers_are_consistent():
    fields = torch_features.launch_config_fields()
    assert {"min_nodes", "nproc_per_node", "logs_specs"} <= fields  # what every torch in range has
    assert {"state_dict", "storage_writer", "process_group"} <= torch_features.dcp_parameters("save")
    assert torch_features.tail_logfile_parameters()[:5] == ("header", "file", "dst", "finished",
                                                           "interval_sec")


def _old_launch_config(monkeypatch, *, drop: set[str]) -> None:
    """Replace torch's LaunchConfig by one without ``drop`` (as torch 2.6/2.11 had)."""
    from torch.distributed.launcher import api

    real = api.LaunchConfig
    kept = [(f.name, f.type, f) for f in dataclasses.fields(real) if f.name not in drop]
    old = dataclasses.make_dataclass("LaunchConfig", kept)
    monkeypatch.setattr(api, "LaunchConfig", old)


@pytest.mark.parametrize("drop", [set(), {"shutdown_timeout"},
                                  {"shutdown_timeout", "signals_to_handle"}])
def test_the_launch_config_takes_only_the_fields_torch_has(monkeypatch, tmp_path, drop):
    """drop: what the simulated torch lacks, besides what this one lacks (2.11: shutdown_timeout;
    2.6-2.9: both)."""
    _old_launch_config(monkeypatch, drop=drop)
    drop = drop | ({"shutdown_timeout", "signals_to_handle"} - torch_features.launch_config_fields())
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    plan = plan_launch(RunRequest(target=str(script), nproc_per_node=2), environ={}, gpus=0)
    config = local._config(plan, logs_specs=None)  # before: TypeError on torch 2.11
    names = {f.name for f in dataclasses.fields(config)}
    assert config.nproc_per_node == 2 and not (drop & names)
    if "signals_to_handle" not in drop:
        assert config.signals_to_handle == signals.TORCH_SIGNALS
    if "shutdown_timeout" not in drop:
        assert config.shutdown_timeout == local.SHUTDOWN_TIMEOUT_S


def _forwarding_handler():
    """A handler of SIGTERM standing for forward_stop_signals'; returns (calls, the previous)."""
    seen: list[int] = []
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    return seen, previous


def test_an_agent_without_a_signal_list_leaves_sigterm_to_the_launcher(monkeypatch):
    """torch 2.6 to 2.9: PContext.start installs its stop-now handler for SIGTERM; inside the
    block that handler passes SIGTERM to ours and stops the workers on the others."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.api import SignalException

    monkeypatch.setattr(patches, "launch_config_fields", lambda: frozenset({"min_nodes"}))
    monkeypatch.setattr(patches, "agent_reads_signals_env", lambda: False)
    torchs = api._terminate_process_handler
    seen, previous = _forwarding_handler()
    try:
        with patches.torch_leaves_forwarded_signals():
            installed = api._terminate_process_handler  # what PContext.start would install
            installed(signal.SIGTERM, None)
            assert seen == [signal.SIGTERM]
            with pytest.raises(SignalException):
                installed(signal.SIGINT, None)
        assert api._terminate_process_handler is torchs
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_agent_that_reads_the_list_from_the_environment_is_told_there(monkeypatch):
    monkeypatch.setattr(patches, "launch_config_fields", lambda: frozenset({"min_nodes"}))
    monkeypatch.setattr(patches, "agent_reads_signals_env", lambda: True)
    monkeypatch.delenv(torch_features.SIGNALS_ENV, raising=False)
    with patches.torch_leaves_forwarded_signals():
        assert os.environ[torch_features.SIGNALS_ENV] == signals.TORCH_SIGNALS
    assert torch_features.SIGNALS_ENV not in os.environ


def test_this_torch_leaves_sigterm_to_the_launcher_one_way_or_another():
    """Run on the oldest and newest torch by CI: the config field, the variable, or the handler
    that the fallback wraps - one of them exists, or SIGTERM would stop the workers at once."""
    from torch.distributed.elastic.multiprocessing import api

    assert ("signals_to_handle" in torch_features.launch_config_fields()
            or torch_features.agent_reads_signals_env()
            or callable(getattr(api, "_terminate_process_handler", None)))


def test_the_prompt_tailer_replaces_an_older_tailer_with_fewer_arguments(monkeypatch):
    """The adapter's probe: ours takes every argument torch's tailer is given (2.6's five
    included); a tailer with one ours does not take is a name the output copying lacks."""
    from torch.distributed.elastic.multiprocessing import tail_log

    from scaletrain.launch.adapter import TAIL_LOGFILE_ARGS

    def older(header, file, dst, finished, interval_sec):  # torch 2.6's signature
        raise AssertionError("replaced")

    def other(header, file, dst, finished, interval_sec, colour):  # one ours does not take
        raise AssertionError("kept")

    monkeypatch.setattr(tail_log, "tail_logfile", older)
    # the patch keeps what it replaced (here the stand-in) beside it: restored after the test too
    monkeypatch.setattr(tail_log, "_scaletrain_original_tail_logfile",
                        getattr(tail_log, "_scaletrain_original_tail_logfile", None), raising=False)
    assert TAIL_LOGFILE_ARGS.probe()
    patches.prompt_tailers()
    assert tail_log.tail_logfile is patches.tail_logfile
    torch_features.tail_logfile_parameters.cache_clear()
    monkeypatch.setattr(tail_log, "tail_logfile", other)
    assert not TAIL_LOGFILE_ARGS.probe()


@pytest.mark.parametrize("has_no_dist", [True, False])
def test_a_sharded_save_and_load_without_a_group_on_either_dcp(monkeypatch, tmp_path, has_no_dist):
    """torch 2.6's DCP has no ``no_dist``: it is left out and DCP infers it, quietly."""

    from scaletrain.checkpoint import sharded

    real = torch_features.dcp_parameters

    def params(name: str) -> frozenset[str]:
        found = real(name)
        return found if has_no_dist else found - {"no_dist", "async_stager"}

    monkeypatch.setattr(sharded, "dcp_parameters", params)
    state = {"model": {"w": torch.arange(6.0)}}
    with warnings.catch_warnings():
        # no "assuming the intent is to save in a single process" reaches the user
        warnings.filterwarnings("error", message=r"torch\.distributed is")
        sharded.save(state, tmp_path, group=None)
        future, _ = sharded.async_save({"model": {"w": torch.arange(6.0) * 2}}, tmp_path / "a",
                                       group=None)
    future.result(timeout=120)
    import torch.distributed.checkpoint as dcp

    for folder, factor in ((tmp_path, 1), (tmp_path / "a", 2)):
        target = {"model": {"w": torch.zeros(6)}}
        dcp.load(target, storage_reader=dcp.FileSystemReader(str(folder / sharded.SUBDIR)),
                 **({"no_dist": True} if "no_dist" in real("load") else {}))
        assert torch.equal(target["model"]["w"], torch.arange(6.0) * factor)


def test_pinned_dcp_staging_needs_dcps_stager_and_falls_back_to_dcps_copy(monkeypatch):
    from scaletrain.checkpoint import staging

    monkeypatch.setattr(staging, "on_accelerator", lambda state: True)
    monkeypatch.setattr(staging, "dcp_default_stager", lambda: False)
    stager = staging.Stager(pin=True)
    assert stager.for_dcp({"w": 1}) is None
    stager.close()


class _OldSchedule:
    """A pipelining schedule as torch 2.6 has it: no scale_grads, no return_outputs, no eval."""

    def __init__(self, stage, n_microbatches, loss_fn=None):
        self.model = stage

    def step(self, *args, target=None, losses=None, **kwargs):
        assert not kwargs, f"handed to the model's forward: {kwargs}"
        for p in self.model.parameters():
            p.grad = torch.full_like(p, 4.0)  # the sum over 2 micro-batches of gradient 2
        if losses is not None:
            losses += [torch.tensor(1.0), torch.tensor(3.0)]


class _NewSchedule(_OldSchedule):
    def __init__(self, stage, n_microbatches, loss_fn=None, scale_grads=True):
        super().__init__(stage, n_microbatches, loss_fn)

    def step(self, *args, target=None, losses=None, return_outputs=True, **kwargs):
        assert return_outputs is False
        super().step(*args, target=target, losses=losses, **kwargs)

    def eval(self, *args, target=None, losses=None):
        return None


def _one_stage(schedule_cls, *, divide: bool):
    from scaletrain.parallel.pipeline_model import PipelineModel

    pipe = object.__new__(PipelineModel)  # one stage of one: only what step() touches
    pipe.wrapped = pipe.module = torch.nn.Linear(3, 1)
    pipe.stage_index, pipe.n_stages, pipe.n_microbatches, pipe.dp_size = 0, 1, 2, 1
    pipe.schedule, pipe.optimizer = schedule_cls(pipe.wrapped, 2), None
    pipe.stage = types.SimpleNamespace(device=torch.device("cpu"))
    pipe.broadcast_loss, pipe.traced_batch, pipe.divide_grads = False, None, divide
    return pipe


def test_pipeline_schedule_features_are_read_from_the_schedule():
    from torch.distributed.pipelining import ScheduleGPipe

    assert not torch_features.schedule_scales_grads(_OldSchedule)
    assert torch_features.schedule_scales_grads(_NewSchedule)
    assert "return_outputs" not in torch_features.schedule_step_parameters(_OldSchedule)
    assert "return_outputs" in torch_features.schedule_step_parameters(_NewSchedule)
    assert not torch_features.schedule_has_eval(_OldSchedule(None, 2))
    # this torch's own schedule: whatever it has, the answers agree with each other
    assert {"args", "target", "losses"} <= torch_features.schedule_step_parameters(ScheduleGPipe)


@pytest.mark.parametrize("schedule_cls", [_OldSchedule, _NewSchedule])
def test_a_pipeline_step_gives_the_mean_gradient_on_either_schedule(schedule_cls):
    """torch 2.6 sums the micro-batches' gradients (step divides them itself) and its step
    takes no return_outputs (left out, or the model's forward would get it)."""
    pipe = _one_stage(schedule_cls, divide=not torch_features.schedule_scales_grads(schedule_cls))
    loss = pipe.step(torch.zeros(4, 3), torch.zeros(4))
    assert float(loss) == 2.0
    expected = 2.0 if schedule_cls is _OldSchedule else 4.0  # the new one's own scaling is faked away
    assert all(torch.all(p.grad == expected) for p in pipe.wrapped.parameters())


def test_pipeline_evaluate_without_eval_names_the_torch_it_needs():
    from scaletrain.errors import StrategyError

    pipe = _one_stage(_OldSchedule, divide=True)
    with pytest.raises(StrategyError, match=r"needs torch 2\.9 or newer") as info:
        pipe.evaluate(torch.zeros(4, 3), torch.zeros(4))
    assert "\n" not in str(info.value).split("HINT")[0].strip()


def test_this_torch_has_what_every_launcher_patch_replaces():
    """Run on the oldest and newest torch by CI: a torch that drops one of these names turns a
    speed patch off or refuses a launch; say so here first."""
    from scaletrain.launch.adapter import PATCHES

    assert {patch.name: patch.missing() for patch in PATCHES} == \
        {patch.name: None for patch in PATCHES}


def test_the_newest_tested_torch_is_the_one_ci_pins():
    pin = re.search(r"^torch==([0-9.]+)$", (REPO / "constraints" / "torch-newest.txt").read_text(),
                    re.MULTILINE)
    assert pin is not None and pin.group(1) == torch_features.NEWEST_TESTED


def test_the_runtimes_privates_are_found_on_this_torch():
    assert torch_features.pg_timeout_setter() is not None
    assert torch_features.process_groups() is not None
    assert torch_features.python_exit_steps() is not None
