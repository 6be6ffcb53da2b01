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
    assert {"puhti", "mahti", "lumi", "juwels-booster", "narval", "beluga", "cedar", "graham", "local"} <= set(rows)
    assert "gpusmall, gpumedium, gputest" in rows["mahti"] and "MI250X" in rows["lumi"]


def test_show_one(capsys) -> None:
    rc, out, _ = run(capsys, "clusters", "mahti")
    assert rc == 0 and out.startswith("mahti: ")
    assert "gpusmall     max 2 GPUs" in out and "--gres=gpu:a100:N" in out and "sources:" in out
    rc, out, _ = run(capsys, "clusters", "juwels-booster")
    assert "+ 'i'" in out


def test_json(capsys) -> None:
    rc, out, _ = run(capsys, "clusters", "--json")
    names = [p["name"] for p in json.loads(out)]
    assert rc == 0 and "lumi" in names
    rc, out, _ = run(capsys, "clusters", "lumi", "--json")
    assert json.loads(out)["env"] == {"NCCL_SOCKET_IFNAME": "hsn"}


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
