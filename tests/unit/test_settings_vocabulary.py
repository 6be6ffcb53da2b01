"""One vocabulary for settings (issue 40 item 1, issue 39 item 9): every public setting is declared once,
with its check, and each bad value - NaN, inf, negative, zero where meaningless, wrong type, wrong case -
is one line naming the parameter the user typed, from the CLI and from the API alike."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest
from helpers import run_cli

import scaletrain
from scaletrain import settings
from scaletrain.checkpoint.checkpointer import OPTIONS, Checkpointer
from scaletrain.errors import PlanError, ProfileError, UsageError
from scaletrain.jobs import api, api_values
from scaletrain.observe.config import MonitorConfig
from scaletrain.plan.request import JobRequest, format_mem
from scaletrain.slurm.poll import poll_until

NAN, INF = float("nan"), float("inf")
SRC = Path(scaletrain.__file__).parent


# -- declared once ------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [JobRequest, MonitorConfig])
def test_every_field_of_a_public_configuration_is_a_declared_setting(cls):
    assert set(settings.specs(cls)) == {f.name for f in dataclasses.fields(cls)}


def test_the_checkpointer_and_submit_declare_every_parameter():
    assert set(OPTIONS) == set(inspect.signature(Checkpointer).parameters)
    own = set(api_values.OWN) | {"env"}          # env: added to the environment (sbatch_environment)
    assert set(inspect.signature(api.submit).parameters) - {"request"} <= own | set(settings.specs(JobRequest))


def test_each_flag_a_setting_names_is_a_flag_of_plan():
    from scaletrain.cli.main import build_parser

    parser = build_parser()
    plan = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "plan")[1]
    flags = {s for action in plan._actions for s in action.option_strings}
    named = {spec.flag for spec in settings.specs(JobRequest).values() if spec.flag}
    assert named and named <= flags, named - flags


def test_submit_checks_each_value_once_with_the_requests_own_check(monkeypatch):
    seen: list[str] = []
    real = settings.check_value

    def counting(spec, value, param, *, name=""):
        seen.append(name or param)
        return real(spec, value, param, name=name)

    monkeypatch.setattr(settings, "check_value", counting)
    api_values.build_request(cluster="roihu", program=["t.py", "a"], gpus=4, nodes=None, account="p", run_dir=None,
                             fields={"time": "01:00:00", "mem_per_gpu_gb": 8, "modules": "pytorch",
                                     "requeue": True, "precision": "bf16"})
    fields = [n for n in seen if n in settings.specs(JobRequest)]
    assert sorted(fields) == sorted(settings.specs(JobRequest))   # each field exactly once


# -- bad values: one line naming the parameter ----------------------------------------------------

# (keyword, bad value, CLI flag, the flag's text or None where the CLI cannot spell the value)
BAD = [
    ("mem_per_gpu_gb", NAN, "--mem-per-gpu", "nan"),
    ("mem_per_gpu_gb", INF, "--mem-per-gpu", "inf"),
    ("mem_per_gpu_gb", -4.0, "--mem-per-gpu", "-4G"),
    ("mem_per_gpu_gb", 0.0001, "--mem-per-gpu", "0.0001G"),
    ("mem_per_gpu_gb", "32G", "--mem-per-gpu", None),
    ("params", NAN, "--params", "nan"),
    ("params", 0, "--params", "0"),
    ("gpus_per_proc", 0, "--gpus-per-proc", "0"),
    ("cpus_per_gpu", -1, "--cpus-per-gpu", "-1"),
    ("cpus_per_gpu", 2.0, "--cpus-per-gpu", "2.0"),
    ("sample_gpus", 0, "--sample-gpus", "0"),
    ("time", "soon", "--time", "soon"),
    ("time", "00:00:00", "--time", "00:00:00"),
    ("partition", "gpu small", "--partition", "gpu small"),
    ("precision", "BF16", "--precision", "BF16"),
    ("launcher", "TorchRun", "--launcher", "TorchRun"),
    ("device", "CPU", "--device", "CPU"),
    ("requeue", "no", "--requeue", None),
    ("job_name", "", "--job-name", ""),
]


@pytest.mark.parametrize("keyword, value, flag, text", BAD)
def test_a_bad_value_is_one_line_naming_the_keyword_from_the_api(keyword, value, flag, text):
    with pytest.raises(UsageError) as info:
        scaletrain.submit(cluster="roihu", program=["train.py"], gpus=2, account="p", **{keyword: value})
    message = info.value.message
    assert message.startswith(f"submit(): {keyword} must be ") and "\n" not in message
    assert type(info.value).__name__ == "SettingError"


@pytest.mark.parametrize("keyword, value, flag, text", [b for b in BAD if b[3] is not None])
def test_a_bad_value_is_one_line_naming_the_flag_from_the_cli(capsys, keyword, value, flag, text):
    code, out, err = run_cli(capsys, "plan", "--cluster", "roihu", "--gpus", "2", "--account", "p",
                             f"{flag}={text}", "--", "train.py")
    lines = [line for line in err.splitlines() if line.strip() and "HINT" not in line]
    assert code == 2 and out == "" and len(lines) == 1 and flag in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("keyword, value, flag, text", BAD)
def test_the_request_itself_refuses_the_value_naming_the_flag(keyword, value, flag, text):
    with pytest.raises(UsageError, match=f"^{flag} must be "):
        JobRequest(cluster="roihu", script="train.py", gpus=2, **{keyword: value})


@pytest.mark.parametrize("options, says", [
    ({"every_minutes": NAN}, "Checkpointer: every_minutes must be a finite number above 0 and at most 1e+06 "
                             "(minutes), got nan"),
    ({"every_minutes": INF}, "Checkpointer: every_minutes must be a finite number above 0"),
    ({"every_minutes": -1}, "Checkpointer: every_minutes must be a finite number above 0"),
    ({"every_steps": 0}, "Checkpointer: every_steps must be a whole number from 1"),
    ({"every_steps": 2.0}, "Checkpointer: every_steps must be a whole number from 1"),
    ({"keep": True}, "Checkpointer: keep must be a whole number from 1"),
    ({"async_save": "yes"}, "Checkpointer: async_save must be True or False, got 'yes'"),
    ({"strict": 1}, "Checkpointer: strict must be True or False, got 1"),
])
def test_checkpointer_values_are_checked_naming_the_keyword(tmp_path, options, says):
    with pytest.raises(UsageError) as info:
        Checkpointer(tmp_path / "ck", **options)
    assert info.value.message.startswith(says)
    assert not (tmp_path / "ck").exists()     # refused before anything is made


@pytest.mark.parametrize("directory", ["a\0b", "", 5, None])
def test_a_checkpointer_folder_that_is_no_path_is_one_line_not_a_traceback(directory):
    with pytest.raises(UsageError, match="^Checkpointer: directory must be a folder path"):
        Checkpointer(directory)


@pytest.mark.parametrize("options, name", [
    ({"flush_s": NAN}, "flush_s"), ({"peak_flops": NAN}, "peak_flops"), ({"peak_flops": INF}, "peak_flops"),
    ({"flops_per_sample": -1.0}, "flops_per_sample"), ({"sample_interval_s": 0}, "sample_interval_s"),
    ({"log_interval_s": NAN}, "log_interval_s"), ({"total_steps": 0}, "total_steps"),
    ({"every": 2.5}, "every"), ({"warmup": -1}, "warmup"), ({"console": "no"}, "console"),
    ({"start_step": -3}, "start_step"), ({"device_sampler": "nvml"}, "device_sampler"),
])
def test_monitor_settings_are_checked_naming_the_keyword(options, name):
    with pytest.raises(UsageError) as info:
        MonitorConfig(**options)
    assert info.value.message.startswith(f"Monitor: {name} must be ")


def test_a_gpu_vendor_in_the_wrong_case_is_refused_with_the_allowed_values():
    from scaletrain.clusters.schema import build_profile

    base = {"name": "x", "gpus_per_node": 4, "cores_per_node": 32, "mem_per_node_gb": 256.0,
            "partitions": {"gpu": {"max_nodes": 2}}}
    build_profile(dict(base, gpu_vendor="amd"), path="x.toml")
    with pytest.raises(ProfileError, match=r"gpu_vendor must be one of 'nvidia', 'amd', 'none', got 'AMD'"):
        build_profile(dict(base, gpu_vendor="AMD"), path="x.toml")


# -- memory never renders as 0 or negative --------------------------------------------------------

@pytest.mark.parametrize("gb", [0.0001, 0.0, -16.0, NAN])
def test_memory_under_one_mib_never_renders(gb):
    with pytest.raises(PlanError, match="under 1M"):
        format_mem(gb)


def test_the_smallest_memory_renders_as_one_mib():
    assert format_mem(1 / 1024) == "1M" and format_mem(32.0) == "32G"


# -- every JSON we write is valid JSON ------------------------------------------------------------

def _json_calls() -> list[str]:
    """``json.dump``/``json.dumps`` calls in the package that may write NaN (no allow_nan=False)."""
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "fileio.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("dump", "dumps", "JSONEncoder") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json" \
                    and not any(k.arg == "allow_nan" and isinstance(k.value, ast.Constant)
                                and k.value.value is False for k in node.keywords):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_every_json_writer_refuses_nan():
    assert _json_calls() == []


def test_a_diverged_loss_leaves_summary_json_valid(tmp_path):
    from scaletrain.observe.monitor import Monitor

    mon = Monitor(tmp_path, total_steps=3, console=False, device_sampler=None, warmup=0)
    for _ in range(3):
        mon.step(samples=4, loss=NAN)
    mon.close()

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON")

    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert summary["steps"] == 3
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=refuse)


def test_finite_cleans_nested_values():
    from scaletrain.fileio import json_text

    assert json.loads(json_text({"a": [1.0, NAN, {"b": INF}], "c": (2, -INF)})) == \
        {"a": [1.0, None, {"b": None}], "c": [2, None]}


# -- the API runs the CLI's whole sequence: the staged data is measured too ----------------------

def test_the_api_measures_stage_data_as_the_cli_does(tmp_path):
    data = tmp_path / "d.tar"
    data.write_bytes(b"x")
    with open(data, "r+b") as f:
        f.truncate(200 * 1024 ** 3)     # sparse: 200 GB do not fit Roihu's 150 GB of $TMPDIR
    from scaletrain.jobs.submit import plan_job   # the one sequence, the CLI's too (test_one_sequence.py)

    req = api_values.build_request(cluster="roihu", program=["t.py"], gpus=4, nodes=None, account="p", run_dir=None,
                                   fields={"stage_data": str(data)})
    with pytest.raises(PlanError, match="needs about 220 GB on each node"):
        plan_job(req)
    with pytest.raises(PlanError, match="needs about 220 GB on each node, but \\$TMPDIR holds 150 GB on roihu"):
        scaletrain.submit(cluster="roihu", program=["t.py"], gpus=4, account="p", stage_data=str(data),
                          run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(UsageError, match="stage_data_gb is set by submit\\(\\) itself"):
        scaletrain.submit(cluster="roihu", program=["t.py"], gpus=4, account="p", stage_data_gb=1.0)


# -- a value checked outside the vocabulary is a decision ------------------------------------------

def _bool_guard(node: ast.AST) -> bool:
    """``isinstance(x, bool)``: how a hand-written number check starts (True is an int)."""
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" \
        and len(node.args) == 2 and getattr(node.args[1], "id", None) == "bool"


def _hand_checks() -> set[str]:
    """Functions that check a number by hand (a bool guard or ``isfinite``) and raise: ``module:function``."""
    found = set()
    for path in SRC.rglob("*.py"):
        if path.name == "settings.py":
            continue
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            nodes = list(ast.walk(fn))
            finite = any(isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None))
                         == "isfinite" for n in nodes)
            if any(isinstance(n, ast.Raise) for n in nodes) and (finite or any(_bool_guard(n) for n in nodes)):
                found.add(f"{path.relative_to(SRC).with_suffix('').as_posix()}:{fn.name}")
    return found


# The other styles, each with its reason. A value a user sets belongs in scaletrain.settings (a
# Spec, or setting() on a dataclass field); adding a name here instead is the decision this test asks for.
OUTSIDE = {
    # the TOML readers under the profile's facts (clusters/model.py: settings like any other)
    "clusters/schema:_typed", "clusters/probe:_toml_value",
    # text parsers: a CLI word or a size written as text, turned into the value a setting then checks
    "cli/args:mem_size", "cli/args:params", "plan/request:parse_params", "parallel/memory:parse_param_count",
    # not a setting: a refusal of what the planner computed, and what the stop agreement exchanged
    "plan/request:format_mem", "runtime/agreement:poll",
    # the JSON reader's range check: a number a file holds, refused as text that is not JSON is
    "jsonfile:_json_float",
    # a training step's extra fields are the program's own (text, NaN kept): only an int past a float is refused
    "observe/inputs:check_more",
}


def test_numbers_are_checked_by_the_vocabulary_or_a_named_exception():
    """The waits' seconds (poll_until, Job.wait, cancel), scale_lr's values and the call arguments
    below (save, loader, epoch, Job.logs, cancel, estimate_memory, pipeline) moved in; a new
    hand-written check fails here until it is a setting or named above with its reason."""
    assert _hand_checks() == OUTSIDE


@pytest.mark.parametrize("call, says", [
    (lambda: poll_until(lambda: "", bool, timeout=NAN, poll=1.0), "timeout must be a finite number from 0 (seconds), got nan"),
    (lambda: poll_until(lambda: "", bool, timeout=None, poll="1"), "poll must be a finite number above 0 (seconds), got '1'"),
    (lambda: poll_until(lambda: "", bool, timeout=None, poll=1.0, max_poll=-1), "max_poll must be a finite number above 0"),
    (lambda: scaletrain.scale_lr(INF, 256, 512), "scale_lr(): base_lr must be a finite number above 0, got inf"),
    (lambda: scaletrain.scale_lr(0.1, 256.0, 512), "scale_lr(): base_batch must be a whole number from 1"),
    (lambda: scaletrain.scale_lr(0.1, 256, 512, "Linear"), "scale_lr(): rule must be one of 'linear', 'sqrt'"),
])
def test_the_waits_and_the_lr_rule_speak_the_vocabulary(call, says):
    with pytest.raises(settings.SettingError) as info:
        call()
    assert info.value.message.startswith(says) and "\n" not in info.value.message


# -- the call arguments that were checked by hand (issue 40 follow-up) -----------------------------

def _save(bad):
    ckpt = Checkpointer(Path(_save.tmp) / "ckpt")
    try:
        ckpt.save(bad, {})
    finally:
        ckpt.close()


def _epoch(bad):
    from scaletrain.data.loader import loader

    loader(list(range(8)), batch_size=2, rank=0, world_size=1, num_workers=0).epoch = bad


def _pipeline(bad):
    from scaletrain.parallel import pipeline

    pipeline.apply(None, None, n_microbatches=bad)


def _loader(**kwargs):
    from scaletrain.data.loader import loader

    loader(list(range(8)), **{"rank": 0, "world_size": 1, "batch_size": 2, **kwargs})


def _per_process_batch(*args):
    from scaletrain.data.shares import per_process_batch

    per_process_batch(*args)


def _cancel(bad):
    from scaletrain.jobs.cancel import cancel

    cancel("no-such-run", save=bad)   # refused before the run folder is read


CALLS = {   # each converted function, a bad value in, and the parameter its message must name
    "save(): step": _save,
    "loader(): batch_size": lambda bad: _per_process_batch(bad, None, 4),
    "loader(): global_batch_size": lambda bad: _per_process_batch(None, bad, 4),
    "loader(): seed": lambda bad: _loader(seed=bad),
    "loader(): num_workers": lambda bad: _loader(num_workers=bad),
    "DistributedLoader: epoch": _epoch,
    "save": _cancel,
    "estimate_memory(): world_size": lambda bad: scaletrain.estimate_memory(1000, world_size=bad),
    "pipeline: n_microbatches": _pipeline,
}
BAD = [NAN, INF, -1, True, "3", 2.0]


@pytest.mark.parametrize("bad", BAD, ids=repr)
@pytest.mark.parametrize("param", list(CALLS))
def test_call_arguments_speak_the_vocabulary(tmp_path, param, bad):
    _save.tmp = tmp_path
    if param == "save" and bad is True:
        bad = 1     # True is cancel()'s save; 1 merely converts to it
    with pytest.raises(settings.SettingError) as info:
        CALLS[param](bad)
    message = info.value.message
    assert message.startswith(f"{param} must be ") and message.endswith(f", got {bad!r}"), message
    assert "\n" not in str(info.value) and info.value.hint


@pytest.mark.parametrize("param, says", [
    ("save(): step", "save(): step must be a whole number from 0 to 1,000,000,000,000, got -1"),
    ("loader(): num_workers", "loader(): num_workers must be 'auto' or a whole number from 0 to 100,000, got -1"),
    ("DistributedLoader: epoch", "DistributedLoader: epoch must be a whole number from 0 to 1,000,000,000,000, got -1"),
    ("estimate_memory(): world_size", "estimate_memory(): world_size must be a whole number from 1 to 100,000, got -1"),
    ("pipeline: n_microbatches", "pipeline: n_microbatches must be a whole number from 1 to 100,000, got -1"),
])
def test_call_arguments_name_the_shape(tmp_path, param, says):
    _save.tmp = tmp_path
    with pytest.raises(settings.SettingError) as info:
        CALLS[param](-1)
    assert info.value.message == says


def test_a_pipeline_option_is_still_the_strategy_error_setup_promises():
    from scaletrain.errors import StrategyError

    with pytest.raises(StrategyError) as info:
        _pipeline(0)
    assert isinstance(info.value, settings.SettingError)
    assert isinstance(info.value.renamed("n_microbatches"), StrategyError)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, float("nan"), "4"])
def test_degrees_and_accumulation_steps_are_strategy_settings(bad):
    """accumulate(steps=True) ran as one step, and a degree's message had its own style."""
    import torch

    from scaletrain.errors import StrategyError
    from scaletrain.parallel.options import ParallelDims
    from scaletrain.parallel.precision import Accumulator

    with pytest.raises(StrategyError) as info:
        Accumulator(torch.nn.Linear(2, 2), bad)
    assert isinstance(info.value, settings.SettingError) and "\n" not in info.value.message
    assert info.value.message.startswith("accumulate(): steps must be a whole number from 1") and info.value.hint
    with pytest.raises(StrategyError) as info:
        ParallelDims(world_size=4, replicate=bad)
    assert info.value.message.startswith("replicate must be a whole number from 1"), info.value.message
    assert ParallelDims(world_size=4, replicate=2, shard=2).shard == 2


def test_the_converted_arguments_still_take_their_valid_values(tmp_path):
    from scaletrain.data.loader import loader
    from scaletrain.data.shares import per_process_batch

    assert per_process_batch(3, None, 4) == 3 and per_process_batch(None, 12, 4) == 3
    train = loader(list(range(8)), batch_size=2, rank=0, world_size=1, seed=2**64 - 1, num_workers="auto")
    train.epoch = 5
    assert train.epoch == 5 and train.seed == 2**64 - 1
    assert scaletrain.estimate_memory(1000, world_size=8).world_size == 8
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(0, {"x": 1})
    ckpt.close()
    assert (tmp_path / "ckpt").is_dir() and any((tmp_path / "ckpt").iterdir())
