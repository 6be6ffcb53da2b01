"""The one adapter for torch's internals (launch/adapter.py, issue 37 item 1): each private name
the launcher and the runtime touch is renamed or removed here, as a future torch may, and the
launch's answer is checked: a speed (or diagnosis) patch switches off with one line saying
what is slower, a behaviour patch stops the launch with the reason and the way out
(SCALETRAIN_TORCH_AS_IS), and the opt-out skips every patch. Real launches with a renamed name
are in tests/multiproc/test_launch_adapter.py."""

from __future__ import annotations

import dataclasses
import io
import types

import pytest

pytest.importorskip("torch.distributed.elastic.multiprocessing.api")
import torch.distributed.distributed_c10d as c10d  # noqa: E402
import torch.distributed.launcher.api as launcher_api  # noqa: E402
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent  # noqa: E402
from torch.distributed.elastic.multiprocessing import api, tail_log  # noqa: E402
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv  # noqa: E402

from scaletrain import torch_features  # noqa: E402
from scaletrain.contract.environ import TORCH_AS_IS_VAR
from scaletrain.errors import LaunchError  # noqa: E402
from scaletrain.launch import adapter  # noqa: E402
from scaletrain.launch.adapter import PATCHES, PRIVATES, Private, check  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_answers():
    """Some feature tests cache their answer for the process; a renamed name needs new ones."""
    torch_features.forget_answers()
    yield
    torch_features.forget_answers()


def _without_remaining_restarts(mp: pytest.MonkeyPatch) -> None:
    init = SimpleElasticAgent.__init__
    renamed = "_remaining" + "_restarts"  # spelt apart: the renamed __init__ must not name it

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        init(self, *args, **kwargs)
        self.restarts_left = vars(self).pop(renamed)

    mp.setattr(SimpleElasticAgent, "__init__", __init__)


def _launch_config_without_signals(mp: pytest.MonkeyPatch) -> None:
    kept = [(f.name, f.type, f) for f in dataclasses.fields(launcher_api.LaunchConfig)
            if f.name != "signals_to_handle"]
    mp.setattr(launcher_api, "LaunchConfig", dataclasses.make_dataclass("LaunchConfig", kept))


def _init_renaming(cls: type, name: str) -> object:
    """``cls.__init__`` as a torch would have it that sets ``name`` under another one and
    everything else as before (its code still names every other attribute)."""
    init = cls.__init__
    kept = [n for n in init.__code__.co_names if n != name]
    namespace = {"init": init, "name": name}
    exec("def __init__(self, *args, **kwargs):\n"
         "    init(self, *args, **kwargs)\n"
         "    self.renamed = vars(self).pop(name, None)\n"
         f"    return None if args else (lambda: ({', '.join('self.' + n for n in kept)},))\n",
         namespace)
    return namespace["__init__"]


# How each private name goes missing: removed (delattr), renamed (a method that no longer
# sets or looks it up), or its keywords renamed.
REMOVE = {
    adapter.GET_METHOD_NAME: lambda mp: mp.delattr(rdzv, "get_method_name"),
    adapter.DELAY: lambda mp: mp.setattr(rdzv, "_delay", lambda secs: None),
    adapter.PCONTEXT_CLOSE: lambda mp: mp.setattr(
        api.PContext, "close", lambda self, sig=None, wait=30: self._close(sig, wait)),
    adapter.PCONTEXT_END: lambda mp: mp.delattr(api.PContext, "_close"),
    adapter.TAIL_LOGS: lambda mp: mp.setattr(api.PContext, "__init__",
                                                _init_renaming(api.PContext, "_tail_logs")),
    adapter.FINISHED_EVENTS: lambda mp: mp.setattr(tail_log.TailLog, "__init__",
                                                   _init_renaming(tail_log.TailLog,
                                                                  "_finished_events")),
    adapter.TAIL_LOGFILE: lambda mp: mp.delattr(tail_log, "tail_logfile"),
    adapter.TAIL_LOGFILE_ARGS: lambda mp: mp.setattr(
        tail_log, "tail_logfile", lambda header, file, dst, finished, interval_sec, colour: None),
    adapter.SIGNALS_FIELD: _launch_config_without_signals,
    adapter.SIGNALS_VARIABLE: lambda mp: mp.setattr(api.PContext, "start", lambda self: None),
    adapter.TERMINATE_HANDLER: lambda mp: mp.delattr(api, "_terminate_process_handler"),
    adapter.LOCAL_AGENT: lambda mp: mp.delattr(launcher_api, "LocalElasticAgent"),
    adapter.MONITOR_WORKERS: lambda mp: mp.delattr(SimpleElasticAgent, "_monitor_workers"),
    adapter.REMAINING_RESTARTS: _without_remaining_restarts,
    adapter.SUBPROCESS_END: lambda mp: mp.delattr(api.SubprocessContext, "_close"),
    adapter.SUBPROCESS_HANDLERS: lambda mp: mp.setattr(
        api.SubprocessContext, "__init__", _init_renaming(api.SubprocessContext, "subprocess_handlers")),
    adapter.STDERRS: lambda mp: mp.setattr(api.PContext, "__init__",
                                           _init_renaming(api.PContext, "stderrs")),
    adapter.PYTHON_EXIT: lambda mp: mp.delattr("threading._shutdown"),
    adapter.SET_PG_TIMEOUT: lambda mp: mp.delattr(c10d, "_set_pg_timeout"),
    adapter.PG_MAP: lambda mp: mp.setattr(c10d, "_world", types.SimpleNamespace()),
}


