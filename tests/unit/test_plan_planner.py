"""make_plan: the arithmetic (nodes, partition, tasks, CPUs, memory, GPU request) and every
error message for bad input."""

from __future__ import annotations

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.errors import PlanError, ProfileError, UsageError
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import exports, sbatch_options
from scaletrain.plan.request import JobRequest, format_mem, parse_mem_gb, parse_params
from scaletrain.plan.summary import notes


def plan(cluster: str, **kw):
    kw.setdefault("account", "project_1")
    kw.setdefault("script", "train.py")
    return make_plan(JobRequest(cluster=cluster, **kw), load_profile(cluster))


def sb(p) -> dict[str, str]:
    return dict(sbatch_options(p))


# --------------------------------------------------------------------------- arithmetic

@pytest.mark.parametrize("cluster,gpus,nodes,gpn,part,cpus,mem,gres_key,gres", [
    ("roihu", 1, 1, 1, "gpumedium", 72, None, "gres", "gpu:gh200:1"),   # one Grace CPU per GPU, no --mem
    ("roihu", 4, 1, 4, "gpumedium", 72, None, "gres", "gpu:gh200:4"),
    ("roihu", 12, 3, 4, "gpularge", 72, None, "gres", "gpu:gh200:4"),   # gpumedium: at most 4 GPUs a job
    ("roihu", 32, 8, 4, "gpularge", 72, None, "gres", "gpu:gh200:4"),   # beyond gpumedium's 4 nodes
    ("lumi", 3, 1, 3, "small-g", 7, "180G", "gpus-per-node", "3"),
    ("lumi", 8, 1, 8, "standard-g", 7, "480G", "gpus-per-node", "8"),
    ("lumi", 64, 8, 8, "standard-g", 7, "480G", "gpus-per-node", "8"),
    ("juwels-booster", 8, 2, 4, "booster", 24, "0", "gres", "gpu:4"),
    ("jupiter", 8, 2, 4, "booster", 72, None, "gres", "gpu:4"),          # whole nodes, all memory
    ("narval", 4, 1, 4, None, 12, "498G", "gpus-per-node", "a100:4"),
    ("fir", 2, 1, 2, None, 12, "576000M", "gpus-per-node", "h100:2"),    # the bundle: 12 cores, 288 GB (288000M) per GPU
    ("nibi", 16, 2, 8, None, 14, "2000G", "gpus-per-node", "h100:8"),    # the bundle: 14 cores, 250 GB per GPU
    ("rorqual", 1, 1, 1, None, 16, "127488M", "gpus-per-node", "h100:1"),
    ("trillium", 1, 1, 1, None, 24, None, "gpus-per-node", "1"),         # a quarter node; --mem ignored there
])
def test_one_task_per_gpu_layouts(cluster, gpus, nodes, gpn, part, cpus, mem, gres_key, gres) -> None:
    p = plan(cluster, gpus=gpus)
    lines = sb(p)
    assert (p.resources.nodes, p.resources.gpus_per_node, p.resources.partition) == (nodes, gpn, part)
    assert (p.resources.tasks_per_node, p.resources.ntasks, p.resources.world_size) == (gpn, gpn * nodes, gpus)
    assert p.resources.cpus_per_task == cpus and lines["cpus-per-task"] == str(cpus)
    assert lines.get("mem") == mem
    assert lines[gres_key] == gres
    assert lines["nodes"] == str(nodes) and lines["ntasks-per-node"] == str(gpn)
    assert ("partition" in lines) == (part is not None)


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate", "deepspeed"])
def test_per_node_launchers_get_one_task_with_all_cores(launcher: str) -> None:
    p = plan("roihu", gpus=8, launcher=launcher)
    r = p.resources
    assert (r.tasks_per_node, r.gpus_per_task, r.cpus_per_task, r.threads_per_proc) == (1, 4, 288, 72)
    p = plan("lumi", gpus=2, launcher=launcher)
    assert (p.resources.tasks_per_node, p.resources.cpus_per_task, sb(p)["mem"]) == (1, 14, "120G")


@pytest.mark.parametrize("launcher", ["scaletrain", "srun", "mpi", "lightning"])
def test_per_gpu_launchers_get_one_task_per_gpu(launcher: str) -> None:
    p = plan("roihu", gpus=8, launcher=launcher)
    assert (p.resources.tasks_per_node, p.resources.ntasks, p.resources.cpus_per_task) == (4, 8, 72)


def test_nodes_and_gpus_per_node() -> None:
    p = plan("rorqual", nodes=3, gpus_per_node=2)
    r = p.resources
    assert (r.nodes, r.gpus_per_node, r.gpus, sb(p)["gpus-per-node"], sb(p)["mem"]) == (3, 2, 6, "h100:2", "249G")
    p = plan("lumi", nodes=2)
    assert (p.resources.gpus, p.resources.partition) == (16, "standard-g")


