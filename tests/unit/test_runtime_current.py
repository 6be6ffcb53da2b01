"""runtime/current.py: who this process is, for a collective and for an error message.

The multi-process half (a group the program made itself, ranks numbered against the launcher's
RANK) is tests/multiproc/test_user_group.py.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from scaletrain.runtime.current import collective_device, error_rank, group_rank_world, rank_world
from scaletrain.runtime.settle import destroy_group


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    destroy_group()


def test_no_group_no_collective_whatever_the_launcher_says(clean_env):
    for k, v in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500"}.items():
        clean_env.setenv(k, v)
    assert rank_world() == (1, 2)              # who am I: the launcher's word
    assert group_rank_world() == (0, 1)        # but a collective reaches no one
    assert collective_device() == "cpu"


def test_a_live_group_decides(clean_env, one_rank_group):
    clean_env.setenv("RANK", "3")   # another job's variable: the group says who we are
    clean_env.setenv("WORLD_SIZE", "4")
    assert group_rank_world() == rank_world() == (0, 1)
    sub = dist.new_group(ranks=[0], backend="gloo")
    assert group_rank_world(sub) == (0, 1)
    assert collective_device(sub) == "cpu"


def test_error_rank_before_and_after_a_group(clean_env, one_rank_group):
    assert error_rank() is None                 # one process, no launcher: no rank to name
    clean_env.setenv("SLURM_PROCID", "0")
    assert error_rank() == "0"                  # a one-task srun step names it, as before


@pytest.mark.parametrize(("env", "named"), [
    ({"RANK": "5", "WORLD_SIZE": "2"}, "5"),           # contradictory: reported, not parsed
    ({"SLURM_PROCID": "2"}, "2"),
    ({"SLURM_PROCID": "\u0661"}, None),                 # not an ASCII number: no rank named
    ({}, None),
])
def test_error_rank_without_a_group_is_the_launchers_raw_word(clean_env, env, named):
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert error_rank() == named
