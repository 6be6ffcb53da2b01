"""Every Slurm script of the centre guides lints with no error for the cluster it is for.

The scripts are ours, in the guides' shapes and formats (tests/unit/guide_jobs, in every clone),
and the guides' own where ../shared/seeds is present; every test runs on each source. The blocks
come from ``lint_seed_blocks`` (Markdown tabs in 000/001, 004's slides, 003's
MediaWiki ``{{File}}`` blocks), placeholders such as ``<project>`` filled in. Checks that the
extraction found what the seeds hold and that the linter really parsed them (known warnings
appear; a seeded mistake turns into an error), so the "no error" result cannot be vacuous.
"""

from __future__ import annotations

from collections import Counter

import pytest

from lint_seed_blocks import SeedBlock, all_blocks, guide_sources
from scaletrain.clusters.profile import load_profile
from scaletrain.lint.engine import lint_text
from scaletrain.lint.findings import ERROR

BLOCKS = all_blocks()
SOURCES = list(guide_sources())


def _lint(block: SeedBlock):
    return lint_text(block.text, path=block.id, profile=load_profile(block.cluster))


def _find(source: str, doc: str, cluster: str, *needles: str) -> SeedBlock:
    for b in BLOCKS:
        if b.source == source and b.doc == doc and b.cluster == cluster and all(n in b.text for n in needles):
            return b
    raise AssertionError(f"no {source} {doc}/{cluster} block with {needles}")


@pytest.mark.parametrize("source", SOURCES)
def test_extraction_counts(source: str) -> None:
    blocks = [b for b in BLOCKS if b.source == source]
    per_doc = Counter(b.doc for b in blocks)
    # 000: 11 sections x 3 tabs (the DeepSpeed one has Puhti/Mahti/LUMI, LUMI cut off by the file's end)
    assert per_doc["000"] == 33
    # 001: 4 Slurm cases x 3 + DDP 2 x 3 + DeepSpeed 2 x 2
    assert per_doc["001"] == 22
    assert per_doc["003"] == 12 * 3          # 12 {{File}} batch scripts, on narval, beluga, cedar
    assert per_doc["004"] == 5
    assert len({b.id for b in blocks}) == len(blocks) >= 30


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_seed_block_has_no_error(block: SeedBlock) -> None:
    result = _lint(block)
    errors = [f for f in result.findings if f.severity == ERROR]
    assert not errors, "\n" + block.text + "\n" + "\n".join(
        f"{f.line}: {f.rule} {f.message}" for f in errors)


@pytest.mark.parametrize("source", SOURCES)
def test_lumi_two_node_nproc_4_of_8_is_a_warning_not_an_error(source: str) -> None:
    block = _find(source, "001", "lumi", "--nnodes=$SLURM_JOB_NUM_NODES", "--nproc_per_node=4")
    rules = {(f.rule, f.severity) for f in _lint(block).findings}
    assert ("torchrun-nproc", "warning") in rules


@pytest.mark.parametrize("source", SOURCES)
def test_historical_lumi_partition_is_only_a_warning(source: str) -> None:
    block = _find(source, "001", "lumi", "--partition=eap", "--cpus-per-task=128")
    found = {(f.rule, f.severity) for f in _lint(block).findings}
    assert ("partition-unknown", "warning") in found
    assert ("cpu-limit", "warning") in found      # 128 > 56 cores, but eap nodes were not today's


@pytest.mark.parametrize("source", SOURCES)
def test_known_warnings_show_the_blocks_were_parsed(source: str) -> None:
    block = _find(source, "003", "narval", "MASTER_PORT=34567")
    assert "master-port" in {f.rule for f in _lint(block).findings}
    # JSC's guide sets CUDA_VISIBLE_DEVICES=0,1,2,3 on purpose: no finding may contradict it,
    # but a list beyond the node's 4 GPUs is still caught in the same block
    block = _find(source, "004", "juwels-booster", "--nodes=16", "time srun", "CUDA_VISIBLE_DEVICES=0,1,2,3")
    assert "visible-devices" not in {f.rule for f in _lint(block).findings}
    bad = SeedBlock(doc=block.doc, line=block.line, cluster=block.cluster,
                    text=block.text.replace("CUDA_VISIBLE_DEVICES=0,1,2,3", "CUDA_VISIBLE_DEVICES=0,1,2,3,4"),
                    source=source)
    assert "visible-devices" in {f.rule for f in _lint(bad).findings}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("doc,cluster,needles,old,new,rule", [
    # 000's accelerate: unescape \$SLURM_NODEID -> every node gets machine_rank 0
    ("000", "puhti", ("--machine_rank=\\$SLURM_NODEID",), "\\$SLURM_NODEID", "$SLURM_NODEID", "early-expansion"),
    # Mahti gpusmall with 4 GPUs (the seed's own warning)
    ("001", "mahti", ("--partition=gpusmall",), "gpu:a100:2", "gpu:a100:4", "partition-limit"),
    # Puhti's V100 asked for as A100
    ("000", "puhti", ("--ntasks-per-node=4", "--nodes=2"), "gpu:v100:4", "gpu:a100:4", "gpu-syntax"),
    # multi-node torchrun left with --standalone
    ("001", "puhti", ("--standalone",), "#SBATCH --nodes=1", "#SBATCH --nodes=2", "torchrun-standalone"),
    # DeepSpeed launcher under 4 tasks
    ("001", "mahti", ("exec deepspeed",), "--ntasks=1", "--ntasks=4", "launcher-tasks"),
    # Lightning job run without srun
    ("004", "juwels-booster", ("--nodes=16", "time srun"), "time srun python3", "time python3", "no-srun"),
])
def test_seeded_mistake_in_a_seed_is_an_error(doc: str, cluster: str, needles: tuple[str, ...],
                                              old: str, new: str, rule: str, source: str) -> None:
    block = _find(source, doc, cluster, *needles)
    assert old in block.text
    bad = SeedBlock(doc=block.doc, line=block.line, cluster=block.cluster, text=block.text.replace(old, new),
                    source=source)
    assert rule not in {f.rule for f in _lint(block).findings if f.severity == ERROR}
    assert rule in {f.rule for f in _lint(bad).findings if f.severity == ERROR}
