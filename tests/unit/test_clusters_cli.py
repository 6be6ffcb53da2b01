"""``scaletrain clusters``: the list, one profile, --json, and the probe sub-command wiring."""

from __future__ import annotations

import json

from helpers import run_cli

run = run_cli


def test_list(capsys) -> None:
    rc, out, _ = run(capsys, "clusters")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[:3] == ["NAME", "SITE", "GPUS/NODE"]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert {"roihu", "jupiter", "lumi", "fir", "nibi", "rorqual", "trillium", "narval", "juwels-booster",
            "puhti", "mahti", "beluga", "cedar", "graham", "local"} <= set(rows)
    assert "gpumedium, gpularge, gputest, gpuinteractive" in rows["roihu"] and "MI250X" in rows["lumi"]
    # retired systems stay listed (lint reads their scripts), marked with the date and successor
    assert "RETIRED 2026-08-31, successor: roihu" in rows["mahti"]
    assert "RETIRED 2025-09-12, successor: fir" in rows["cedar"] and "RETIRED" not in rows["fir"]


def test_show_one(capsys) -> None:
    rc, out, _ = run(capsys, "clusters", "roihu")
    assert rc == 0 and out.startswith("roihu: ")
    assert "gpumedium    max 4 GPUs, max 4 nodes, max 1-12:00:00, default" in out and "--gres=gpu:gh200:N" in out
    # the sources with the date checked, each fact's source, and what is unconfirmed
    assert "sources (checked 2026-11-27):" in out
    assert "    gpu_request: CSC creating-job-scripts-roihu.md: '#SBATCH --gres=gpu:gh200:" in out
    assert "unconfirmed (no current document states these" in out
    assert "    partitions.gpumedium: CSC batch-job-partitions.md (checked 2026-11-26)" in out
    rc, out, _ = run(capsys, "clusters", "mahti")
    assert "RETIRED:         2026-08-31; successor: roihu (port scripts: scaletrain port OLD.sh --cluster roihu)" in out
    rc, out, _ = run(capsys, "clusters", "fir")
    assert "--gpus-per-node=h100:N" in out
    assert run(capsys, "clusters", "show", "fir")[1] == out      # the same, spelt with 'show'
    rc, out, _ = run(capsys, "clusters", "juwels-booster")
    assert "+ 'i'" in out


def test_json(capsys) -> None:
    rc, out, _ = run(capsys, "clusters", "--json")
    names = [p["name"] for p in json.loads(out)]
    assert rc == 0 and "lumi" in names
    rc, out, _ = run(capsys, "clusters", "lumi", "--json")
    data = json.loads(out)
    assert data["env"] == {"NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3", "NCCL_NET_GDR_LEVEL": "PHB"}
    assert data["software"] == "container" and data["container"] == "singularity exec"
    assert data["default_image"].startswith("/appl/local/laifs/containers/") and data["gpus_per_billing_unit"] == 2
    assert any(u.startswith("env:") for u in data["unconfirmed"]) and data["checked"] == "2026-11-27"
    rc, out, _ = run(capsys, "clusters", "--json")
    by_name = {p["name"]: p for p in json.loads(out)}
    assert (by_name["graham"]["retired"], by_name["graham"]["successor"]) == ("2025-09-01", "nibi")


def test_unknown_cluster(capsys) -> None:
    rc, out, err = run(capsys, "clusters", "summit")
    assert rc == 2 and "unknown cluster 'summit' (known: beluga" in err and "HINT:" in err


def test_probe_flags_only_with_probe(capsys) -> None:
    rc, _, err = run(capsys, "clusters", "--output", "x.toml")
    assert rc == 2 and "only go with 'probe'" in err


def test_probe_calls_the_slurm_helper_lazily(capsys, monkeypatch) -> None:
    import scaletrain.clusters.probe as probe

    seen = {}

    def fake_run_probe(args):
        seen.update(output=args.output, name=args.name, partition=args.partition)
        return 0

    monkeypatch.setattr(probe, "run_probe", fake_run_probe)
    rc, _, _ = run(capsys, "clusters", "probe", "--output", "p.toml", "--name", "mine", "--partition", "gpu")
    assert rc == 0 and seen == {"output": "p.toml", "name": "mine", "partition": "gpu"}


def test_the_cluster_table_never_cuts_a_site_mid_word():
    from scaletrain.cli.clusters import _short_site

    assert _short_site("CSC - IT Center for Science, Finland") == "CSC - IT Center for Science, Finland"
    long = "Juelich Supercomputing Centre (JSC), Forschungszentrum Juelich, Germany"
    short = _short_site(long)
    assert short == "Juelich Supercomputing Centre (JSC)..." and len(short) <= 38
    assert _short_site("LUMI consortium / EuroHPC JU (hosted by CSC, Finland)") == "LUMI consortium / EuroHPC JU..."