def test_user_cpus_and_memory_override() -> None:
    p = plan("fir", gpus=2, cpus_per_gpu=4, mem_per_gpu_gb=parse_mem_gb("16G"))
    assert (sb(p)["cpus-per-task"], sb(p)["mem"]) == ("4", "32G")
    p = plan("roihu", gpus=4, mem_per_gpu_gb=100)
    assert sb(p)["mem"] == "400G"      # Roihu writes --mem only when asked


def test_partial_nodes_spread_evenly_on_shared_partitions_with_a_note() -> None:
    p = plan("lumi", gpus=12)
    assert (p.resources.nodes, p.resources.gpus_per_node, p.resources.partition) == (2, 6, "small-g")
    assert any("spread as 2 nodes x 6" in n for n in notes(p))
    p = plan("roihu", gpus=6)
    assert (p.resources.nodes, p.resources.gpus_per_node) == (2, 3)
    assert any("spread as 2 nodes x 3" in n for n in notes(p))


def test_whole_node_partition_single_gpu_is_allowed_when_nothing_shares() -> None:
    p = plan("juwels-booster", gpus=1)
    assert (p.resources.cpus_per_task, sb(p)["mem"], p.resources.partition) == (96, "0", "booster")
    assert any("billed for 4 GPUs" in n for n in notes(p))


def test_time_and_gpu_hours() -> None:
    p = plan("rorqual", gpus=8, time="2-00:00:00")
    assert (p.resources.time, sb(p)["time"], p.resources.gpu_hours) == ("2-00:00:00", "2-00:00:00", 384.0)
    assert plan("roihu", gpus=4, time="90").resources.time == "01:30:00"
    # LUMI bills one MI250X (2 GCDs) per GPU-hour: 4 per node-hour, 0.5 per GCD-hour on small-g
    assert plan("lumi", nodes=2, time="03:00:00").resources.gpu_hours == 24.0
    assert plan("lumi", gpus=1).resources.gpu_hours == 0.5


def test_test_partition_only_when_named() -> None:
    assert plan("roihu", gpus=4, time="00:10:00").resources.partition == "gpumedium"
    assert plan("roihu", gpus=4, time="00:10:00", partition="gputest").resources.partition == "gputest"


def test_requeue_signal_and_lines() -> None:
    p = plan("roihu", gpus=4, requeue=True, time="04:00:00")
    assert sb(p)["signal"] == "B:USR1@300" and "requeue" in sb(p)
    assert plan("roihu", gpus=4, requeue=True, time="00:10:00").resources.signal_seconds == 100
    assert "signal" not in sb(plan("roihu", gpus=4))


def test_environment_and_device() -> None:
    env = dict(exports(plan("lumi", gpus=8, device="cpu")))
    assert env["SCALETRAIN_CLUSTER"] == "lumi" and env["SCALETRAIN_DEVICE"] == "cpu"
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3" and env["OMP_NUM_THREADS"] == "7"
    assert "SCALETRAIN_DEVICE" not in dict(exports(plan("roihu", gpus=1)))


def test_lumi_cpu_binding_from_the_gcd_map() -> None:
    p = plan("lumi", gpus=8)
    masks = p.resources.cpu_bind.removeprefix("mask_cpu:").split(",")
    assert masks[0] == "0xfe000000000000"              # GCD 0 -> cores 49-55
    assert masks[4] == "0xfe"                          # GCD 4 -> cores 1-7
    assert plan("lumi", gpus=4).resources.cpu_bind is None       # shared node: Slurm picks the cores
    assert plan("lumi", gpus=8, launcher="torchrun").resources.cpu_bind is None
    assert plan("roihu", gpus=2).resources.cpu_bind is None      # part of a node: Slurm picks the cores


def test_stage_data_sizes_node_local_disk() -> None:
    p = plan("roihu", gpus=4, stage_data="/scratch/p/imagenet.tar", stage_data_gb=120.0)
    stage = p.resources.stage
    assert stage.kind == "tar" and stage.dest_name == "imagenet" and stage.disk_gb is None
    assert p.resources.stage.scratch_var == "$TMPDIR" and sb(p)["gres"] == "gpu:gh200:4"   # no disk to ask for on Roihu
    # Roihu's GPU nodes give each user 150 GiB of $TMPDIR: a bigger copy is refused before the queue
    assert "needs about 154 GB on each node, but $TMPDIR holds 150 GB" in _err(
        PlanError, "roihu", gpus=4, stage_data="/scratch/p/imagenet.tar", stage_data_gb=140.0)
    # LUMI's /tmp is memory: an archive that unpacks beyond the job's memory (8 x 60 GB) is refused
    assert "/tmp is memory on lumi" in _err(PlanError, "lumi", gpus=8, stage_data="/scratch/d.zip",
                                            stage_data_gb=170.0)
    p = plan("lumi", gpus=8, stage_data="/scratch/d.zip")
    assert p.resources.stage.disk_gb is None and "gres" not in sb(p) and p.resources.stage.scratch_var == "/tmp"
    p = plan("narval", gpus=4, stage_data="/project/data/")
    stage = p.resources.stage
    assert (stage.kind, stage.scratch_var, stage.dest_name) == ("dir", "$SLURM_TMPDIR", "data")


