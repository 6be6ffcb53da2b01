"""CPU binding (pure part) and thread counts."""

from __future__ import annotations

import pytest

from scaletrain.errors import UsageError
from scaletrain.contract.environ import format_cores
from scaletrain.runtime.affinity import (binding_mode, plan_binding,
                                         ranks_share_cpuset, share_of)
from scaletrain.runtime.threads import choose_threads

# LUMI-G: GCD -> the 7 usable cores of its CCD (core 0 of each CCD is reserved)
LUMI_MAP = {0: range(49, 56), 1: range(57, 64), 2: range(17, 24), 3: range(25, 32),
            4: range(1, 8), 5: range(9, 16), 6: range(33, 40), 7: range(41, 48)}


@pytest.mark.parametrize(("n", "ranks", "expected"), [
    (8, 2, [(0, 1, 2, 3), (4, 5, 6, 7)]),
    (10, 4, [(0, 1, 2), (3, 4, 5), (6, 7), (8, 9)]),
    (2, 2, [(0,), (1,)]),
    (1, 2, [(), ()]),
])
def test_share_of_is_contiguous_and_disjoint(n, ranks, expected):
    got = [share_of(range(n), local_rank=r, local_world_size=ranks) for r in range(ranks)]
    assert got == expected


def test_share_of_respects_holes_in_the_allowed_set():
    allowed = [2, 3, 8, 9, 10, 11]
    assert share_of(allowed, local_rank=1, local_world_size=2) == (9, 10, 11)


def test_gpu_map_binds_to_nearest_cores():
    b = plan_binding(allowed=range(64), local_rank=0, local_world_size=8, gpu=3,
                     gpu_cpu_map=LUMI_MAP)
    assert b is not None and b.cores == tuple(range(25, 32)) and "GPU 3" in b.reason


def test_gpu_map_never_leaves_allowed_set():
    b = plan_binding(allowed=range(24, 30), local_rank=0, local_world_size=8, gpu=3,
                     gpu_cpu_map=LUMI_MAP)
    assert b is not None and b.cores == (25, 26, 27, 28, 29)


def test_gpu_map_outside_allowed_falls_back_to_share():
    b = plan_binding(allowed=range(8), local_rank=1, local_world_size=2, gpu=0,
                     gpu_cpu_map=LUMI_MAP)
    assert b is not None and b.cores == (4, 5, 6, 7)


def test_gpu_map_already_bound_changes_nothing():
    assert plan_binding(allowed=range(49, 56), local_rank=0, local_world_size=8, gpu=0,
                        gpu_cpu_map=LUMI_MAP) is None


def test_share_binding_and_no_binding_cases():
    b = plan_binding(allowed=range(16), local_rank=3, local_world_size=4)
    assert b is not None and b.cores == (12, 13, 14, 15)
    assert plan_binding(allowed=range(16), local_rank=0, local_world_size=1) is None
    assert plan_binding(allowed=range(16), local_rank=1, local_world_size=4, shared=False) is None
    assert plan_binding(allowed=[0], local_rank=1, local_world_size=2) is None
    assert plan_binding(allowed=[], local_rank=0, local_world_size=2) is None


@pytest.mark.parametrize("allowed", [range(7), [0, 5, 9, 30], range(100)])
def test_any_binding_is_a_subset_of_allowed(allowed):
    for lws in (1, 2, 3, 8):
        for rank in range(lws):
            for gpu in (None, 0, 4):
                b = plan_binding(allowed=allowed, local_rank=rank, local_world_size=lws,
                                 gpu=gpu, gpu_cpu_map=LUMI_MAP)
                if b is not None:
                    assert b.cores and set(b.cores) <= set(allowed)


def test_ranks_share_cpuset():
    assert ranks_share_cpuset(launcher="torchrun", allowed=range(4), local_world_size=2,
                              environ={})
    # srun with task binding: each task sees its own cpus-per-task cores
    assert not ranks_share_cpuset(launcher="slurm", allowed=range(8), local_world_size=2,
                                  environ={"SLURM_CPUS_PER_TASK": "8"})
    assert ranks_share_cpuset(launcher="slurm", allowed=range(16), local_world_size=2,
                              environ={"SLURM_CPUS_PER_TASK": "8"})


def test_binding_mode():
    assert binding_mode({}) == "auto"
    assert binding_mode({"SCALETRAIN_CPU_BIND": "NONE"}) == "none"
    with pytest.raises(UsageError, match="SCALETRAIN_CPU_BIND"):
        binding_mode({"SCALETRAIN_CPU_BIND": "cores"})


def test_format_cores():
    assert format_cores([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_cores([3]) == "3"


@pytest.mark.parametrize(("environ", "kw", "threads", "source"), [
    ({"OMP_NUM_THREADS": "3", "SLURM_CPUS_PER_TASK": "8"}, {}, 3, "OMP_NUM_THREADS=3"),
    ({"SLURM_CPUS_PER_TASK": "8"}, {}, 8, "SLURM_CPUS_PER_TASK=8"),
    ({"SLURM_CPUS_PER_TASK": "32"}, {"per_slurm_task": 4}, 8, "SLURM_CPUS_PER_TASK=32 / 4"),
    ({}, {"bound_cpus": 6}, 6, "6 cores bound"),
    ({}, {}, 4, "16 cores / 4 local"),
    ({"OMP_NUM_THREADS": "junk"}, {"allowed_cpus": 3}, 1, "3 cores / 4 local"),
])
def test_choose_threads(environ, kw, threads, source):
    args = {"environ": environ, "local_world_size": 4, "allowed_cpus": 16, **kw}
    choice = choose_threads(**args)
    assert choice.threads == threads and choice.source.startswith(source)
