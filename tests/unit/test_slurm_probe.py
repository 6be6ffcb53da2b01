"""``clusters probe`` as a pure function: scontrol texts in, profile data / TOML out."""

from __future__ import annotations

import sys

import pytest

from scaletrain.clusters.probe import profile_from_scontrol, render_toml
from scaletrain.clusters.profile import profile_from_dict
from scaletrain.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# captured from the local test cluster (tests/slurm/harness/up.sh)
LOCAL_NODES = "\n".join(
    f"NodeName=n{i} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.36 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.1 "
    f"NodeHostName=localhost Port=781{7 + i} Version=22.05.8 OS=Linux 6.18.44-fc-v669 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=4000 AllocMem=0 FreeMem=22950 Sockets=8 Boards=1 State=IDLE "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug,long  "
    "CfgTRES=cpu=8,mem=4000M,billing=8 AllocTRES= CapWatts=n/a" for i in (1, 2))
LOCAL_PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES "
    "QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO "
    "MaxNodes=UNLIMITED MaxTime=02:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-2] "
    "PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE "
    "PreemptMode=OFF State=UP TotalCPUs=16 TotalNodes=2 SelectTypeParameters=NONE "
    "JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=16,mem=8000M,node=2,billing=16\n"
    "PartitionName=long AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO "
    "QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=2 "
    "MaxTime=1-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=n[1-2] PriorityJobFactor=1 "
    "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=EXCLUSIVE OverTimeLimit=NONE "
    "PreemptMode=OFF State=UP TotalCPUs=16 TotalNodes=2 SelectTypeParameters=NONE\n")

# shaped like Puhti: typed V100 GRES with socket affinity and NVMe, CPU-only nodes besides,
# a hidden partition, a test partition with a short limit
PUHTI_NODES = "\n".join([
    *(f"NodeName=r{i:02d}g0{j} Arch=x86_64 CoresPerSocket=20 CPUAlloc=40 CPUEfctv=40 CPUTot=40 "
      "Gres=gpu:v100:4(S:0-1),nvme:3600 NodeAddr=r01g01 NodeHostName=r01g01 "
      "OS=Linux 4.18.0-477.27.1.el8_8.x86_64 #1 SMP Thu Aug 31 10:29:22 EDT 2023 "
      "RealMemory=384000 AllocMem=0 Sockets=2 Boards=1 MemSpecLimit=2000 State=MIXED "
      "ThreadsPerCore=1 Partitions=gpu,gputest,gpu_internal"
      for i in (1, 2) for j in (1, 2, 3)),
    *(f"NodeName=r05c0{j} CoresPerSocket=20 CPUEfctv=40 CPUTot=40 Gres=(null) RealMemory=190000 "
      "Sockets=2 State=IDLE ThreadsPerCore=1 Partitions=small,large" for j in (1, 2, 3, 4, 5, 6, 7)),
])
PUHTI_PARTITIONS = "\n".join([
    "PartitionName=small AllowGroups=ALL Default=YES Hidden=NO MaxNodes=1 MaxTime=3-00:00:00 "
    "MinNodes=0 Nodes=r05c[01-07] OverSubscribe=NO State=UP",
    "PartitionName=large Default=NO Hidden=NO MaxNodes=26 MaxTime=3-00:00:00 MinNodes=0 "
    "Nodes=r05c[01-07] OverSubscribe=NO State=UP",
    "PartitionName=gpu Default=NO Hidden=NO MaxNodes=20 MaxTime=3-00:00:00 MinNodes=0 "
    "Nodes=r01g[01-03],r02g[01-03] OverSubscribe=NO State=UP",
    "PartitionName=gputest Default=NO Hidden=NO MaxNodes=2 MaxTime=00:15:00 MinNodes=0 "
    "Nodes=r01g[01-03],r02g[01-03] OverSubscribe=NO State=UP",
    "PartitionName=gpu_internal Default=NO Hidden=YES MaxNodes=UNLIMITED MaxTime=INFINITE "
    "Nodes=r01g[01-03],r02g[01-03] OverSubscribe=NO State=UP",
])

