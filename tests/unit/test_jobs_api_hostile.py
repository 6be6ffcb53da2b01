"""The Python Job API and the small promises of issue 29 item 9: a timeout that never ends is
refused, a wrong type is one TypeError/UsageError line naming the parameter, scancel is bounded
like the other queries, and the --venv hint is quoted for the shell it is pasted into."""

from __future__ import annotations

import pytest
from helpers import run_cli
from test_jobs_hostile import make_run, row, slurm  # noqa: F401 - the fake Slurm fixture

from scaletrain.errors import UsageError
from scaletrain.jobs import api


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0])
def test_job_wait_refuses_a_timeout_that_never_ends(slurm, timeout):
    run = make_run(slurm)
    (slurm / "queue").write_text(row("101", "RUNNING"))
    with pytest.raises(UsageError, match="timeout must be a finite number"):
        api.Job(run).wait(timeout=timeout, poll=0.01)


WRONG = [
    (lambda run: api.Job(123), TypeError, "run_dir"),
    (lambda run: api.Job(None), TypeError, "run_dir"),
    (lambda run: api.Job(""), UsageError, "run_dir"),
    (lambda run: api.Job(run, env=["PATH"]), TypeError, "env"),
    (lambda run: api.Job(run, env={"A": 1}), TypeError, "env"),
    (lambda run: api.Job(run).wait(timeout="60"), UsageError, "timeout"),   # the settings vocabulary
    (lambda run: api.Job(run).wait(poll=0), UsageError, "poll"),
    (lambda run: api.Job(run).wait(poll="5"), UsageError, "poll"),
    (lambda run: api.Job(run).logs(rank="0"), UsageError, "rank must be a whole number from 0"),
    (lambda run: api.Job(run).logs(rank=-1), UsageError, "rank must be a whole number from 0"),
    (lambda run: api.Job(run).logs(rank=True), UsageError, "rank must be a whole number from 0"),
    (lambda run: api.Job(run).logs(rank=float("nan")), UsageError, "rank must be a whole number from 0"),
    (lambda run: api.Job(run).cancel(save="no"), UsageError, "save must be True or False"),
    (lambda run: api.Job(run).cancel(save=1), UsageError, "save must be True or False"),
    (lambda run: api.Job(run).cancel(wait_s="300"), UsageError, "wait_s"),
    (lambda run: api.Job(run).report(out=5), TypeError, "out"),
]


@pytest.mark.parametrize("call, error, name", WRONG, ids=[str(i) for i in range(len(WRONG))])
def test_job_api_wrong_types_name_the_parameter(slurm, call, error, name):
    run = make_run(slurm)
    with pytest.raises(error) as info:
        call(run)
    assert str(info.value).startswith(name) and "\n" not in str(info.value)


def test_scancel_is_bounded_like_the_other_queries(monkeypatch):
    from scaletrain.slurm import commands

    seen = {}
    monkeypatch.setattr(commands, "run_command", lambda argv, **kw: seen.update(kw) or "")
    commands.cancel("101")
    assert seen["timeout"] == commands.QUERY_TIMEOUT_S == 10.0


def test_venv_hint_is_quoted(capsys, tmp_path):
    # a name the shell would run is refused outright (issue 29 item 2); one with a space is
    # allowed and its hint must still paste as one word
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "roihu", "--dry-run", str(tmp_path / "a b"))
    assert code == 0 and f"--venv '{tmp_path}/a b'" in err
    code, _, err = run_cli(capsys, "env", "create", "--cluster", "roihu", "--dry-run", str(tmp_path / "a b;$(x)"))
    assert code == 2 and "HINT" in err and "Traceback" not in err
