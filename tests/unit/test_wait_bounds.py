"""Bounds that hold (issue 40 item 3): the pre-sbatch check and the wait loop end within their limits
whatever the child processes or Slurm's queries do, and say which limit ended them."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from scaletrain.errors import SlurmError
from scaletrain.jobs import status
from scaletrain.slurm.poll import poll_until


def _in_thread(fn, bound: float = 60.0):
    """``fn()`` in a thread; a call still blocked after ``bound`` seconds fails the test (no hang)."""
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.update(result=fn()), daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), "still blocked: the bound did not hold"
    return box["result"]


def _kill_helper(pid_file) -> None:
    try:
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass


def _check_with_helper(tmp_path, rest: str, limit: float):
    """The pre-sbatch check's runner on a set-up that leaves a ``setsid`` helper holding its output."""
    from scaletrain.envs.check import _run

    pid_file = tmp_path / "helper.pid"
    try:
        return _in_thread(lambda: _run(f"setsid sleep 300 & echo $! > {pid_file}\n{rest}", dict(os.environ),
                                       None, limit))
    finally:
        _kill_helper(pid_file)


def test_a_setsid_helper_holding_the_output_does_not_hold_the_check(tmp_path):
    assert _check_with_helper(tmp_path, "echo scaletrain-missing:\nexit 0\n", 120.0) == (0, "scaletrain-missing:\n")


def test_the_check_past_its_limit_says_which_limit_ended_it(tmp_path):
    code, out = _check_with_helper(tmp_path, "sleep 300\n", 1.0)
    assert code is None and out.startswith("no answer within 1 s (the pre-sbatch check's time limit")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def test_a_slow_silent_query_never_takes_the_wait_past_its_timeout():
    clock = _Clock()
    budgets: list[float | None] = []

    def fetch(left: float | None) -> str:
        budgets.append(left)
        if len(budgets) == 1:
            clock.now += 1.0
            return "RUNNING"
        clock.now += left or 0.0      # a query that uses all the time it is given, then fails
        raise SlurmError("squeue timed out")

    waited = poll_until(fetch, lambda s: False, timeout=10, poll=2.0, bounded=True, clock=clock, sleep=clock.sleep)
    # Slurm answered before: the caller's limit ended the wait, with the last state seen
    assert (waited.value, waited.done, waited.ended_by, waited.seconds) == ("RUNNING", False, "timeout", 10.0)
    assert budgets[0] == 10.0 and all(b is not None and b <= 10.0 for b in budgets)


def test_silence_from_the_start_names_the_time_limit_not_a_count_of_failures():
    clock = _Clock()

    def fetch(left: float | None) -> str:
        clock.now += min(3.0, left or 3.0)
        raise SlurmError("squeue timed out")

    with pytest.raises(SlurmError, match=r"^Slurm did not answer within the 10 s limit \(timeout=10\): squeue"):
        poll_until(fetch, bool, timeout=10, poll=1.0, patience=50, bounded=True, clock=clock, sleep=clock.sleep)
    assert clock.now <= 10.0


def test_retries_never_sleep_past_the_limit():
    clock = _Clock()

    def fetch() -> str:
        raise SlurmError("timed out")

    with pytest.raises(SlurmError):
        poll_until(fetch, bool, timeout=2.5, poll=2.0, patience=50, clock=clock, sleep=clock.sleep)
    assert clock.now == 2.5


def test_wait_for_gives_each_slurm_query_the_time_left(monkeypatch):
    seen: list[float] = []

    def job_state(job_id, *, env=None, timeout=None):
        seen.append(timeout)
        return "COMPLETED"

    monkeypatch.setattr(status, "job_state", job_state)
    assert status.wait_for("5", timeout=4.0, poll=1.0).value == "COMPLETED"
    assert status.wait_for("5", timeout=None, poll=1.0).value == "COMPLETED"
    assert seen[0] <= 2.0 and seen[1] == status.QUERY_TIMEOUT_S   # squeue and sacct both fit in the 4 s