# shaped like LUMI-G: 8 MI250X GCDs, 56 usable cores (8 reserved), whole-node standard-g
LUMI_NODES = "\n".join(
    f"NodeName=nid00{i} CoresPerSocket=64 CPUEfctv=56 CPUTot=128 CoreSpecCount=8 "
    "Gres=gpu:mi250:8 RealMemory=491520 Sockets=1 ThreadsPerCore=2 State=IDLE "
    "Partitions=standard-g,small-g,dev-g" for i in range(5000, 5004))
LUMI_PARTITIONS = "\n".join([
    "PartitionName=standard-g Default=NO Hidden=NO MaxNodes=1024 MaxTime=2-00:00:00 MinNodes=1 "
    "OverSubscribe=EXCLUSIVE State=UP",
    "PartitionName=small-g Default=NO Hidden=NO MaxNodes=4 MaxTime=3-00:00:00 MinNodes=0 "
    "OverSubscribe=NO State=UP",
    "PartitionName=dev-g Default=NO Hidden=NO MaxNodes=32 MaxTime=03:00:00 MinNodes=0 "
    "OverSubscribe=NO State=UP",
])


def test_local_cluster_profile():
    prof = profile_from_scontrol(LOCAL_NODES, LOCAL_PARTITIONS, name="ci", site="scaletrain-ci")
    assert (prof["gpus_per_node"], prof["cores_per_node"]) == (2, 8)
    assert prof["mem_per_node_gb"] == pytest.approx(4000 / 1024, abs=0.05)
    assert (prof["gpu_request"], prof["gres_type"], prof["gpu_vendor"]) == ("gres", None, "nvidia")
    assert list(prof["partitions"]) == ["debug", "long"]
    debug, long_ = prof["partitions"]["debug"], prof["partitions"]["long"]
    assert debug == {"gpus": True, "whole_node": False, "default": True, "max_time": "02:00:00"}
    assert long_ == {"gpus": True, "whole_node": True, "default": False, "max_nodes": 2,
                     "max_time": "1-00:00:00"}
    loaded = profile_from_dict(tomllib.loads(render_toml(prof)))
    assert loaded.cores_per_gpu == 4
    assert loaded.default_partition.name == "debug"
    assert loaded.partitions["long"].max_seconds == 86400


def test_puhti_like_typed_gres_and_gpu_nodes_preferred():
    prof = profile_from_scontrol(PUHTI_NODES, PUHTI_PARTITIONS, name="puhti-probed")
    # 7 CPU nodes outnumber 6 GPU nodes, but a GPU profile describes the GPU nodes
    assert prof["gpus_per_node"] == 4
    assert (prof["gpu_request"], prof["gres_type"], prof["gpu_model"]) == ("gres_typed", "v100", "v100")
    assert prof["gpu_memory_gb"] == 32.0
    assert prof["cores_per_node"] == 40
    assert prof["mem_per_node_gb"] == pytest.approx((384000 - 2000) / 1024, abs=0.05)
    assert "gpu_internal" not in prof["partitions"]          # hidden
    assert prof["partitions"]["gputest"]["max_time"] == "00:15:00"
    assert prof["partitions"]["gputest"]["max_nodes"] == 2
    assert prof["partitions"]["small"]["gpus"] is False
    assert prof["partitions"]["gpu"]["gpus"] is True
    assert prof["partitions"]["small"]["default"] is True
    assert "7 node(s) 0 GPU(s)" in prof["description"]
    assert prof["partitions"]["gputest"]["test"] is True      # chosen only when named
    assert "test" not in prof["partitions"]["gpu"]
    loaded = profile_from_dict(tomllib.loads(render_toml(prof)))
    assert loaded.gpu_request == "gres_typed" and loaded.gres_type == "v100"
    assert loaded.cores_per_gpu == 10                           # Puhti: 10 cores per V100


