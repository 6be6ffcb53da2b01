"""`scaletrain run`'s speed fixes to torch's agent (issue 23): the log tailers are told the
workers are finished before any is waited for, are woken by it instead of sleeping, and every
line written still reaches the console; the rendezvous names its events without
inspect.stack(), with the same names; one node's first join skips its random pause."""

from __future__ import annotations

import inspect
import io
import re
import threading

import pytest

api = pytest.importorskip("torch.distributed.elastic.multiprocessing.api")
from torch.distributed.elastic.multiprocessing.tail_log import TailLog  # noqa: E402

from torch.distributed.elastic.multiprocessing import tail_log  # noqa: E402
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv  # noqa: E402

from scaletrain.launch import patches, tailer  # noqa: E402
from scaletrain.launch.patches import (cheap_rendezvous_event_names, no_first_join_skew,  # noqa: E402
                                           prompt_tailers, stop_tailers_together)


def _context(tails: list) -> object:
    ctx = object.__new__(api.SubprocessContext)  # no workers: only what close() touches
    ctx._tail_logs = tails  # torch 2.10 and newer; 2.6 to 2.9 have the two below
    ctx._stdout_tail, ctx._stderr_tail = (list(tails) + [None, None])[:2]
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
    def torchs(depth=2):  # torch 2.13's get_method_name, as a baseline
        if len(inspect.stack()) > depth:
            return inspect.stack()[depth].function
        return "no_method_name"

    def caller_of_caller():
        return rdzv.get_method_name()

    def outer():
        return caller_of_caller()

    monkeypatch.setattr(rdzv, "get_method_name", torchs)  # restored after the test
    # and what the patch keeps of what it replaced (here the stand-in), for a later put-back
    monkeypatch.setattr(rdzv, "_scaletrain_original_get_method_name",
                        getattr(rdzv, "_scaletrain_original_get_method_name", None), raising=False)
    before = outer()
    cheap_rendezvous_event_names()
    assert rdzv.get_method_name is not torchs and rdzv.get_method_name._scaletrain
    calls = []
    monkeypatch.setattr(inspect, "stack", lambda *a: calls.append(a) or [])
    assert outer() == before == "outer"
    assert calls == []
    cheap_rendezvous_event_names()  # idempotent


class _NoSleep(threading.Event):
    """A "finished" event that counts its waits; the tailer must wait here, never in sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits > 10_000:
            pytest.fail("the tailer never left")
        return super().wait(0.001)


def test_the_tailer_waits_on_finished_and_reads_to_the_end(tmp_path, monkeypatch):
    monkeypatch.setattr(tail_log.time, "sleep", lambda s: pytest.fail("slept instead of waiting"))
    log = tmp_path / "0.log"
    finished = _NoSleep()
    lines: list[str] = []

    class _Growing(io.StringIO):
        """After the first line, more arrives and the worker is done: the rest is still read."""

        def write(self, text: str) -> int:
            lines.append(text)
            if len(lines) == 1:
                with log.open("a") as fh:
                    fh.write("c\nd\n")
                finished.set()
            return len(text)

    log.write_text("a\nb\n")
    patches.tail_logfile("[rank 0] ", str(log), _Growing(), finished, 0.1,
                             log_line_filter=lambda line: line != "b\n")
    assert lines == ["[rank 0] a\n", "[rank 0] c\n", "[rank 0] d\n"]


def test_the_tailer_waits_for_its_file_and_leaves_if_it_never_comes(tmp_path):
    finished = _NoSleep()
    threading.Timer(0, finished.set).start()
    patches.tail_logfile("[rank 0] ", str(tmp_path / "never.log"), io.StringIO(), finished, 0.1)
    assert finished.is_set()


def test_torchs_tailers_use_ours_and_lose_no_line(tmp_path, monkeypatch):
    monkeypatch.setattr(tail_log, "tail_logfile", tail_log.tail_logfile)  # restored after the test
    prompt_tailers()
    prompt_tailers()  # idempotent
    assert tail_log.tail_logfile is patches.tail_logfile  # torch's arguments are ours
    files = {r: tmp_path / f"{r}.log" for r in range(2)}
    for r, path in files.items():
        path.write_text("".join(f"line {i} of rank {r}\n" for i in range(50)))
    out = io.StringIO()
    tail = TailLog("t", {r: str(p) for r, p in files.items()}, out, {0: "[rank 0] ", 1: "[rank 1] "}).start()
    tail.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) == 100 and "[rank 1] line 49 of rank 1" in lines


def test_torch_still_skews_the_first_join_with_a_range():
    source = inspect.getsource(rdzv.DynamicRendezvousHandler.next_rendezvous)
    assert "_delay(seconds=(0, 0.3))" in source  # what no_first_join_skew recognises


def test_one_node_joins_without_the_random_pause_and_keeps_the_other_delays(monkeypatch):
    calls: list[object] = []
    monkeypatch.setattr(rdzv, "_delay", lambda seconds: calls.append(seconds))
    recorder = rdzv._delay
    with no_first_join_skew(True):
        rdzv._delay(seconds=(0, 0.3))
        rdzv._delay(seconds=1)
    assert calls == [1]
    assert rdzv._delay is recorder
    with no_first_join_skew(False):  # several nodes: the skew spreads them out
        rdzv._delay(seconds=(0, 0.3))
    assert calls == [1, (0, 0.3)]


class _Bytes(io.TextIOWrapper):
    """A text stream over a BytesIO, like sys.stdout over its buffer."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8")


