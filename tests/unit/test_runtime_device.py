"""Device choice and allocation checks, with torch's GPU count simulated."""

from __future__ import annotations

import pytest

from scaletrain.errors import DistEnvError, UsageError
from scaletrain.runtime.device import (GpuView, gpu_view, normalize_request, parse_visible,
                                       physical_gpu, pick_gpu_index)
from scaletrain.runtime.env import Placement
from scaletrain.runtime.resolve import Request, choose_device

_TORCH: dict[str, tuple[int, str]] = {}


@pytest.fixture
def torch_gpus():
    """Set how many GPUs 'torch' sees, without a GPU."""
    def set_count(n: int, build: str = "torch 2.13.0+cu126") -> None:
        _TORCH["gpus"] = (n, build)
    yield set_count
    _TORCH.clear()


@pytest.mark.parametrize(("value", "ids"), [
    ("0,1", ("0", "1")), ("", ()), ("-1", ()), ("NoDevFiles", ()), ("2, 3", ("2", "3")),
    ("0,1,-1,2", ("0", "1")), ("GPU-8f1b,GPU-77aa", ("GPU-8f1b", "GPU-77aa")),
])
def test_parse_visible(value, ids):
    assert parse_visible(value) == ids


def test_gpu_view_order_and_slurm():
    view = gpu_view({"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "0"})
    assert view.count == 2 and view.source == "CUDA_VISIBLE_DEVICES=0,1" and view.from_env
    view = gpu_view({"SLURM_GPUS_ON_NODE": "4"}, probe=False)
    assert view.count == 4 and view.allocated == 4
    view = gpu_view({"SLURM_JOB_GPUS": "0,1,2"}, probe=False)
    assert view.count == 3
    assert gpu_view({}, probe=False).count == 0


@pytest.mark.parametrize(("local_rank", "lws", "count", "allocated", "share", "index"), [
    (1, 2, 2, None, False, 1),     # one GPU each
    (3, 4, 8, None, False, 3),     # more GPUs than ranks
    (2, 4, 1, 4, False, 0),        # --gpus-per-task: each task sees its own GPU
    (2, 4, 1, None, True, 0),      # sharing asked for (gloo / MPS)
])
def test_pick_gpu_index(local_rank, lws, count, allocated, share, index):
    view = GpuView(count=count, source="x", allocated=allocated)
    assert pick_gpu_index(local_rank=local_rank, local_world_size=lws, view=view,
                          share_ok=share) == index


def test_pick_gpu_index_oversubscribed():
    view = GpuView(count=2, source="CUDA_VISIBLE_DEVICES=0,1")
    with pytest.raises(DistEnvError) as info:
        pick_gpu_index(local_rank=0, local_world_size=4, view=view)
    assert str(info.value) == ("4 processes on this node but 2 GPUs visible "
                               "(CUDA_VISIBLE_DEVICES=0,1) HINT: --ntasks-per-node=2 (one task "
                               "per GPU) or --nproc-per-node 2")
    with pytest.raises(DistEnvError, match="gloo"):
        pick_gpu_index(local_rank=0, local_world_size=2, view=GpuView(count=1, source="y"))


def test_normalize_request():
    assert normalize_request(None, {}) == "auto"
    assert normalize_request(None, {"SCALETRAIN_DEVICE": "CPU"}) == "cpu"
    assert normalize_request("gpu", {"SCALETRAIN_DEVICE": "cpu"}) == "cuda"  # argument wins
    assert normalize_request("cuda:3", {}) == "cuda:3"
    with pytest.raises(UsageError, match="device='cuda:x'"):
        normalize_request("cuda:x", {})


def resolve(requested="auto", environ=None, local_rank=0, lws=1, *, share_ok=False,
            procs_per_gpu=1, under_slurm=False):
    """init()'s device decision: the environment's view, counted by (simulated) torch."""
    n, build = _TORCH["gpus"]
    request = Request(device=requested, backend="gloo" if share_ok else None,
                      procs_per_gpu=procs_per_gpu)
    placement = Placement(local_rank=local_rank, local_world_size=lws, world_size=lws,
                          rank=local_rank)
    return choose_device(placement, request, gpu_view(environ or {}, probe=False),
                         torch_gpus=n, build=build, under_slurm=under_slurm)


def test_detect_and_init_decide_alike():
    """scaletrain.detect() (GPUs from variables) and init() (torch's count) agree when torch
    sees what the variables say - including the sharing rules (gloo may share, NCCL not)."""
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    placement = Placement(local_rank=1, local_world_size=2, world_size=2, rank=1)
    for request in (Request(), Request(backend="gloo")):
        from_env = _outcome(lambda: choose_device(placement, request, gpu_view(env)))
        from_torch = _outcome(lambda: choose_device(placement, request,
                                                    gpu_view(env, probe=False), torch_gpus=1))
        assert from_env == from_torch
    assert _outcome(lambda: choose_device(placement, Request(), gpu_view(env))) == "DistEnvError"


def _outcome(call):
    try:
        return call()
    except DistEnvError:
        return "DistEnvError"


def test_resolve_by_local_rank(torch_gpus):
    torch_gpus(4)
    assert resolve(local_rank=3, lws=4) == "cuda:3"
    assert resolve("cuda", local_rank=1, lws=2) == "cuda:1"
    assert resolve("cpu", {"CUDA_VISIBLE_DEVICES": "0"}) == "cpu"


def test_resolve_cpu_torch_without_allocation(torch_gpus):
    torch_gpus(0, "torch 2.13.0+cpu")
    assert resolve() == "cpu"
    # visible GPUs outside Slurm: not an allocation, fall back to the CPU
    assert resolve(environ={"CUDA_VISIBLE_DEVICES": "0"}) == "cpu"


def test_resolve_slurm_gpus_but_cpu_torch(torch_gpus):
    torch_gpus(0, "torch 2.13.0+cpu")
    with pytest.raises(DistEnvError) as info:
        resolve(environ={"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "5"}, under_slurm=True)
    err = info.value
    assert err.message == ("GPUs were allocated (CUDA_VISIBLE_DEVICES=0,1) but torch "
                           "2.13.0+cpu has no GPU support")
    assert "SCALETRAIN_DEVICE=cpu" in err.hint and "device='cpu'" in err.hint
    with pytest.raises(DistEnvError, match="SLURM_GPUS_ON_NODE=2"):
        resolve(environ={"SLURM_GPUS_ON_NODE": "2"})
    # ... and the way out works
    assert resolve("cpu", {"CUDA_VISIBLE_DEVICES": "0,1"}, under_slurm=True) == "cpu"


def test_resolve_cuda_asked_without_gpu(torch_gpus):
    torch_gpus(0, "torch 2.13.0+cpu")
    with pytest.raises(DistEnvError, match="sees no GPU"):
        resolve("cuda")


def test_resolve_index_out_of_range(torch_gpus):
    torch_gpus(2)
    with pytest.raises(DistEnvError) as info:
        resolve("cuda:2", {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert info.value.message == "device='cuda:2' but only 2 GPUs visible (CUDA_VISIBLE_DEVICES=4,5)"
    assert resolve("cuda:1") == "cuda:1"


def test_resolve_more_ranks_than_gpus(torch_gpus):
    torch_gpus(2)
    with pytest.raises(DistEnvError, match="^4 processes on this node but 2 GPUs visible"):
        resolve(environ={"CUDA_VISIBLE_DEVICES": "0,1"}, local_rank=3, lws=4)


def test_physical_gpu():
    assert physical_gpu("cuda:0", {"ROCR_VISIBLE_DEVICES": "5"}) == 5
    assert physical_gpu("cuda:1", {"CUDA_VISIBLE_DEVICES": "2,3"}) == 3
    assert physical_gpu("cuda:2", {}) == 2
    assert physical_gpu("cuda:0", {"CUDA_VISIBLE_DEVICES": "GPU-8f1b"}) is None
    assert physical_gpu("cpu", {}) is None


def test_procs_per_gpu_places_k_ranks_on_each_gpu(torch_gpus):
    """`scaletrain run --procs-per-gpu 2` on 2 GPUs: local ranks 0,1 -> cuda:0, 2,3 -> cuda:1."""
    torch_gpus(2)
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    got = [resolve(environ=env, local_rank=r, lws=4, share_ok=True, procs_per_gpu=2)
           for r in range(4)]
    assert got == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    # without gloo (share_ok) NCCL cannot share a GPU: the over-subscription error stands
    with pytest.raises(DistEnvError, match="4 processes on this node but 2 GPUs"):
        resolve(environ=env, local_rank=3, lws=4, procs_per_gpu=2)
    # K too small for the ranks on the node is still an error
    with pytest.raises(DistEnvError):
        resolve(environ=env, local_rank=5, lws=6, share_ok=True, procs_per_gpu=2)
