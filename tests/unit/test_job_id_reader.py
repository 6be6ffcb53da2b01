"""A writer owns its reader (issue 40 item 2): the job id is read back by slurm.submit, the module that
records it, and status/report/cancel/logs get it through that one reader."""

from __future__ import annotations

import pytest

from scaletrain.jobs import runfolder
from scaletrain.slurm.submit import read_job_id


@pytest.mark.parametrize("content, job_id, note", [
    (None, None, None),
    ("4242\n", "4242", None),
    ("", None, "job_id is empty"),   # an empty file is said, not taken for no submit
    ("not-an-id\n", None, "job_id does not hold a job id ('not-an-id')"),
    ("١٢٣\n", None, "job_id does not hold a job id ('١٢٣')"),
    ("9" * 21, None, f"job_id does not hold a job id ({'9' * 20!r})"),
])
def test_the_job_id_is_read_by_the_module_that_writes_it(tmp_path, content, job_id, note):
    if content is not None:
        (tmp_path / "job_id").write_text(content)
    assert read_job_id(tmp_path) == (job_id, note)
    run = runfolder.open_run(tmp_path)
    assert run.job_id == job_id and (note in run.notes if note else run.notes == [])


def test_an_unreadable_job_id_is_a_note(tmp_path):
    (tmp_path / "job_id").mkdir()
    job_id, note = read_job_id(tmp_path)
    assert job_id is None and note.startswith("cannot read job_id: ")