def test_local_profile_plans_cpu_workers_without_slurm() -> None:
    prof = load_profile("local")
    p = make_plan(JobRequest(cluster="local", gpus=min(2, prof.cores_per_node), script="t.py"), prof)
    assert sbatch_options(p) == () and p.settled.profile.scheduler == "none"
    assert p.resources.device == "cpu" and p.resources.tasks_per_node == 1


def test_plan_is_pure_and_deterministic() -> None:
    assert plan("roihu", gpus=8, launcher="accelerate") == plan("roihu", gpus=8, launcher="accelerate")


def test_units() -> None:
    assert parse_mem_gb("32000M") == 31.25 and parse_mem_gb("1T") == 1024 and parse_mem_gb("64") == 64
    assert format_mem(31.25) == "32000M" and format_mem(320.0) == "320G"
    assert parse_params("7e9") == 7e9 and parse_params("350M") == 3.5e8 and parse_params("1.3B") == 1.3e9
    with pytest.raises(UsageError):
        parse_mem_gb("lots")
    with pytest.raises(UsageError):
        parse_params("big")


# --------------------------------------------------------------------------- bad input

def _err(exc_type, cluster: str, **kw) -> str:
    with pytest.raises(exc_type) as info:
        plan(cluster, **kw)
    err = info.value
    assert err.exit_code == 2 and err.hint and "\n" not in err.message
    return f"{err.message} HINT: {err.hint}"


def test_unknown_cluster_lists_known() -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("hal9000")
    assert ("known: beluga, cedar, fir, graham, jupiter, juwels-booster, local, lumi, mahti, narval, nibi, "
            "puhti, roihu, rorqual, trillium") in info.value.message


def test_unknown_partition_lists_known() -> None:
    text = _err(ProfileError, "roihu", gpus=2, partition="gpu")
    assert "unknown partition 'gpu'" in text and "gpumedium, gpularge, gputest, gpuinteractive" in text


def test_not_a_multiple_on_whole_node_partition() -> None:
    text = _err(PlanError, "juwels-booster", gpus=6)
    assert "6 GPUs is not a multiple of the 4 GPUs" in text and "--gpus 4 or --gpus 8" in text
    text = _err(PlanError, "lumi", gpus=12, partition="standard-g")
    assert "not a multiple of the 8 GPUs" in text and "--gpus 8 or --gpus 16" in text


def test_part_of_a_node_on_whole_node_partition_points_to_the_shared_one() -> None:
    # the user named it: allowed, but the note says what it costs and where to go instead
    p = plan("lumi", gpus=4, partition="standard-g")
    note = next(n for n in notes(p) if "allocates whole nodes" in n)
    assert "4 of 8 GPUs per node are used, and the job is billed for 8" in note and "--partition small-g" in note
    assert p.resources.gpu_hours == 4.0     # the whole node: 8 GCDs = 4 MI250X GPU-hours per hour


def test_time_above_partition_limit() -> None:
    text = _err(PlanError, "roihu", gpus=4, partition="gputest", time="01:00:00")
    assert "above the 00:15:00 maximum of partition 'gputest'" in text
    text = _err(PlanError, "rorqual", gpus=4, time="8-00:00:00")
    assert "above every GPU partition's limit" in text and "--time 7-00:00:00" in text


def test_more_gpus_than_partition_allows() -> None:
    text = _err(PlanError, "roihu", gpus=2, partition="gpuinteractive", time="00:10:00")
    assert "2 GPUs in partition 'gpuinteractive', which allows at most 1" in text
    text = _err(PlanError, "roihu", nodes=8, partition="gpumedium")
    assert "32 GPUs in partition 'gpumedium', which allows at most 4" in text and "--partition gpularge" in text
    text = _err(PlanError, "roihu", nodes=2, gpus_per_node=1, partition="gpularge")
    assert "2 GPUs in partition 'gpularge', which takes at least 4" in text and "--partition gpumedium" in text
    text = _err(PlanError, "trillium", nodes=30)
    assert "no partition on trillium takes 120 GPUs" in text


