"""Staging to a RAM disk is checked against the job's memory, not the node's (issue 36, item 4).

Trillium's $SLURM_TMPDIR and LUMI's /tmp are memory: a 1-GPU Trillium job gets a quarter of the
749 GB node ("single-GPU jobs get 1/4 of the memory"), a LUMI small-g job what it asks with
--mem; data staged beyond that kills the job while it stages, however large the node is.
"""

from __future__ import annotations

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.errors import PlanError
from scaletrain.plan.disk import JOB_VENV_GB, job_memory_gb
from scaletrain.plan.planner import make_plan
from scaletrain.plan.request import JobRequest
from scaletrain.plan.render import sbatch_options


def _plan(cluster: str, **kw):
    kw.setdefault("account", "rrg-prof" if cluster == "trillium" else "project_1")
    return make_plan(JobRequest(cluster=cluster, script="train.py", **kw), load_profile(cluster))


def test_trillium_one_gpu_job_has_a_quarter_of_the_node():
    trillium = load_profile("trillium")
    assert job_memory_gb(trillium, None, 1) == pytest.approx(749 / 4)
    assert job_memory_gb(trillium, None, 4) == pytest.approx(749)
    # 198 GB of files take about 218 GB; the job has 187 GB less about 5 GB for the venv it builds
    with pytest.raises(PlanError) as err:
        _plan("trillium", gpus=1, stage_data="/scratch/u/data/", stage_data_gb=198.0)
    assert "needs about 218 GB on each node" in str(err.value)
    assert "is memory on trillium: the job has 187 GB per node" in str(err.value)
    assert f"about {JOB_VENV_GB:g} GB of it for the venv" in str(err.value)
    # the same data fits a whole node (749 GB), and a 1-GPU job takes what fits its quarter
    assert _plan("trillium", nodes=1, stage_data="/scratch/u/data/", stage_data_gb=198.0).resources.stage.kind == "dir"
    fits = (749 / 4 - JOB_VENV_GB) / 1.1 - 1
    assert _plan("trillium", gpus=1, stage_data="/scratch/u/data/", stage_data_gb=fits).resources.stage is not None
    with pytest.raises(PlanError):
        _plan("trillium", gpus=1, stage_data="/scratch/u/data/", stage_data_gb=fits + 2)


def test_trillium_venv_of_the_users_own_takes_no_job_memory():
    edge = (749 / 4) / 1.1 - 1     # fits only without the job's own venv in the RAM disk
    with pytest.raises(PlanError):
        _plan("trillium", gpus=1, stage_data="/scratch/u/d/", stage_data_gb=edge)
    own = _plan("trillium", gpus=1, stage_data="/scratch/u/d/", stage_data_gb=edge, venv="/scratch/u/venv")
    assert own.resources.stage


def test_lumi_small_g_with_60g_is_checked_against_60g():
    lumi = load_profile("lumi")
    p = _plan("lumi", gpus=1, partition="small-g", mem_per_gpu_gb=60.0, stage_data="/scratch/p/d/",
              stage_data_gb=40.0)
    assert dict(sbatch_options(p))["mem"] == "60G" and p.resources.stage.scratch_var == "/tmp"
    assert job_memory_gb(lumi, 60.0, 1) == 60.0
    # 198 GB: the node's 480 GB would take it, the job's 60 GB does not
    with pytest.raises(PlanError) as err:
        _plan("lumi", gpus=1, partition="small-g", mem_per_gpu_gb=60.0, stage_data="/scratch/p/d/",
              stage_data_gb=198.0)
    assert "/tmp is memory on lumi: the job has 60 GB per node" in str(err.value)
    assert "ask for more memory" in err.value.hint
    with pytest.raises(PlanError, match="the job has 60 GB per node"):   # the profile's 60 GB per GCD
        _plan("lumi", gpus=1, partition="small-g", stage_data="/scratch/p/d.tar", stage_data_gb=60.0)
    # a whole LUMI-G node (8 GCDs x 60 GB = 480 GB) takes it
    assert _plan("lumi", gpus=8, stage_data="/scratch/p/d/", stage_data_gb=198.0).resources.stage is not None
