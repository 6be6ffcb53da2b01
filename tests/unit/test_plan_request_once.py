"""A ``JobRequest`` is validated once, when it is made; planning trusts it (issue 31.3).

Following a request through ``make_plan`` enters ``plan/values.py`` (the rules for every value
that reaches a script) not at all: the request's own ``__post_init__`` entered it once.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.errors import UsageError
from scaletrain.plan import values
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import render_script
from scaletrain.plan.request import JobRequest

VALUES = str(Path(values.__file__).resolve())
FULL = dict(cluster="roihu", script="train.py", script_args=("--epochs", "3"), gpus=8, account="project_1",
            job_name="run1", env=(("NCCL_DEBUG", "INFO"),), setup=("echo hi",), mail_type="END",
            mail_user="me@uni.fi", sbatch_extra=(("begin", "now+1hour"),), files_dir="/scratch/run",
            modules=("pytorch",), qos="normal")


def _entries(call: Any) -> list[str]:
    """The functions of plan/values.py that ``call()`` enters from outside it."""
    entered: list[str] = []

    def watch(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_filename == VALUES and frame.f_back is not None \
                and frame.f_back.f_code.co_filename != VALUES:
            entered.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


def test_the_request_is_checked_once_when_made_and_planning_trusts_it() -> None:
    profile = load_profile("roihu")
    made: list[JobRequest] = []
    assert _entries(lambda: made.append(JobRequest(**FULL))) == ["check_request_values"]
    assert _entries(lambda: make_plan(made[0], profile)) == []


@pytest.mark.parametrize("change, says", [
    ({"job_name": "a\nb"}, "--job-name must be one line of text"),
    ({"env": (("1BAD", "x"),)}, "environment variable name '1BAD'"),
    ({"mail_user": "x"}, "--mail-user 'x' is not a valid value"),
    ({"sbatch_extra": (("begin", "a\nb"),)}, "--begin contains a control character"),
    ({"gpus": 0}, "--gpus must be a whole number from 1 to 100,000, got 0"),
    ({"launcher": "nope"}, "--launcher must be one of 'scaletrain', "),
    ({"deepspeed_config": "/a\nb.json"}, "--deepspeed-config must be one line of text"),
])
def test_a_bad_value_is_refused_when_the_request_is_made(change: dict[str, Any], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        JobRequest(**{**FULL, **change})
    good = JobRequest(**FULL)
    with pytest.raises(UsageError, match=says):     # a changed copy is a new request: checked again
        dataclasses.replace(good, **change)


def test_the_trusted_values_still_reach_the_script_quoted() -> None:
    plan = make_plan(JobRequest(**{**FULL, "script_args": ("a b", "$(id)"), "env": (("X", "it's"),)}),
                     load_profile("roihu"))
    text = render_script(plan)
    assert "train.py 'a b' '$(id)'" in text and "export X='it'\"'\"'s'" in text