def test_more_gpus_per_node_than_the_node_has() -> None:
    assert "a roihu node has 4 GPUs, not 8" in _err(PlanError, "roihu", nodes=1, gpus_per_node=8)


def test_missing_account_where_required() -> None:
    text = _err(PlanError, "lumi", gpus=8, account=None)
    assert "requires --account" in text and "SBATCH_ACCOUNT" in text


def test_gpus_and_nodes_both_or_neither() -> None:
    assert "not both" in _err(UsageError, "roihu", gpus=4, nodes=1)
    assert "--gpus N or --nodes M" in _err(UsageError, "roihu")
    assert "goes with --nodes" in _err(UsageError, "roihu", gpus=4, gpus_per_node=2)
    assert "--gpus must be a whole number from 1 to 100,000, got 0" in _err(UsageError, "roihu", gpus=0)


def test_too_many_cores_or_memory() -> None:
    assert "a rorqual node has 64" in _err(PlanError, "rorqual", gpus=4, cpus_per_gpu=20)
    assert "gives at most 498G" in _err(PlanError, "rorqual", gpus=4, mem_per_gpu_gb=200)


def test_bad_launcher_device_time() -> None:
    assert "--launcher must be one of 'scaletrain'" in _err(UsageError, "roihu", gpus=1, launcher="horovodrun")
    assert "--device must be one of 'auto', 'cpu', got 'tpu'" in _err(UsageError, "roihu", gpus=1, device="tpu")
    # a time Slurm cannot read is refused when the request is made, naming the flag
    assert "--time must be a time limit above 0" in _err(UsageError, "roihu", gpus=1, time="soon")


def test_no_scratch_for_stage_data() -> None:
    assert "no node-local scratch" in _err(PlanError, "juwels-booster", gpus=4, stage_data="/p/d.tar")


def test_gpu_split_is_bounded_for_any_request():
    from scaletrain.plan.layout import _split_gpus

    assert _split_gpus(6, 4) == (2, 3) and _split_gpus(10, 4) == (5, 2) and _split_gpus(7, 4) == (7, 1)
    assert _split_gpus(2**61 - 1, 4) == (2**61 - 1, 1)     # a prime: one GPU per node, found at once
    # every split is even and within a node, and no split with fewer nodes exists
    for gpus in range(1, 200):
        for per in (1, 2, 4, 8):
            nodes, gpn = _split_gpus(gpus, per)
            assert nodes * gpn == gpus and gpn <= per
            assert not any(gpus % n == 0 and gpus // n <= per for n in range(1, nodes))


def test_one_gpu_of_a_whole_node_points_to_the_development_partition() -> None:
    # JUWELS Booster and JUPITER share no nodes: the note says what it costs and where a test can go
    p = plan("juwels-booster", gpus=1)
    note = next(n for n in notes(p) if "allocates whole nodes" in n)
    assert "billed for 4 GPUs per node" in note and "for a short test --partition develbooster (up to 02:00:00)" in note
    assert p.resources.gpu_hours == 4.0
    assert plan("jupiter", gpus=1, partition="develbooster").resources.partition == "develbooster"


def test_cpu_only_refusal_lists_no_gpu_partitions() -> None:
    text = _err(PlanError, "juwels-booster", cpus=8)
    assert "has no CPU partition for a CPU-only job" in text and "booster" not in text.split("HINT")[1]
    # where the profile says where CPU jobs go, the hint says that (Trillium: the CPU subcluster)
    text = _err(PlanError, "trillium", cpus=8)
    assert "take no CPU-only jobs" in text and "192-core nodes" in text and "CPU login nodes" in text
    assert "Roihu-CPU" in _err(PlanError, "roihu", cpus=8)
    p = plan("juwels-booster", cpus=8, partition="booster")     # a partition the user names still plans
    assert (p.resources.partition, p.resources.gpus_per_node) == ("booster", 0)


def test_cpu_only_memory_is_the_cpu_nodes_share() -> None:
    # Narval's CPU nodes: 250G for 64 cores; its GPU nodes' 498G for 48 asked 2.5x as much
    assert sb(plan("narval", cpus=8, account="def-x"))["mem"] == "31948M"
    assert sb(plan("fir", cpus=8, account="def-x"))["mem"] == "31948M"


def test_trillium_takes_one_gpu_or_whole_nodes_only() -> None:
    assert "trillium takes 1 or 4 GPUs per node, not 2" in _err(PlanError, "trillium", gpus=2)
    assert "not 3" in _err(PlanError, "trillium", nodes=2, gpus_per_node=3)
    assert (plan("trillium", gpus=1).resources.gpus_per_node, plan("trillium", gpus=8).resources.nodes) == (1, 2)