def _patch_of(private: Private) -> adapter.Patch:
    return next(p for p in PATCHES if any(private in way for way in p.ways))


def test_every_private_name_has_a_test_that_removes_it():
    assert set(REMOVE) == set(PRIVATES)
    assert len({p.name for p in PRIVATES}) == len(PRIVATES)
    assert {p.kind for p in PRIVATES} == {"attribute", "function", "keyword"}


def test_this_torch_has_every_name_and_every_patch_is_on():
    out = io.StringIO()
    found = check({}, max_restarts=1, out=out)
    assert found.on == {p.name for p in PATCHES} and not found.as_is
    assert out.getvalue() == ""


@pytest.mark.parametrize("private", PRIVATES, ids=lambda p: p.name.split("(")[0].rsplit(".", 2)[-1])
def test_a_missing_name_turns_its_speed_patch_off_or_stops_the_launch(monkeypatch, private):
    if not adapter._probe(private):   # an older torch in the range (2.6) never had it
        pytest.skip(f"this torch has no {private.name}: the launch already runs without it")
    patch = _patch_of(private)
    before_out = io.StringIO()
    before = check({}, max_restarts=1, out=before_out)   # what this torch does with every name it has
    REMOVE[private](monkeypatch)
    torch_features.forget_answers()   # the probes above were answered with the name still there
    if adapter._probe(private):   # torch 2.6 sets _tail_logs outside the __init__ the stand-in renames
        pytest.skip(f"the test's stand-in cannot take {private.name} away on this torch")
    out = io.StringIO()
    if any(all(adapter._probe(q) for q in way) for way in patch.ways):  # another way still works here
        assert patch in check({}, max_restarts=1, out=out) and out.getvalue() == before_out.getvalue()
        return
    if patch.behaviour:
        with pytest.raises(LaunchError) as info:
            check({}, max_restarts=1, out=out)
        assert private.name in info.value.message and patch.without in info.value.message
        assert f"{TORCH_AS_IS_VAR}=1" in info.value.hint
        return
    found = check({}, max_restarts=1, out=out)
    lines = [line for line in out.getvalue().splitlines() if line not in before_out.getvalue().splitlines()]
    assert patch not in found and found.on == before.on - {patch.name}
    assert len(lines) == 1 and private.name in lines[0] and patch.without in lines[0]


def test_without_any_way_to_keep_sigterm_the_launch_stops_naming_each(monkeypatch):
    for private in (adapter.SIGNALS_FIELD, adapter.SIGNALS_VARIABLE, adapter.TERMINATE_HANDLER):
        REMOVE[private](monkeypatch)
    with pytest.raises(LaunchError) as info:
        check({}, max_restarts=0, out=io.StringIO())
    assert "signals_to_handle" in info.value.message and "_terminate_process_handler" in \
        info.value.message and "before they save" in info.value.message


def test_the_restart_policy_is_needed_only_with_restarts(monkeypatch):
    _without_remaining_restarts(monkeypatch)
    out = io.StringIO()
    found = check({}, max_restarts=0, out=out)
    assert adapter.RESTARTS not in found and out.getvalue() == ""


def test_the_opt_out_skips_every_patch_and_every_probe(monkeypatch):
    for private in PRIVATES:
        if private is not adapter.TAIL_LOGFILE_ARGS:  # its function is removed already
            REMOVE[private](monkeypatch)
    out = io.StringIO()
    found = check({TORCH_AS_IS_VAR: "1"}, max_restarts=1, out=out)
    assert found.as_is and not found.on
    assert len(out.getvalue().splitlines()) == 1 and TORCH_AS_IS_VAR in out.getvalue()
    assert not adapter.torch_as_is({TORCH_AS_IS_VAR: "0"})


