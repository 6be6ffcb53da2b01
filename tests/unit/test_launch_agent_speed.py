"""`scaletrain run`'s two speed fixes to torch's agent (issue 23): the log tailers are told the
workers are finished before any is waited for, and every line written still reaches the console;
the rendezvous names its events without inspect.stack(), with the same names."""

from __future__ import annotations

import io
import threading

import pytest

api = pytest.importorskip("torch.distributed.elastic.multiprocessing.api")
from torch.distributed.elastic.multiprocessing.tail_log import TailLog  # noqa: E402

from scaletrain.launch.agent_speed import cheap_rendezvous_event_names, stop_tailers_together  # noqa: E402


def _context(tails: list) -> object:
    ctx = object.__new__(api.SubprocessContext)  # no workers: only what close() touches
    ctx._tail_logs = tails
    ctx.filtered_stdout = ctx.filtered_stderr = None
    ctx._close = lambda **_: None
    return ctx


class _Spy:
    """A tailer that records, when asked to stop, whether every tailer was already told to finish."""

    def __init__(self, seen: list[bool], everyone: list["_Spy"]) -> None:
        self._finished_events = {0: threading.Event()}
        self._seen, self._everyone = seen, everyone

    def stop(self) -> None:
        self._seen.append(all(e.is_set() for s in self._everyone for e in s._finished_events.values()))


def test_every_tailer_is_finished_before_the_first_is_waited_for():
    stop_tailers_together()
    seen: list[bool] = []
    spies: list[_Spy] = []
    spies += [_Spy(seen, spies), _Spy(seen, spies)]
    api.PContext.close(_context(spies))
    assert seen == [True, True]
    stop_tailers_together()  # idempotent: still one wrapper
    assert api.PContext.close._scaletrain_together


def test_no_line_is_lost(tmp_path):
    stop_tailers_together()
    files = {r: tmp_path / f"{r}.log" for r in range(2)}
    for r, path in files.items():
        path.write_text("".join(f"line {i} of rank {r}\n" for i in range(50)))
    out, err = io.StringIO(), io.StringIO()
    tails = [TailLog("t", {r: str(p) for r, p in files.items()}, dst, {0: "[rank 0] ", 1: "[rank 1] "}).start()
             for dst in (out, err)]
    api.PContext.close(_context(tails))
    for dst in (out, err):
        lines = dst.getvalue().splitlines()
        assert len(lines) == 100 and "[rank 1] line 49 of rank 1" in lines


def test_rendezvous_event_names_are_the_same_without_inspect_stack(monkeypatch):
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv

    def torchs(depth=2):  # torch 2.13's get_method_name, as a baseline
        if len(inspect.stack()) > depth:
            return inspect.stack()[depth].function
        return "no_method_name"

    def caller_of_caller():
        return rdzv.get_method_name()

    def outer():
        return caller_of_caller()

    monkeypatch.setattr(rdzv, "get_method_name", torchs)  # restored after the test
    before = outer()
    cheap_rendezvous_event_names()
    assert rdzv.get_method_name is not torchs and rdzv.get_method_name._scaletrain
    calls = []
    monkeypatch.setattr(inspect, "stack", lambda *a: calls.append(a) or [])
    assert outer() == before == "outer"
    assert calls == []
    cheap_rendezvous_event_names()  # idempotent
