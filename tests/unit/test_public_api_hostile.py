"""Every public callable of ``scaletrain.__all__`` checks its arguments where they enter.

The walk finds each public function, class and public method (a new one without a row here fails
the test), and feeds every parameter the hostile values of a careless or malicious caller: None,
"x", -1, 10**400, NaN and True. Each is either a value the parameter takes (listed per parameter
below, so a test that cannot fail is visible) or refused with ONE line of ours - a
:class:`~scaletrain.errors.ScaletrainError` naming the parameter - never a TypeError,
AttributeError or OverflowError from deep inside (``Checkpointer.step("3")`` gave "not all
arguments converted", ``backward(None)`` an AttributeError in torch's glue, ``accumulate("x", 2)``
was accepted, 10**400 an OverflowError in a dozen places).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch
from test_jobs_hostile import make_run, row, slurm  # noqa: F401 - the fake Slurm fixture

import scaletrain
from scaletrain.errors import ScaletrainError
from scaletrain.jobs import submit as submit_path

NAN = float("nan")
HOSTILE: dict[str, Any] = {"None": None, "'x'": "x", "-1": -1, "10**400": 10**400, "nan": NAN, "True": True}
ALL = frozenset(HOSTILE)
# ScaletrainError is the error itself: it turns any message into text (raising while an error is
# being raised would hide the first one); its arguments are messages, not settings.
NOT_WALKED = {"ScaletrainError", "ScaletrainError.render"}


@dataclass(frozen=True)
class Case:
    """How to call one public callable validly (``base``), and which hostile values each of its
    parameters takes (the rest must be refused)."""

    call: Callable[..., Any]
    base: Callable[[Any], dict[str, Any]]
    takes: dict[str, frozenset[str]] = field(default_factory=dict)


def _model() -> torch.nn.Module:
    return torch.nn.Linear(2, 2)


def _loss() -> torch.Tensor:
    return _model()(torch.ones(1, 2)).sum()


def _ckpt(tmp, **kw):
    return scaletrain.Checkpointer(tmp / "ck", every_steps=1, exit_on_stop=False, **kw)


def _monitor(tmp, name):
    return scaletrain.Monitor(tmp / name, console=False)


def _job(tmp):
    """A run folder of job 101, finished in the fake Slurm's queue (test_jobs_hostile's ``slurm``)."""
    run = tmp / "runs" / "a"
    if not run.exists():
        make_run(tmp)
        (tmp / "queue").write_text(row("101", "COMPLETED"))
    return run


def _enter(manager):
    with manager:
        pass


NONE, TRUE, X = frozenset({"None"}), frozenset({"True"}), frozenset({"'x'"})

CASES: dict[str, Case] = {
    "Env": Case(scaletrain.Env, lambda t: {},
                {"master_addr": X, "launcher": frozenset(), "job_id": NONE | X, "device": frozenset(),
                 "backend": X}),
    "Env.describe": Case(lambda: scaletrain.Env().describe(), lambda t: {}),
    "detect": Case(scaletrain.detect, lambda t: {"environ": {}}, {"environ": NONE}),
    "init": Case(scaletrain.init, lambda t: {"device": "cpu"},
                 {"device": NONE, "backend": NONE, "timeout_s": NONE, "step_timeout_s": NONE, "stop_signals": NONE}),
    "shutdown": Case(scaletrain.shutdown, lambda t: {}),
    "rank_print": Case(lambda **kw: scaletrain.rank_print("hello", **kw), lambda t: {}),
    "barrier": Case(scaletrain.barrier, lambda t: {}),
    "main_first": Case(lambda **kw: _enter(scaletrain.main_first(**kw)), lambda t: {}, {"local": TRUE}),
    "training_started": Case(scaletrain.training_started, lambda t: {}),
    "setup": Case(scaletrain.setup, lambda t: {"model": _model(), "strategy": "none"},
                  {"optimizer": NONE, "env": NONE, "verbose": TRUE}),
    "backward": Case(scaletrain.backward, lambda t: {"loss": _loss()}, {"model": NONE}),
    "accumulate": Case(scaletrain.accumulate, lambda t: {"model": _model(), "steps": 2}),
    "estimate_memory": Case(scaletrain.estimate_memory, lambda t: {"model_or_n_params": 1000},
                            {"grad_accum_dtype": NONE, "shard_size": NONE, "pipeline_stages": NONE,
                             "n_trainable": NONE}),
    "loader": Case(scaletrain.loader, lambda t: {"dataset": list(range(8)), "batch_size": 2, "rank": 0,
                                                 "world_size": 1, "num_workers": 0},
                   {"global_batch_size": NONE, "shuffle": NONE | TRUE, "drop_last": NONE | TRUE, "eval": TRUE,
                    "collate_fn": NONE, "pin_memory": NONE | TRUE, "persistent_workers": NONE | TRUE, "env": NONE,
                    "rank": NONE, "world_size": NONE, "group": NONE, "base_world_size": NONE}),
    "all_reduce_mean": Case(scaletrain.all_reduce_mean, lambda t: {"value": 1.0},
                            {"value": frozenset({"-1", "nan"}), "weight": NONE, "group": NONE}),
    "gather_objects": Case(scaletrain.gather_objects, lambda t: {"obj": 1}, {"obj": ALL, "group": NONE}),
    "scale_lr": Case(scaletrain.scale_lr, lambda t: {"base_lr": 0.1, "base_batch": 32, "global_batch": 64}),
    "Checkpointer": Case(lambda **kw: scaletrain.Checkpointer(**kw), lambda t: {"directory": t / "ck"},
                         {"directory": X, "every_steps": NONE, "every_minutes": NONE, "async_save": TRUE,
                          "exit_on_stop": TRUE, "strict": TRUE}),
    "Checkpointer.save": Case(lambda tmp, **kw: _ckpt(tmp).save(**kw), lambda t: {"step": 1, "state": {"m": _model()}}),
    "Checkpointer.step": Case(lambda tmp, **kw: _ckpt(tmp).step(**kw), lambda t: {"step": 1, "state": {"m": _model()}}),
    "Checkpointer.load_latest": Case(lambda tmp, **kw: _ckpt(tmp).load_latest(**kw),
                                     lambda t: {"state": {"m": _model()}}),
    "Checkpointer.export": Case(lambda tmp, **kw: _ckpt(tmp).export(**kw),
                                lambda t: {"path": t / "w.pt", "model": _model()}, {"path": X}),
    "Checkpointer.close": Case(lambda tmp, **kw: _ckpt(tmp).close(**kw), lambda t: {}, {"ended_normally": TRUE}),
    "Checkpointer.wait": Case(lambda tmp: _ckpt(tmp).wait(), lambda t: {}),
    "Checkpointer.should_stop": Case(lambda tmp: _ckpt(tmp).should_stop(), lambda t: {}),
    "Monitor": Case(lambda **kw: scaletrain.Monitor(**kw).close(), lambda t: {"run_dir": t / "mon", "console": False},
                    {"run_dir": NONE | X, "config": NONE, "env": NONE}),
    "Monitor.watch": Case(lambda tmp, **kw: _monitor(tmp, "w").watch(**kw), lambda t: {"model": _model()}),
    "Monitor.start": Case(lambda tmp: _monitor(tmp, "s").start(), lambda t: {}),
    "Monitor.data": Case(lambda tmp, **kw: list(_monitor(tmp, "d").data(**kw)), lambda t: {"iterable": [1, 2]},
                         {"iterable": X}),
    "Monitor.step": Case(lambda tmp, **kw: _monitor(tmp, "st").step(**kw), lambda t: {"samples": 4},
                         {"loss": frozenset({"None", "-1", "nan"})}),
    "Monitor.summary": Case(lambda tmp: _monitor(tmp, "su").summary(), lambda t: {}),
    "Monitor.close": Case(lambda tmp: _monitor(tmp, "c").close(), lambda t: {}),
    "submit": Case(scaletrain.submit, lambda t: {"cluster": "roihu", "program": ["t.py"], "gpus": 2, "account": "p",
                                                 "run_dir": t / "sub"},
                   # gpus=None: then nodes is needed; account=None: Roihu bills a project; check: a boolean
                   {"nodes": NONE, "account": X, "run_dir": NONE | X, "env": NONE, "check": frozenset({"True"})}),
    "Job": Case(lambda tmp, **kw: scaletrain.Job(**kw), lambda t: {"run_dir": _job(t)}, {"env": NONE}),
    "Job.status": Case(lambda tmp: scaletrain.Job(_job(tmp)).status(), lambda t: {}),
    "Job.wait": Case(lambda tmp, **kw: scaletrain.Job(_job(tmp)).wait(**kw), lambda t: {"timeout": 0.0, "poll": 0.01},
                     {"timeout": NONE}),
    "Job.logs": Case(lambda tmp, **kw: scaletrain.Job(_job(tmp)).logs(**kw), lambda t: {}, {"rank": NONE}),
    "Job.cancel": Case(lambda tmp, **kw: scaletrain.Job(_job(tmp)).cancel(**kw), lambda t: {"wait_s": 0.0},
                       {"save": TRUE}),
    "Job.report": Case(lambda tmp, **kw: scaletrain.Job(_job(tmp)).report(**kw), lambda t: {}, {"out": NONE | X}),
}


def _public() -> dict[str, Callable[..., Any]]:
    """Every public callable: the functions and classes of ``__all__`` and the classes' own
    public methods."""
    found: dict[str, Callable[..., Any]] = {}
    for name in scaletrain.__all__:
        obj = getattr(scaletrain, name)
        if not callable(obj):
            continue
        found[name] = obj
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and inspect.isfunction(member):
                    found[f"{name}.{attr}"] = member
    return found


def _parameters(fn: Callable[..., Any]) -> list[str]:
    """The named parameters a caller passes (not self, *args or **kwargs)."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    return [p.name for p in inspect.signature(target).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def test_every_public_callable_and_parameter_is_walked():
    public = _public()
    assert set(public) - NOT_WALKED == set(CASES), (set(public) - NOT_WALKED) ^ set(CASES)
    for name, case in CASES.items():
        named = set(_parameters(public[name]))
        assert set(case.takes) <= named, (name, set(case.takes) - named)


