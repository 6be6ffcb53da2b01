"""Cluster profiles: every shipped file loads and matches what the seeds state; user
overrides and --profile files; malformed files give one line + HINT."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.clusters.profile import (
    ClusterProfile, _shipped_dir, format_time, list_profiles, load_profile, parse_time, profile_to_dict,
)
from scaletrain.errors import ProfileError

REQUIRED = {"puhti", "mahti", "lumi", "juwels-booster", "narval", "beluga", "cedar", "graham", "local"}


def test_all_required_profiles_ship_and_load() -> None:
    assert REQUIRED <= set(list_profiles())
    for name in REQUIRED:
        p = load_profile(name)
        assert isinstance(p, ClusterProfile) and p.name == name and p.sources and p.partitions
        assert p.default_partition is not None
        if name != "local":
            assert p.scheduler == "slurm" and p.gpus_per_node > 0 and p.account_required
            assert p.gpu_request in p.gpu_request_accepts
            # a named centre guide besides the URLs, and no internal words (issue 8, defect 10)
            assert any(not s.startswith("https://") for s in p.sources)
            assert not any("seed" in s.lower() for s in (*p.sources, *p.notes, *p.setup_lines))
            assert any(s.startswith("https://") for s in p.sources)
            assert p.intra_node_gbps and p.inter_node_gbps


@pytest.mark.parametrize("name,gpn,cores_per_gpu,gpu_request,partitions", [
    ("puhti", 4, 10, "gres_typed", ["gpu", "gputest"]),
    ("mahti", 4, 32, "gres_typed", ["gpusmall", "gpumedium", "gputest"]),
    ("lumi", 8, 7, "gpus_per_node", ["small-g", "standard-g", "dev-g", "small"]),   # small: LUMI-C, CPU-only
    ("juwels-booster", 4, 24, "gres", ["booster", "develbooster"]),
    ("narval", 4, 12, "gpus_per_node_typed", ["default"]),
    ("beluga", 4, 10, "gres_typed", ["default"]),
    ("cedar", 4, 6, "gres_typed", ["default"]),
    ("graham", 2, 16, "gres_typed", ["default"]),
])
def test_seed_stated_values(name, gpn, cores_per_gpu, gpu_request, partitions) -> None:
    p = load_profile(name)
    assert (p.gpus_per_node, p.cores_per_gpu, p.gpu_request) == (gpn, cores_per_gpu, gpu_request)
    assert list(p.partitions) == partitions


def test_seed_specific_facts() -> None:
    mahti = load_profile("mahti")
    assert mahti.partitions["gpusmall"].max_gpus == 2 and mahti.partitions["gpumedium"].whole_node
    lumi = load_profile("lumi")
    assert lumi.env["NCCL_SOCKET_IFNAME"].startswith("hsn") and lumi.mem_per_gpu == 60
    assert lumi.partitions["standard-g"].whole_node and not lumi.partitions["small-g"].whole_node
    assert lumi.gpu_cpu_map[0] == (49, 50, 51, 52, 53, 54, 55) and lumi.gpu_cpu_map[4][0] == 1
    all_cores = sorted(c for cores in lumi.gpu_cpu_map.values() for c in cores)
    assert len(all_cores) == 56 and not {0, 8, 16, 24, 32, 40, 48, 56} & set(all_cores)
    assert load_profile("juwels-booster").master_addr_suffix == "i"
    assert load_profile("puhti").scratch_var == "$LOCAL_SCRATCH" and load_profile("mahti").scratch_gres == "nvme"
    assert load_profile("narval").scratch_var == "$SLURM_TMPDIR"
    assert load_profile("puhti").setup_lines == ("module purge", "module load pytorch")
    assert "module use /appl/local/csc/modulefiles" in load_profile("lumi").setup_lines
    assert load_profile("cedar").mem_per_gpu == 31.25       # seed 003: 32000M on Cedar
    assert load_profile("graham").mem_per_gpu == 62.5       # seed 003: 64000M on Graham


def test_local_profile_counts_cores_or_takes_a_declared_value(tmp_path: Path, monkeypatch) -> None:
    import os
    assert load_profile("local").cores_per_node == len(os.sched_getaffinity(0))
    text = (_shipped_dir() / "local.toml").read_text().replace("cores_per_node = 0", "cores_per_node = 64")
    f = tmp_path / "local.toml"
    f.write_text(text)
    assert load_profile(str(f)).cores_per_node == 64


def test_user_directory_shadows_and_adds(tmp_path: Path, monkeypatch) -> None:
    text = (_shipped_dir() / "puhti.toml").read_text()
    (tmp_path / "puhti.toml").write_text(text.replace("cores_per_node = 40", "cores_per_node = 36"))
    (tmp_path / "tiny.toml").write_text(text.replace('name = "puhti"', 'name = "tiny"'))
    monkeypatch.setenv("SCALETRAIN_CLUSTERS_DIR", str(tmp_path))
    assert load_profile("puhti").cores_per_node == 36
    assert "tiny" in list_profiles() and load_profile("tiny").name == "tiny"
    monkeypatch.delenv("SCALETRAIN_CLUSTERS_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    (tmp_path / "cfg" / "scaletrain" / "clusters").mkdir(parents=True)
    assert load_profile("puhti").cores_per_node == 40


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.replace("gpus_per_node = 4", "gpus_per_node = \"four\""), "gpus_per_node"),
    (lambda t: t.replace('gpu_request = "gres_typed"', 'gpu_request = "gpus_please"'), "gpu_request"),
    (lambda t: t + "\nflavour = 1\n", "unknown field(s) flavour"),
    (lambda t: t.replace('max_time = "3-00:00:00"', 'max_time = "forever"'), "max_time must be a time limit"),
    (lambda t: t.replace("cores_per_node = 40", ""), "missing field 'cores_per_node'"),
    (lambda t: t + "\n[[[", "not valid TOML"),
])
def test_malformed_profiles(tmp_path: Path, edit, needle) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(edit((_shipped_dir() / "puhti.toml").read_text()))
    with pytest.raises(ProfileError) as info:
        load_profile(str(f))
    assert needle in str(info.value) and info.value.hint and info.value.exit_code == 2


def test_missing_profile_file() -> None:
    with pytest.raises(ProfileError, match="not found"):
        load_profile("/nonexistent/x.toml")


def test_time_helpers() -> None:
    assert parse_time("1:00:00") == 3600 and parse_time("0-03:00") == 10800 and parse_time("15") == 900
    assert parse_time("3-00:00:00") == 259200 and parse_time("10:30") == 630
    assert format_time(93600) == "1-02:00:00" and format_time(900) == "00:15:00"


def test_profile_to_dict_is_json_ready() -> None:
    import json
    d = profile_to_dict(load_profile("lumi"))
    assert json.loads(json.dumps(d))["gpu_cpu_map"]["0"][0] == 49
