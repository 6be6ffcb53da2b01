"""scaletrain.slurm.commands with fake Slurm commands on PATH (no cluster needed): errors,
sbatch's job id and working directory, wait()'s polling, retries and timeout."""

from __future__ import annotations

import pytest

from scaletrain.errors import SlurmError
from scaletrain.slurm import commands


def _fake(bin_dir, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_missing_slurm_command_is_one_line_slurm_error():
    with pytest.raises(SlurmError) as info:
        commands.sbatch_parsable("job.sh", env={"PATH": "/nonexistent"})
    assert info.value.exit_code == 4
    assert "sbatch" in info.value.message and "\n" not in info.value.message
    assert info.value.hint


def test_failing_command_error_is_slurms_last_error_line(tmp_path):
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: nope' >&2\n"
                    "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SlurmError) as info:
        commands.sbatch_parsable("job.sh", env={"PATH": str(tmp_path)})
    assert info.value.message == ("sbatch failed: sbatch: error: Batch job submission failed: "
                                  "Invalid partition name specified")


def test_sbatch_parsable_returns_the_id(tmp_path):
    fake = tmp_path / "sbatch"
    # prints its cwd and arguments to a file so the test sees how it was called
    fake.write_text(f"#!/bin/sh\necho \"$PWD $*\" > {tmp_path}/called\necho '4242;ci'\n")
    fake.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir()
    assert commands.sbatch_parsable("job.sh", cwd=run, env={"PATH": str(tmp_path)}) == "4242"
    assert (tmp_path / "called").read_text().split() == [str(run), "--parsable", "job.sh"]


def _counting_scontrol(tmp_path, *, fail_first: int, states: list[str]) -> dict[str, str]:
    """A scontrol that fails ``fail_first`` times, then reports ``states`` one call at a time."""
    lines = "\n".join(f"JobId=5 JobState={s} ExitCode=0:0 Reason=None" for s in states)
    (tmp_path / "states").write_text(lines + "\n")
    _fake(tmp_path, "scontrol",
          f'n=$(cat {tmp_path}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {tmp_path}/count\n'
          f'if [ $n -le {fail_first} ]; then echo "slurm_load_jobs error: Socket timed out" >&2; exit 1; fi\n'
          f'i=$((n-{fail_first})); last=$(wc -l < {tmp_path}/states)\n'
          f'[ $i -gt $last ] && i=$last\n'
          f'sed -n "${{i}}p" {tmp_path}/states\n')
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_wait_reports_each_state_once_and_returns_the_final_one(tmp_path):
    env = _counting_scontrol(tmp_path, fail_first=0,
                             states=["PENDING", "PENDING", "RUNNING", "RUNNING", "COMPLETED"])
    seen = []
    info = commands.wait("5", poll=0.01, env=env, on_change=lambda i: seen.append(i.state))
    assert seen == ["PENDING", "RUNNING", "COMPLETED"]
    assert info.returncode == 0


def test_wait_retries_a_busy_slurmctld(tmp_path):
    env = _counting_scontrol(tmp_path, fail_first=3, states=["COMPLETED"])
    assert commands.wait("5", poll=0.01, env=env).state == "COMPLETED"


def test_wait_gives_up_after_repeated_failures(tmp_path):
    env = _counting_scontrol(tmp_path, fail_first=99, states=["COMPLETED"])
    with pytest.raises(SlurmError) as info:
        commands.wait("5", poll=0.01, env=env)
    assert "Socket timed out" in info.value.message
    assert (tmp_path / "count").read_text().strip() == "5"


def test_wait_timeout_names_the_job(tmp_path):
    env = _counting_scontrol(tmp_path, fail_first=0, states=["RUNNING"])
    with pytest.raises(SlurmError) as info:
        commands.wait("5", timeout=0.05, poll=0.01, env=env)
    assert info.value.message.startswith("job 5 still RUNNING after")
    assert "scancel 5" in info.value.hint


def test_cluster_name_from_show_config(tmp_path):
    _fake(tmp_path, "scontrol", "echo 'Configuration data as of 2026-11-22T05:00:00'\n"
                                "echo 'AccountingStorageEnforce = none'\necho 'ClusterName             = puhti'\n")
    assert commands.cluster_name(env={"PATH": str(tmp_path)}) == "puhti"
    assert commands.cluster_name(env={"PATH": str(tmp_path / "none")}) is None
