"""What grew faster than a job of thousands of ranks in its files and scripts (docs/scale.md):
the checkpoint check resolved every listed path, the report read every reading of every node
sampler, the TensorFlow task copied its worker list once per node, and scaletrain's own gloo
group connected every rank to every other. Each test counts work, never time."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import reference_checksum
from scaletrain.checkpoint import layout


def _checkpoint(directory: Path, ranks: int) -> None:
    """A committed step folder of ``ranks`` ranks' files in the real layout (checksums: crc32c)."""
    from scaletrain.checkpoint import checksum

    folder = directory / layout.step_dirname(10)
    (folder / "sharded").mkdir(parents=True)
    files, crcs = {}, {}
    names = ["replicated.pt", "sharded/.metadata"] + [f"rank-{r:05d}.pt" for r in range(ranks)] + \
        [f"sharded/__{r}_0.distcp" for r in range(ranks)]
    for name in names:
        (folder / name).write_bytes(name.encode())
        files[name] = len(name)
        crcs[name] = reference_checksum(checksum.ALGORITHM, name.encode())
    marker = {"format": 2, "step": 10, "world_size": ranks, "objects": {}, "files": files, checksum.ALGORITHM: crcs}
    (folder / "COMMIT.json").write_text(json.dumps(marker))


def test_checking_a_checkpoint_lists_its_folders_and_resolves_no_path_per_file(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 300)
    calls = []
    real = Path.resolve
    monkeypatch.setattr(Path, "resolve", lambda self, *a, **k: calls.append(self) or real(self, *a, **k))
    choice = layout.choose(tmp_path, verify_bytes=0)
    assert choice.step == 10 and not choice.skipped
    assert len(calls) <= 4, f"{len(calls)} paths resolved for 602 files"


def test_the_check_still_finds_what_it_found(tmp_path):
    _checkpoint(tmp_path, 8)
    folder = tmp_path / layout.step_dirname(10)
    marker = layout.read_marker(folder)
    assert layout.verify_files(folder, marker) is None
    (folder / "sharded" / "__3_0.distcp").write_bytes(b"x")
    assert layout.verify_files(folder, marker) == "sharded/__3_0.distcp has 1 bytes, the commit marker says 20 (truncated?)"
    (folder / "sharded" / "__3_0.distcp").unlink()
    assert layout.verify_files(folder, marker) == "sharded/__3_0.distcp is missing"
    outside = tmp_path / "elsewhere"
    outside.write_bytes(b"sharded/__3_0.distcp")
    (folder / "sharded" / "__3_0.distcp").symlink_to(outside)
    assert "leads outside the checkpoint folder" in layout.verify_files(folder, marker)
    (folder / "sharded" / "__3_0.distcp").unlink()
    os.rename(folder / "sharded", tmp_path / "moved")
    (folder / "sharded").symlink_to(tmp_path / "moved")
    assert "leads outside the checkpoint folder" in layout.verify_files(folder, marker)


class _NoWait:
    """A stop event that never stops the sampler and never makes it wait between readings."""

    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float) -> bool:
        return False


class _Backend:
    name = "fake"

    def __init__(self, util: float) -> None:
        self.util = util

    def read(self):
        from scaletrain.observe.devices import Sample

        return {"0": Sample(util_pct=self.util, mem_gb=1.0, power_w=1.0),
                "1": Sample(util_pct=self.util / 2, mem_gb=1.0, power_w=1.0)}

    def close(self) -> None:
        pass


def test_the_report_reads_a_sampler_file_at_its_ends_and_counts_every_reading(tmp_path, monkeypatch):
    from scaletrain.jobs import gpus
    from scaletrain.observe import nodesampler

    path = nodesampler.sample_loop(tmp_path, 10.0, _Backend(80.0), vendor="nvidia", host="g1", max_samples=40,
                                   stop=_NoWait())
    # a requeued run appends to the same file: its readings' totals go on from the first run's
    nodesampler.sample_loop(tmp_path, 10.0, _Backend(40.0), vendor="nvidia", host="g1", max_samples=20,
                            stop=_NoWait())
    whole, _ = gpus.read_samplers([path])
    assert [round(g.mean_util(), 6) for g in whole] == [round((40 * 80 + 20 * 40) / 60, 6), round((40 * 40 + 20 * 20) / 60, 6)]
    assert whole[0].busy_hours() == pytest.approx((40 * 0.8 + 20 * 0.4) * 10 / 3600)
    lines = []
    real = nodesampler.read_samples
    monkeypatch.setattr(gpus, "read_samples", lambda p: (lines.append(p), real(p))[1])
    again, _ = gpus.read_samplers([path])
    assert lines == [] and [g.busy_hours() for g in again] == [g.busy_hours() for g in whole]


