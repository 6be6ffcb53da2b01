"""Tier 2: the Checkpointer in real 2-3 process jobs (gloo on CPU).

Exact resume: 2N steps straight == N steps, save, a *fresh launch* that resumes, N steps -
parameters and optimizer state bitwise equal (torch.equal) per rank, for ddp, zero1, zero3,
stopping in the middle of an epoch (the loader continues at the exact next sample), with
dropout, input noise and Python/NumPy random numbers in the step, so a missing RNG or loader
restore changes the numbers (``--sabotage`` in ckpt_worker.py shows it: both fail).

Resharding: zero3 saved by 2 ranks loads on 1 and on 3 ranks with the same parameters, and
the optimizer state came along (one more deterministic step lands on the same numbers up to
summation order).

The zero1 and zero3 runs are repeated with ``async_save=True``: their saves at steps 4 and 8
are written while the next steps train. Four launches in all: [straight, first, reshard-save] on 2 ranks, [resume] on 2 ranks,
[reshard-load] on 1 and on 3 ranks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import marker_checksums
from workers import run_workers

from scaletrain.parallel.pipeline import SCHEDULES
from scaletrain.parallel.pipeline_probe import probe_schedule
from scaletrain.torch_features import fsdp_on_cpu

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("ckpt_worker.py")
# zero3 (FSDP2) runs on the CPU from torch 2.7: on 2.6 its cases skip with that reason
FSDP = fsdp_on_cpu()
STRATEGIES = ("ddp", "zero1", "zero3") if FSDP else ("ddp", "zero1")
# async_save: background writes while training goes on
ASYNC = ("zero1:async", "zero3:async") if FSDP else ("zero1:async",)
needs_fsdp = pytest.mark.skipif(not FSDP, reason="zero3 (FSDP2) on the CPU needs torch 2.7 or newer")
# The pipeline phase runs where one of torch's schedules runs over gloo: the same probe that
# setup(strategy="pipeline") asks (it falls back to GPipe where 1F1B hangs, as on 2.6.0 and 2.7.1,
# and refuses where every schedule aborts in gloo, as on 2.9.1).
PIPELINE = any(probe_schedule(name) is None for name in SCHEDULES)
needs_pipeline = pytest.mark.skipif(not PIPELINE, reason="no pipelining schedule runs over gloo "
                                    "on this torch (probed; docs/torch-support.md)")


def _launch(nproc: int, *args: str) -> None:
    proc = run_workers(WORKER, nproc=nproc, args=list(args), timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ckpt")
    ck, out = root / "ck", root / "out"
    labels = ",".join(STRATEGIES + ASYNC)
    # the first half saves every 4 steps too (4, 8: async ones overlap the next steps), then 10
    phases = "straight,first,reshard-save" if FSDP else "straight,first"
    phases += ",pipeline" if PIPELINE else ""
    _launch(2, "--phase", phases, "--strategies", labels,
            "--every-steps", "4", "--dir", ck, "--out", out)
    _launch(2, "--phase", "resume", "--strategies", labels, "--dir", ck, "--out", out)
    return {"ck": ck, "out": out}


@pytest.fixture(scope="module")
def resharded(runs) -> dict:
    for nproc in (1, 3):
        _launch(nproc, "--phase", "reshard-load", "--dir", runs["ck"], "--out", runs["out"])
    return runs


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def _assert_equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), f"{what}: {key} differs"
        else:
            assert a[key] == b[key], f"{what}: {key}: {a[key]} != {b[key]}"


@pytest.mark.parametrize("label", STRATEGIES + ASYNC)
@pytest.mark.parametrize("rank", [0, 1])
def test_resume_is_bitwise_exact(runs, label, rank):
    strategy = label.split(":")[0]
    straight = _load(runs["out"] / f"straight-{strategy}-rank{rank}.pt")
    resumed = _load(runs["out"] / f"resume-{label.replace(':', '-')}-rank{rank}.pt")
    _assert_equal(straight["params"], resumed["params"], f"{strategy} rank {rank} parameters")
    _assert_equal(straight["optim"], resumed["optim"], f"{strategy} rank {rank} optimizer")
    assert straight["optim"], "the optimizer state must not be empty"
    # the resumed half trained on exactly the samples the straight run saw after step 10
    assert resumed["seen"] == straight["seen"][-len(resumed["seen"]):]
    assert len(resumed["seen"]) == 10 * 4


def test_stop_was_mid_epoch_and_layout_as_documented(runs):
    # 100 samples / 2 ranks / 4 per rank = 12 steps per epoch: step 10 is inside epoch 0
    for label in STRATEGIES + ASYNC:
        strategy = label.split(":")[0]
        assert sorted(os.listdir(runs["ck"] / label.replace(":", "-"))) == [
            "step-00000008", "step-00000010"]  # keep=2 after saves at 4, 8, 10
        folder = runs["ck"] / label.replace(":", "-") / "step-00000010"
        marker = json.loads((folder / "COMMIT.json").read_text())
        assert marker["step"] == 10 and marker["world_size"] == 2
        assert marker["strategy"] == strategy
        loader = torch.load(folder / "replicated.pt", weights_only=True)["objects"]["loader"]
        assert (loader["epoch"], loader["consumed"]) == (0, 40)
        assert {"rank-00000.pt", "rank-00001.pt", "replicated.pt"} <= set(marker["files"])
        sharded = {f for f in marker["files"] if f.startswith("sharded/")}
        if strategy == "ddp":
            assert not sharded
        else:  # zero1's optimizer, zero3's model and optimizer: one DCP shard per rank
            assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= sharded
        assert marker["objects"]["optimizer"]["sharded"] == (strategy != "ddp")
        assert marker["objects"]["model"]["sharded"] == (strategy == "zero3")


@needs_fsdp
def test_flipped_byte_in_a_shard_falls_back_on_every_rank(runs, tmp_path):
    """One flipped byte in rank 1's DCP shard of the newest step: rank 1 finds it (its
    share of the checksums), every rank falls back to step 8 together, rank 0 names the file,
    and the damaged folder is kept."""
    import shutil

    folder = tmp_path / "zero3"
    shutil.copytree(runs["ck"] / "zero3", folder)
    marker = json.loads((folder / "step-00000010" / "COMMIT.json").read_text())
    assert set(marker_checksums(marker)[1]) == set(marker["files"])  # every file has its checksum
    shard = folder / "step-00000010" / "sharded" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    _launch(2, "--phase", "damaged", "--dir", folder, "--out", tmp_path / "out")
    results = [json.loads((tmp_path / "out" / f"damaged-rank{r}.json").read_text())
               for r in (0, 1)]
    assert [r["step"] for r in results] == [8, 8]
    said = " ".join(results[0]["warnings"])
    assert "step-00000010 is damaged" in said and "sharded/__1_0.distcp" in said
    assert "checksum" in said and "resuming from step 8" in said
    assert [p.name for p in folder.iterdir() if p.name.startswith("damaged-step-00000010-")]


@needs_fsdp
@pytest.mark.parametrize("world", [1, 3])
def test_zero3_reshards_from_2_ranks(resharded, world):
    saved = _load(resharded["out"] / "reshard-save-w2.pt")
    loaded = _load(resharded["out"] / f"reshard-load-w{world}.pt")
    _assert_equal(saved["params"], loaded["params"], f"parameters loaded on {world} ranks")
    moved = max((saved["after_step"][k] - saved["params"][k]).abs().max().item()
                for k in saved["params"])
    diff = max((saved["after_step"][k] - loaded["after_step"][k]).abs().max().item()
               for k in saved["params"])
    # Adam with its saved moments moves ~1e-2; a fresh Adam would land elsewhere by ~1e-3+
    assert moved > 1e-3
    assert diff <= 1e-6, f"after one step on {world} ranks: max diff {diff}"


@needs_fsdp
@pytest.mark.parametrize("world", [1, 2, 3])
def test_export_gives_plain_full_state_dict(resharded, world):
    import torch.nn as nn

    name = "reshard-save-w2.pt" if world == 2 else f"reshard-load-w{world}.pt"
    params = _load(resharded["out"] / name)["params"]
    exported = _load(resharded["out"] / f"export-w{world}.pt")  # weights_only
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 32),
                          nn.ReLU(), nn.Linear(32, 4))
    model.load_state_dict(exported)  # the unwrapped model takes it as is
    _assert_equal(params, dict(model.named_parameters()), f"export on {world} ranks")


@pytest.mark.parametrize("rank", [0, 1])
@needs_pipeline
def test_pipeline_stages_save_and_load(runs, rank):
    result = json.loads((runs["out"] / f"pipeline-rank{rank}.json").read_text())
    assert result["stage"] == rank and result["step"] == 3
    assert result["equal"], "a stage's parameters or Adam state differ after the reload"
    assert result["tensors"] >= 6
    assert result["objects"]["model"] == {"kind": "pipeline", "sharded": True}
    assert result["objects"]["optimizer"]["sharded"]