ROWS = [(name, param, label) for name, fn in sorted(_public().items()) if name in CASES
        for param in _parameters(fn) for label in HOSTILE]


def _sent(prepared):
    """sbatch, stood in for: the job id a submission gets (the walk is about the arguments)."""
    (prepared.run_dir / "job_id").write_text("4242\n")
    return "4242"


@pytest.mark.parametrize("name, param, label", ROWS)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_hostile_argument_is_taken_or_refused_in_one_line(request, tmp_path, monkeypatch, name, param, label):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(submit_path, "send", _sent)
    (tmp_path / "t.py").write_text("import torch\n")   # the program submit's check reads
    if name.startswith("Job"):
        request.getfixturevalue("slurm")
    case = CASES[name]
    kwargs = case.base(tmp_path)
    kwargs[param] = HOSTILE[label]
    call = case.call
    if "tmp" in inspect.signature(call).parameters:
        kwargs["tmp"] = tmp_path
    taken = label in case.takes.get(param, frozenset())
    try:
        call(**kwargs)
    except ScaletrainError as exc:
        assert not taken, f"{name}({param}={label}) is a value it takes, but: {exc}"
        # one line naming the parameter, or the value it refuses ("x holds no submitted job")
        assert "\n" not in exc.message and (param in exc.message or label.strip("'") in exc.message), exc.message
        return
    except BaseException as exc:  # noqa: BLE001 - what the test is about
        pytest.fail(f"{name}({param}={label}) raised {type(exc).__name__}: {exc}")
    finally:
        scaletrain.shutdown()
    assert taken, f"{name}({param}={label}) was accepted"


def test_the_hostile_values_are_what_they_say():
    assert math.isnan(HOSTILE["nan"]) and HOSTILE["10**400"] > 1e308 and HOSTILE["True"] is True
