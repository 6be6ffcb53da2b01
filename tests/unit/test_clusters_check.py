"""``scaletrain clusters check``: the roihu profile against scontrol texts shaped like Roihu's GPU
side, one matching and one drifted (a limit, a GRES name, a partition gone, one added)."""

from __future__ import annotations

import pytest

from scaletrain.clusters.check import compare, render_report
from scaletrain.clusters.profile import load_profile


def _nodes(gres: str = "gpu:gh200:4", cpus: int = 288) -> str:
    return "\n".join(
        f"NodeName=g{i:04d} Arch=aarch64 CPUEfctv={cpus} CPUTot={cpus} Gres={gres} RealMemory=491520 "
        "State=IDLE Partitions=gputest,gpumedium,gpularge,gpuinteractive" for i in range(1, 5))


def _parts(medium_time: str = "1-12:00:00", extra: str = "", drop: str = "") -> str:
    rows = {
        "gpumedium": f"PartitionName=gpumedium Default=NO Hidden=NO MaxNodes=4 MaxTime={medium_time} "
                     "MinNodes=0 OverSubscribe=NO State=UP",
        "gpularge": "PartitionName=gpularge Default=NO Hidden=NO MaxNodes=UNLIMITED MaxTime=1-12:00:00 "
                    "MinNodes=0 OverSubscribe=NO State=UP",
        "gputest": "PartitionName=gputest Default=NO Hidden=NO MaxNodes=UNLIMITED MaxTime=00:15:00 "
                   "MinNodes=0 OverSubscribe=NO State=UP",
        "gpuinteractive": "PartitionName=gpuinteractive Default=NO Hidden=NO MaxNodes=1 MaxTime=12:00:00 "
                          "MinNodes=0 OverSubscribe=NO State=UP",
    }
    rows.pop(drop, None)
    return "\n".join([*rows.values(), *([extra] if extra else [])])


def test_matching_slurm_has_no_differences() -> None:
    prof = load_profile("roihu")
    assert compare(prof, _nodes(), _parts()) == []
    assert "matches Slurm" in render_report(prof, [])


def test_every_kind_of_drift_is_reported() -> None:
    prof = load_profile("roihu")
    new = ("PartitionName=gpuhuge Default=NO Hidden=NO MaxNodes=32 MaxTime=2-00:00:00 OverSubscribe=EXCLUSIVE "
           "State=UP Nodes=g0001")
    nodes = _nodes(gres="gpu:gh200_96g:4", cpus=280) + "\nNodeName=g0009 CPUEfctv=280 Gres=gpu:gh200_96g:4 " \
        "RealMemory=491520 State=IDLE Partitions=gpuhuge"
    diffs = compare(prof, nodes, _parts(medium_time="2-00:00:00", extra=new, drop="gputest"))
    lines = [d.line() for d in diffs]
    assert "GRES type: profile says gh200, Slurm says gh200_96g" in lines
    assert "CPU cores per GPU node: profile says 288, Slurm says 280" in lines
    assert "partition gpumedium time limit: profile says 1-12:00:00, Slurm says 2-00:00:00" in lines
    assert "partition gputest: profile says it exists, Slurm says no such partition" in lines
    assert "partition gpuhuge: profile says not listed, Slurm says a GPU partition" in lines
    assert len(diffs) == 5
    assert "5 differences" in render_report(prof, diffs)


def test_gpus_per_node_and_node_limit() -> None:
    prof = load_profile("roihu")
    diffs = compare(prof, _nodes(gres="gpu:gh200:2"), _parts().replace("MaxNodes=4 ", "MaxNodes=8 "))
    assert [d.line() for d in diffs] == [
        "GPUs per node: profile says 4, Slurm says 2",
        "partition gpumedium node limit: profile says 4, Slurm says 8"]


@pytest.mark.parametrize("name, code", [("roihu", 0), ("", 0)])
def test_check_cli_with_a_fake_scontrol(tmp_path, monkeypatch, capsys, name, code) -> None:
    from scaletrain.cli.main import main

    (tmp_path / "nodes.txt").write_text(_nodes() + "\n")
    (tmp_path / "parts.txt").write_text(_parts() + "\n")
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n"
                    f'case "$2" in node) cat {tmp_path}/nodes.txt;; partition) cat {tmp_path}/parts.txt;;\n'
                    "config) echo 'ClusterName = roihu';; esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    argv = ["clusters", "check"] + ([name] if name else [])
    assert main(argv) == code
    assert "profile roihu" in capsys.readouterr().out
    (tmp_path / "parts.txt").write_text(_parts(medium_time="3-00:00:00") + "\n")
    assert main(["clusters", "check", "roihu"]) == 1
    assert "time limit: profile says 1-12:00:00, Slurm says 3-00:00:00" in capsys.readouterr().out
    assert main(["clusters", "lumi", "roihu"]) == 2