def test_the_tailer_copies_bytes_exactly_with_one_prefix_per_line(tmp_path):
    """torch's tailer read the file as text: bytes that are not UTF-8 became U+FFFD (`run`
    altered a program's binary stdout); here they are copied as written. A lone \\r ends a line
    as \\n does (a progress bar's redraw is a line of the log), \\r\\n stays as written."""
    data = bytes(range(256)) * 3 + b"\r\nno newline at the end\xff"
    log = tmp_path / "0.log"
    log.write_bytes(data)
    finished = _NoSleep()
    finished.set()
    out = _Bytes()
    patches.tail_logfile("[rank 0] ", str(log), out, finished, 0.1)
    out.flush()
    got = out.buffer.getvalue()
    # a line ends at \n or at a lone \r, and the last line, written without its end, is ended on
    # the console: the next rank's prefix would otherwise continue it ("[rank 1] err[rank 0] out")
    want = b""
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        chunk = line if i == len(lines) - 1 else line + b"\n"
        parts = [p for p in re.split(rb"\r(?!\n)", chunk) if p]
        want += b"".join(b"[rank 0] " + p + (b"" if p.endswith(b"\n") else b"\n") for p in parts)
    assert b"\r\x0e" in data   # a lone \r: cut there
    assert got == want


def test_a_line_in_pieces_gets_one_prefix_and_a_filtered_line_stays_out_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(tailer, "_PIECE", 4)   # every line arrives in pieces of 4 bytes
    log = tmp_path / "0.log"
    log.write_bytes(b"keep this line\nhide this line\nkeep\n")
    finished = _NoSleep()
    finished.set()
    out = _Bytes()
    patches.tail_logfile("[r0] ", str(log), out, finished, 0.1,
                             log_line_filter=lambda line: not line.startswith("hide"))
    out.flush()
    assert out.buffer.getvalue() == b"[r0] keep this line\n[r0] keep\n"


def test_a_launch_as_is_puts_back_what_an_earlier_launch_installed(monkeypatch):
    from scaletrain.launch.adapter import PATCHES, Adapter

    for owner, name in ((api.PContext, "close"), (tail_log, "tail_logfile"), (rdzv, "get_method_name")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    patches.install_lasting(Adapter(on=frozenset(p.name for p in PATCHES)))
    assert all(getattr(f, "_scaletrain", False) for f in
               (api.PContext.close, tail_log.tail_logfile, rdzv.get_method_name))
    patches.install_lasting(Adapter(on=frozenset(), as_is=True))
    now = (api.PContext.close, tail_log.tail_logfile, rdzv.get_method_name)
    assert not any(getattr(f, "_scaletrain", False) for f in now)
    assert all(f.__module__.startswith("torch.distributed.elastic.") for f in now), [f.__qualname__ for f in now]
