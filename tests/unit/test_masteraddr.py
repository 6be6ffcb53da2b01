"""An unresolvable rendezvous host stops the start-up within a short bounded time, naming the
setting, instead of every rank waiting the start-up timeout (scaletrain.runtime.masteraddr)."""

from __future__ import annotations

import socket

import pytest

from scaletrain.errors import DistEnvError
from scaletrain.runtime.masteraddr import (RESOLVE_WAIT_S, Target, rendezvous_target,
                                           resolve_or_fail, wait_limit)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _failing(fails: int):
    calls: list[str] = []

    def lookup(host: str) -> None:
        calls.append(host)
        if len(calls) <= fails:
            raise socket.gaierror(-2, "Name or service not known")

    return lookup, calls


def test_slow_dns_is_retried_until_it_answers():
    clock = _Clock()
    lookup, calls = _failing(3)
    resolve_or_fail(Target("node01", "29500", "MASTER_ADDR"), rank=1, wait_s=10,
                    resolve=lookup, sleep=clock.sleep, clock=clock)
    assert len(calls) == 4 and clock.sleeps == [1.0, 1.0, 1.0]


def test_a_typo_fails_after_the_bound_naming_the_variable():
    clock = _Clock()
    lookup, calls = _failing(10**6)
    with pytest.raises(DistEnvError) as info:
        resolve_or_fail(Target("nod01", "29500", "MASTER_ADDR"), rank=3, wait_s=5,
                        resolve=lookup, sleep=clock.sleep, clock=clock)
    assert clock.now == pytest.approx(5.0) and len(calls) == 6
    assert info.value.message.startswith("rank 3: MASTER_ADDR='nod01' does not resolve "
                                         "(tried for 5 s")
    assert info.value.exit_code == 3 and "\n" not in info.value.message


def test_the_launcher_and_init_method_are_named_as_such():
    lookup, _ = _failing(10**6)
    clock = _Clock()
    for target, words in ((Target("x", "1", "--master-addr"), "--master-addr 'x'"),
                          (Target("x", "1", "init_method"), "the init_method host 'x'")):
        with pytest.raises(DistEnvError) as info:
            resolve_or_fail(target, rank=None, wait_s=0, resolve=lookup, sleep=clock.sleep,
                            clock=clock)
        assert info.value.message.startswith(f"{words} does not resolve")


def test_where_a_rendezvous_meets():
    env = {"MASTER_ADDR": "n1", "MASTER_PORT": "1234"}
    assert rendezvous_target(None, env) == Target("n1", "1234", "MASTER_ADDR")
    assert rendezvous_target("env://", env) == Target("n1", "1234", "MASTER_ADDR")
    assert rendezvous_target("tcp://host-a:555", env) == Target("host-a", "555", "init_method")
    assert rendezvous_target("tcp://[::1]:555", {}) == Target("::1", "555", "init_method")
    assert rendezvous_target("file:///tmp/x", env) is None
    assert rendezvous_target("env://", {}) is None


@pytest.mark.parametrize("text,expected", [("", RESOLVE_WAIT_S), ("2.5", 2.5), ("x", RESOLVE_WAIT_S),
                                           ("-1", RESOLVE_WAIT_S), ("0", 0.0)])
def test_wait_limit(text, expected):
    assert wait_limit({"SCALETRAIN_RESOLVE_TIMEOUT": text}) == expected


def test_rank_and_world_are_read_from_init_process_group_arguments(monkeypatch):
    from scaletrain.launch.inproc.rendezvous import _who

    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert _who(("gloo", "env://", None, 4, 2), {}) == (2, 4)
    assert _who(("gloo",), {"rank": 1, "world_size": 2}) == (1, 2)
    assert _who(("gloo",), {}) == ("7", "8")
