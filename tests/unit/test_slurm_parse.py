"""Pure parsers of Slurm output (scaletrain.slurm.parse, slurm.commands.job_info_from_record),
fed with text captured from Slurm 22.05 (the local test cluster) and shaped like real clusters'."""

from __future__ import annotations

import pytest

from scaletrain.slurm.commands import job_info_from_record
from scaletrain.slurm.parse import (
    Gres,
    format_time,
    gpu_gres,
    parse_exit_code,
    parse_gres,
    parse_job_id,
    parse_limit,
    parse_record,
    parse_records,
    parse_time_seconds,
)

# captured from the 2-node test cluster (tests/slurm/harness/up.sh), Slurm 22.05.8
NODE_N1 = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.36 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=7818 Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=4000 AllocMem=0 FreeMem=22950 Sockets=8 Boards=1 State=IDLE "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug,long  "
    "BootTime=2026-11-22T04:48:56 SlurmdStartTime=2026-11-22T04:55:26 "
    "LastBusyTime=2026-11-22T04:55:26 CfgTRES=cpu=8,mem=4000M,billing=8 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")

JOB_COMPLETED = (
    "JobId=1 JobName=st-a.sbatch UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
    "Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=02:00:00 TimeMin=N/A "
    "SubmitTime=2026-11-22T04:55:30 Partition=debug AllocNode:Sid=localhost:2804 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=4 "
    "NumTasks=4 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=4,node=2,billing=4 Socks/Node=* "
    "NtasksPerN:B:S:C=2:0:*:* CoreSpec=* Command=/tmp/st-a.sbatch WorkDir=/tmp "
    "StdErr=/tmp/st-a-1.out StdIn=/dev/null StdOut=/tmp/st-a-1.out Power= TresPerNode=gres:gpu:2 ")

JOB_FAILED = (
    "JobId=2 JobName=st-b.sbatch UserId=root(0) GroupId=root(0) JobState=FAILED "
    "Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=3:0 RunTime=00:00:00 NodeList=n1 StdErr=/tmp/st-b-2.out StdIn=/dev/null "
    "StdOut=/tmp/st-b-2.out Power= ")


def test_record_keeps_values_with_spaces_and_odd_keys():
    rec = parse_record(NODE_N1)
    assert rec["NodeName"] == "n1"
    assert rec["OS"] == "Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0"
    assert rec["RealMemory"] == "4000"
    assert rec["Gres"] == "gpu:2"
    assert rec["Partitions"] == "debug,long"
    assert rec["CfgTRES"] == "cpu=8,mem=4000M,billing=8"
    assert rec["AllocTRES"] == ""
    job = parse_record(JOB_COMPLETED)
    assert job["AllocNode:Sid"] == "localhost:2804"
    assert job["CPUs/Task"] == "1"
    assert job["ReqB:S:C:T"] == "0:0:*:*"
    assert job["NtasksPerN:B:S:C"] == "2:0:*:*"
    assert job["Power"] == ""
    assert job["TresPerNode"] == "gres:gpu:2"


def test_records_one_per_line_and_blank_lines_skipped():
    text = NODE_N1 + "\n\n" + NODE_N1.replace("NodeName=n1", "NodeName=n2") + "\n"
    assert [r["NodeName"] for r in parse_records(text)] == ["n1", "n2"]
    assert parse_records("No nodes in the system\n") == []


@pytest.mark.parametrize("text,expected", [
    ("gpu:2", [Gres(name="gpu", type=None, count=2)]),
    ("gpu:v100:4(S:0-1),nvme:3600", [Gres(name="gpu", type="v100", count=4),
                                     Gres(name="nvme", type=None, count=3600)]),
    ("gpu:a100:4(S:0,2)", [Gres(name="gpu", type="a100", count=4)]),
    ("gpu:mi250:8", [Gres(name="gpu", type="mi250", count=8)]),
    ("gpu:a100_3g.20gb:2(IDX:0-1)", [Gres(name="gpu", type="a100_3g.20gb", count=2)]),
    ("gpu", [Gres(name="gpu", type=None, count=1)]),
    ("gpu:v100", [Gres(name="gpu", type="v100", count=1)]),
    ("(null)", []),
    ("", []),
])
def test_parse_gres(text, expected):
    assert parse_gres(text) == expected


def test_gpu_gres_total_and_type():
    assert gpu_gres("gpu:v100:4(S:0-1),nvme:3600") == (4, "v100")
    assert gpu_gres("gpu:2") == (2, None)
    assert gpu_gres("gpu:a100:2,gpu:a100:2") == (4, "a100")
    assert gpu_gres("gpu:a100:2,gpu:v100:2") == (4, None)   # mixed types: untyped request
    assert gpu_gres("nvme:3600") == (0, None)
    assert gpu_gres("(null)") == (0, None)


@pytest.mark.parametrize("text,seconds", [
    ("INFINITE", None), ("UNLIMITED", None), ("", None), (None, None),
    ("15", 15 * 60), ("15:30", 15 * 60 + 30), ("02:00:00", 7200), ("1-00:00:00", 86400),
    ("3-00:00:00", 3 * 86400), ("2-12", 2 * 86400 + 12 * 3600), ("1-02:03", 86400 + 2 * 3600 + 180),
    ("1-02:03:04", 86400 + 7200 + 184),
])
def test_parse_time_seconds(text, seconds):
    assert parse_time_seconds(text) == seconds


def test_parse_time_rejects_garbage():
    with pytest.raises(ValueError):
        parse_time_seconds("two hours")


def test_format_time_round_trips():
    assert format_time(7200) == "02:00:00"
    assert format_time(86400) == "1-00:00:00"
    assert format_time(36 * 3600 + 61) == "1-12:01:01"
    for text in ("00:15:00", "02:00:00", "1-00:00:00", "3-00:00:00"):
        assert format_time(parse_time_seconds(text)) == text


def test_limits_exit_codes_and_job_ids():
    assert parse_limit("2") == 2
    assert parse_limit("UNLIMITED") is None
    assert parse_limit(None) is None
    assert parse_exit_code("3:0") == (3, 0)
    assert parse_exit_code("0:9") == (0, 9)
    assert parse_exit_code(None) == (0, 0)
    assert parse_job_id("1234\n") == "1234"
    assert parse_job_id("1234;cluster2\n") == "1234"
    with pytest.raises(ValueError):
        parse_job_id("sbatch: error: something\n")


def test_job_info_completed_and_failed():
    ok = job_info_from_record(parse_record(JOB_COMPLETED))
    assert (ok.job_id, ok.state, ok.finished, ok.returncode) == ("1", "COMPLETED", True, 0)
    assert ok.stdout == "/tmp/st-a-1.out"
    assert ok.node_list == "n[1-2]"
    bad = job_info_from_record(parse_record(JOB_FAILED))
    assert (bad.state, bad.exit_code, bad.returncode, bad.reason) == ("FAILED", 3, 3, "NonZeroExitCode")
    running = job_info_from_record(parse_record(JOB_COMPLETED.replace("JobState=COMPLETED", "JobState=RUNNING")))
    assert not running.finished


def test_job_info_return_codes_for_signals_and_timeouts():
    killed = job_info_from_record(parse_record("JobId=5 JobState=CANCELLED ExitCode=0:15"))
    assert killed.returncode == 128 + 15
    timeout = job_info_from_record(parse_record("JobId=6 JobState=TIMEOUT ExitCode=0:0"))
    assert timeout.finished and timeout.returncode == 1
    cancelled = job_info_from_record(parse_record("JobId=7 JobState=CANCELLED Reason=None ExitCode=0:0"))
    assert cancelled.returncode == 1
