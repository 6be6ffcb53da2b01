"""A notebook's job lifecycle through the Python API: mypy checks that every name keeps its type
(tests/unit/test_typing.py). Never run: it would submit a job."""

from __future__ import annotations

from typing import assert_type

import scaletrain
from scaletrain.jobs.api import Job
from scaletrain.jobs.cancel import CancelResult
from scaletrain.jobs.status import RunStatus


def lifecycle() -> None:
    job = scaletrain.submit(cluster="puhti", gpus=8, account="project_123",
                            program=["train.py", "--epochs", "10"], time="01:00:00", requeue=True)
    assert_type(job, Job)
    assert_type(job.job_id, str)
    assert_type(job.state, str)
    assert_type(job.status(), RunStatus)
    assert_type(job.status().step, int | None)
    assert_type(job.wait(timeout=60.0), str)
    assert_type(job.logs(rank=0), str)
    assert_type(job.cancel(save=True), CancelResult)
    assert_type(job.cancel(save=True).saved_step, int | None)
    assert_type(job.report(), str)
    again = scaletrain.Job(job.run_dir)
    assert_type(again, Job)