def test_the_report_names_twenty_idle_gpus_and_counts_the_rest(tmp_path):
    from scaletrain.jobs import report, report_page
    from scaletrain.observe import nodesampler

    run = tmp_path / "run"
    for node in range(30):
        nodesampler.sample_loop(run, 10.0, _Backend(10.0), vendor="nvidia", host=f"n{node:02d}", max_samples=2,
                                stop=_NoWait())
    (run / "metrics.jsonl").write_text(json.dumps({"type": "start", "time": 0.0}) + "\n")
    text = report_page.render_text(report.build(run, use_sacct=False))
    named = [line for line in text.splitlines() if line.startswith("  idle or starved: n")]
    assert len(named) == 20 and "idle or starved: 40 more GPUs" in text
    assert report.figures(report.build(run, use_sacct=False))["gpus_sampled"] == 60


def _tf_trace_bytes(tmp_path: Path, nodes: int) -> int:
    """Bytes of bash's trace of the TensorFlow task's shell at ``nodes`` nodes: each command bash
    runs is traced with its expanded words, so a value copied whole at every node shows."""
    from scaletrain.frameworks.tensorflow import TASK_SHELL

    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\nseq -f 'jpbo-%04g' 0 {nodes - 1}\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "jpbo-[0000-9999]", "MASTER_PORT": "12000",
           "SLURM_JOB_ID": "77", "SLURM_PROCID": "0"}
    proc = subprocess.run(["bash", "-xc", TASK_SHELL + '; printf %s "$TF_CONFIG"'], capture_output=True, env=env,
                          timeout=120, check=True)
    assert len(json.loads(proc.stdout)["cluster"]["worker"]) == nodes
    return len(proc.stderr)


def test_the_tensorflow_task_builds_its_worker_list_once(tmp_path):
    small, large = _tf_trace_bytes(tmp_path, 300), _tf_trace_bytes(tmp_path, 1200)
    assert large / small < 6, (small, large)      # 4x the nodes: ~4x the work; 16x when copied each time


def test_scaletrains_gloo_group_is_made_lazily_and_a_users_choice_stands(monkeypatch):
    from scaletrain.checkpoint import comm

    seen = []

    class Dist:
        group = type("G", (), {"WORLD": object()})

        def get_rank(self):
            return 3

        def get_world_size(self):
            return 24000

        def new_group(self, backend=None):
            seen.append((backend, os.environ.get("TORCH_GLOO_LAZY_INIT")))
            return object()

    monkeypatch.setattr(comm, "_GROUP", None)
    monkeypatch.delenv("TORCH_GLOO_LAZY_INIT", raising=False)
    comm._checkpoint_group(Dist())
    assert seen == [("gloo", "1")] and "TORCH_GLOO_LAZY_INIT" not in os.environ
    monkeypatch.setattr(comm, "_GROUP", None)
    monkeypatch.setenv("TORCH_GLOO_LAZY_INIT", "0")
    comm._checkpoint_group(Dist())
    assert seen[-1] == ("gloo", "0")


def test_rank_0_gets_a_file_descriptor_per_rank_where_the_hard_limit_allows(monkeypatch):
    import resource

    from scaletrain.runtime import gloo

    limits = {"now": (1024, 65536)}
    monkeypatch.setattr(resource, "getrlimit", lambda what: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda what, value: limits.update(now=value))
    assert gloo.enough_files(24000 + gloo.FILES_MARGIN) == 25024 and limits["now"] == (25024, 65536)
    limits["now"] = (1024, 4096)
    assert gloo.enough_files(25024) == 4096          # as far as the hard limit goes
    limits["now"] = (100000, 200000)
    assert gloo.enough_files(25024) == 100000        # high enough already: untouched


def test_rank_0_can_hold_every_ranks_store_connection_before_the_group_starts(monkeypatch):
    """torch's store server on rank 0 keeps a socket per rank: with a soft limit of 1024 (a login
    shell's, passed on by srun) rank 1024 could not connect."""
    import resource
    from datetime import timedelta

    import torch.distributed as dist

    from scaletrain.runtime import init
    from scaletrain.runtime.env import Env

    limits = {"now": (1024, 1048576)}
    monkeypatch.setattr(resource, "getrlimit", lambda what: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda what, value: limits.update(now=value))
    seen = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: seen.append(limits["now"][0]))
    env = Env(rank=0, world_size=24000, local_world_size=4, num_nodes=6000, master_addr="127.0.0.1",
              master_port=29599, launcher="slurm")
    init._start_group(env, "gloo", "cpu", timedelta(seconds=5))
    assert seen and seen[0] >= 24000