def test_partition_filter_and_unknown_partition():
    prof = profile_from_scontrol(PUHTI_NODES, PUHTI_PARTITIONS, name="p", partitions=["small"])
    assert list(prof["partitions"]) == ["small"]
    assert prof["gpus_per_node"] == 0 and prof["gpu_vendor"] == "none"
    assert prof["cores_per_node"] == 40
    with pytest.raises(UsageError) as info:
        profile_from_scontrol(PUHTI_NODES, PUHTI_PARTITIONS, name="p", partitions=["gpux"])
    assert "gpux" in info.value.message and "gputest" in info.value.hint


def test_lumi_like_whole_node_amd_and_core_spec():
    prof = profile_from_scontrol(LUMI_NODES, LUMI_PARTITIONS, name="lumi-probed")
    assert (prof["gpus_per_node"], prof["gpu_vendor"], prof["gres_type"]) == (8, "amd", "mi250")
    assert prof["cores_per_node"] == 56               # CPUEfctv: what jobs can use
    parts = prof["partitions"]
    assert parts["standard-g"]["whole_node"] is True and parts["standard-g"]["max_nodes"] == 1024
    assert parts["small-g"]["whole_node"] is False
    assert parts["standard-g"]["max_time"] == "2-00:00:00"


def test_no_nodes_is_an_error():
    with pytest.raises(UsageError):
        profile_from_scontrol("", LOCAL_PARTITIONS, name="x")


def test_toml_round_trip():
    prof = profile_from_scontrol(PUHTI_NODES, PUHTI_PARTITIONS, name="puhti-probed", site='we"ird')
    text = render_toml(prof, header="probed\nsecond line")
    assert text.startswith("# probed\n# second line\n")
    data = tomllib.loads(text)
    expected = {k: v for k, v in prof.items() if v is not None}
    assert data == expected


def test_probe_cli_with_a_fake_scontrol(tmp_path, monkeypatch, capsys):
    """``scaletrain clusters probe`` end to end, scontrol replaced by the captured texts."""
    from scaletrain.cli.main import main
    from scaletrain.clusters.profile import load_profile

    (tmp_path / "nodes.txt").write_text(PUHTI_NODES + "\n")
    (tmp_path / "parts.txt").write_text(PUHTI_PARTITIONS + "\n")
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n"
                    f'case "$2" in node) cat {tmp_path}/nodes.txt;; partition) cat {tmp_path}/parts.txt;;\n'
                    "config) echo 'ClusterName = puhti';; esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    out = tmp_path / "profiles" / "p.toml"
    assert main(["clusters", "probe", "--output", str(out), "--partition", "gpu,gputest"]) == 0
    err = capsys.readouterr().err
    assert f"wrote profile 'puhti' to {out}" in err
    prof = load_profile(str(out))
    assert (prof.name, prof.gpus_per_node, prof.gres_type) == ("puhti", 4, "v100")
    assert list(prof.partitions) == ["gpu", "gputest"]
    assert out.read_text().startswith("# Cluster profile written by scaletrain")
    # probing again replaces the file whole (temporary file + rename: a new inode, no leftovers)
    before = out.stat().st_ino
    assert main(["clusters", "probe", "--output", str(out)]) == 0
    assert out.stat().st_ino != before and sorted(p.name for p in out.parent.iterdir()) == ["p.toml"]
    assert load_profile(str(out)).name == "puhti"
    assert main(["clusters", "probe", "--output", str(out.parent)]) == 2      # a folder: refused
    assert "is a directory" in capsys.readouterr().err


def test_probe_cli_without_scontrol_is_exit_4(tmp_path, monkeypatch, capsys):
    from scaletrain.cli.main import main

    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["clusters", "probe"]) == 4
    err = capsys.readouterr().err
    assert "'scontrol' not found" in err and "HINT:" in err
