"""Messages that say what is wrong: ``run`` on a pipe, a folder or /dev/zero said "script not found";
``cancel`` of a folder whose job_id is empty said "no job_id file"; lint said nothing of
``--nodes=1e400`` or ``nan``; the node sampler took ``--interval nan``, ``-5`` and ``1e400``."""

from __future__ import annotations

import os

import pytest
from helpers import run_cli

from scaletrain.jobs import api
from scaletrain.errors import UsageError
from scaletrain.lint.engine import lint_text
from scaletrain.observe import nodesampler


@pytest.mark.parametrize("make, says", [
    (lambda p: os.mkfifo(p), "is a pipe (FIFO), not a script"),
    (lambda p: p.mkdir(), "is a folder, not a script"),
    (None, "is a device, not a script"),
])
def test_run_says_what_the_target_is(capsys, tmp_path, make, says):
    target = tmp_path / "train.py"
    if make is None:
        target = "/dev/zero"
    else:
        make(target)
    code, out, err = run_cli(capsys, "run", "--cpu", str(target))
    assert code == 2 and err.startswith(f"scaletrain: error: {target} {says}"), err
    assert "not found" not in err


def test_run_of_a_missing_script_still_says_not_found(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--cpu", str(tmp_path / "nope.py"))
    assert code == 2 and "script not found" in err


@pytest.mark.parametrize("content", ["", "  \n"])
def test_cancel_and_job_say_the_job_id_file_is_empty(capsys, tmp_path, content):
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.sh").write_text("#!/bin/bash\n")
    (run / "job_id").write_text(content)
    code, out, err = run_cli(capsys, "cancel", str(run))
    assert code == 2 and "job_id is empty" in err and "no job_id file" not in err, err
    with pytest.raises(UsageError, match="job_id is empty"):
        api.Job(run)


HEAD = "#!/bin/bash\n#SBATCH --time=01:00:00\n"


@pytest.mark.parametrize("option, value", [
    ("nodes", "1e400"), ("nodes", "nan"), ("nodes", "-1"), ("nodes", "0"), ("nodes", "4-2"), ("nodes", "2.5"),
    ("nodes", "9" * 5000), ("ntasks-per-node", "inf"), ("cpus-per-task", "0"), ("gpus-per-node", "a100:x"),
    ("mem", "lots"), ("mem-per-gpu", "-4G"), ("time", "soon"),
])
def test_lint_reports_a_value_sbatch_cannot_read(option, value):
    result = lint_text(HEAD + f"#SBATCH --{option}={value}\n\nsrun python train.py\n")
    found = [f for f in result.findings if f.rule == "sbatch-value"]
    assert len(found) == 1 and found[0].severity == "error" and found[0].line == 3
    assert found[0].message.startswith(f"--{option}={value[:20]}") and "sbatch refuses the job" in found[0].message


@pytest.mark.parametrize("option, value", [("nodes", "2"), ("nodes", "1-4"), ("gpus-per-node", "a100:4"),
                                           ("gpus", "0"), ("mem", "32G"), ("mem", "0"), ("time", "2-00:00:00"),
                                           ("time", "UNLIMITED"), ("job-name", "-1")])
def test_lint_takes_what_sbatch_reads(option, value):
    result = lint_text(HEAD + f"#SBATCH --{option}={value}\n\nsrun python train.py\n")
    assert not [f for f in result.findings if f.rule == "sbatch-value"]


@pytest.mark.parametrize("interval", ["nan", "-5", "1e400", "abc", "0", "99999"])
def test_the_node_sampler_refuses_an_interval_it_cannot_wait(capsys, tmp_path, interval):
    assert nodesampler.main([str(tmp_path / "out"), "--interval", interval]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scaletrain: error: --interval must be a finite number from 1 to 3600 (seconds)"), err
    assert not (tmp_path / "out").exists()