@pytest.mark.parametrize("version, newer", [("2.15.0", False), ("2.15.0+cpu", False),
                                            ("2.13.0", False), ("2.15.1", True),
                                            ("2.16.0a0+git1234", True), ("3.0", True)])
def test_a_torch_newer_than_tested_gets_one_line(monkeypatch, version, newer):
    monkeypatch.setattr("torch.__version__", version)
    out = io.StringIO()
    found = check({}, max_restarts=0, out=out)
    assert found.on  # not a failure
    lines = out.getvalue().splitlines()
    assert len(lines) == int(newer)
    if newer:
        assert version in lines[0] and torch_features.NEWEST_TESTED in lines[0]


def test_a_group_timeout_torch_cannot_change_is_said_once(monkeypatch, capsys):
    from scaletrain.runtime.timeouts import set_group_timeouts

    REMOVE[adapter.SET_PG_TIMEOUT](monkeypatch)
    set_group_timeouts(60.0)  # before: an AttributeError swallowed per group, silently
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "_set_pg_timeout" in err


def test_the_exit_without_the_cpython_privates_is_sys_exit(monkeypatch):
    from scaletrain.launch import lean

    REMOVE[adapter.PYTHON_EXIT](monkeypatch)
    monkeypatch.setitem(lean._STATE, "skip_teardown", True)
    with pytest.raises(SystemExit) as info:
        lean.leave(3)
    assert info.value.code == 3


def test_the_way_out_keeps_every_groups_timeout(monkeypatch):
    """Changing a live group's timeout goes through torch's privates: under the way out the
    worker leaves it (it was shortened regardless)."""
    from scaletrain.runtime import current, timeouts

    changed: list[float] = []
    monkeypatch.setattr(timeouts, "set_group_timeouts", changed.append)
    monkeypatch.setattr(current, "live_dist", lambda: object())
    monkeypatch.setenv(TORCH_AS_IS_VAR, "1")
    timeouts.configure(60.0)
    try:
        assert not timeouts.training_started()
        assert changed == []
        monkeypatch.setenv(TORCH_AS_IS_VAR, "0")
        timeouts.configure(60.0)
        assert timeouts.training_started() and changed == [60.0]
    finally:
        timeouts.configure(None)


class _Counted:
    """A stand-in for torch's agent: ``__init__`` keeps the restart count under ``name``."""

    name = "_remaining" + "_restarts"

    def __init__(self, max_restarts: int) -> None:
        setattr(self, self.name, max_restarts)

    def _monitor_workers(self, worker_group: object) -> str:
        return "result"


class _Renamed(_Counted):
    name = "restarts_left"   # a torch that renamed the count in its own __init__


@pytest.mark.parametrize("agent_class, restarts, policy", [
    (_Counted, 2, True), (_Renamed, 0, False), (_Renamed, 2, False)])
def test_the_restart_count_is_probed_on_the_live_agent(monkeypatch, capsys, agent_class,
                                                       restarts, policy):
    from scaletrain.launch.patches import agent_hooks

    monkeypatch.setattr(launcher_api, "LocalElasticAgent", agent_class)
    seen: list[object] = []
    with agent_hooks(lambda agent, result: seen.append(result), None, max_restarts=restarts):
        agent = launcher_api.LocalElasticAgent(restarts)
        assert agent._monitor_workers(None) == "result"
    assert launcher_api.LocalElasticAgent is agent_class   # undone
    assert adapter.restart_count(agent) == restarts   # what torch's own code reads: as asked
    assert seen == (["result"] if policy else [])
    err = capsys.readouterr().err
    if policy or restarts == 0:
        assert err == ""   # without restarts the policy has nothing to do: nothing to say
    else:
        assert len(err.splitlines()) == 1 and "lacks " + adapter.REMAINING_RESTARTS.name in err
        assert "restart policy is off, so " + adapter.RESTARTS.without in err


def test_the_adapter_says_whether_an_agent_of_ours_can_stand_in(monkeypatch):
    assert check({}, max_restarts=0, out=io.StringIO()).agent
    REMOVE[adapter.LOCAL_AGENT](monkeypatch)
    assert not check({}, max_restarts=0, out=io.StringIO()).agent
