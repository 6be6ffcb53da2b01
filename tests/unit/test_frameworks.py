"""Framework configs written from our names: Accelerate YAML, DeepSpeed JSON, TF_CONFIG."""

from __future__ import annotations

import json

import pytest

from helpers import deepspeed_attr
from scaletrain.errors import DistEnvError, UsageError
from scaletrain.frameworks.accelerate import accelerate_config, to_yaml
from scaletrain.frameworks.deepspeed import deepspeed_config, to_json
from scaletrain.frameworks.tensorflow import tf_config

yaml = pytest.importorskip("yaml", reason="PyYAML comes with accelerate (the test extra)")


@pytest.mark.parametrize("strategy,kind,sharding,offload", [
    ("ddp", "MULTI_GPU", None, None), ("zero2", "FSDP", "SHARD_GRAD_OP", False),
    ("zero3", "FSDP", "FULL_SHARD", False), ("offload", "FSDP", "FULL_SHARD", True),
    ("hsdp", "FSDP", "HYBRID_SHARD", False)])
def test_accelerate_yaml_parses_and_carries_the_strategy(tmp_path, strategy, kind, sharding, offload):
    text = to_yaml(accelerate_config(strategy, precision="bf16", num_machines=2, num_processes=8))
    data = yaml.safe_load(text)
    assert data["distributed_type"] == kind and data["mixed_precision"] == "bf16"
    assert (data["num_machines"], data["num_processes"]) == (2, 8)
    assert data.get("fsdp_config", {}).get("fsdp_sharding_strategy") == sharding
    assert data.get("fsdp_config", {}).get("fsdp_offload_params") == offload
    # Accelerate's own loader reads it, where Accelerate is installed
    config_mod = pytest.importorskip("accelerate.commands.config.config_args")
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    loaded = config_mod.load_config_from_file(str(path))
    assert str(loaded.distributed_type).endswith(kind) and loaded.num_processes == 8
    if sharding:
        assert loaded.fsdp_config["fsdp_sharding_strategy"] == sharding


def test_accelerate_cpu_and_refusals():
    # accelerate launch starts one process per machine for MULTI_CPU: several CPU processes are
    # MULTI_GPU with use_cpu (and ACCELERATE_USE_CPU in the job), one is NO
    assert accelerate_config("ddp", cpu=True, num_processes=4)["distributed_type"] == "MULTI_GPU"
    assert accelerate_config("ddp", cpu=True, num_processes=1)["distributed_type"] == "NO"
    assert accelerate_config("ddp", cpu=True)["use_cpu"] is True
    with pytest.raises(UsageError, match="zero1"):
        accelerate_config("zero1")
    with pytest.raises(UsageError, match="GPUs only"):
        accelerate_config("zero3", cpu=True)


def test_yaml_quotes_strings_that_yaml_would_misread():
    data = yaml.safe_load(to_yaml({"a": "no", "b": "it's: here", "c": {"d": True, "e": 3}}))
    assert data == {"a": "no", "b": "it's: here", "c": {"d": True, "e": 3}}


@pytest.mark.parametrize("strategy,stage,device", [
    ("zero1", 1, None), ("zero2", 2, None), ("zero3", 3, None), ("offload", 3, "cpu"),
    ("nvme", 3, "nvme")])
def test_deepspeed_json_carries_the_stage_and_offload(strategy, stage, device):
    config = json.loads(to_json(deepspeed_config(strategy, micro_batch_per_gpu=8, precision="bf16",
                                                 nvme_path="/local/scratch")))
    zero = config["zero_optimization"]
    assert zero["stage"] == stage and config["train_micro_batch_size_per_gpu"] == 8
    assert config["bf16"] == {"enabled": True}
    for part in ("offload_optimizer", "offload_param"):
        assert zero.get(part, {}).get("device") == device
        if device == "nvme":
            assert zero[part]["nvme_path"] == "/local/scratch"
    # DeepSpeed's own config class, where DeepSpeed installs (it needs no GPU to parse)
    zero_class = deepspeed_attr("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig")
    if zero_class is None:   # not installed here: the structure above is the check
        return
    parsed = zero_class(**zero)
    assert int(parsed.stage) == stage


def test_deepspeed_refusals():
    with pytest.raises(UsageError, match="node-local"):
        deepspeed_config("nvme")
    with pytest.raises(UsageError, match="pipeline"):
        deepspeed_config("pipeline")
    assert "fp16" in deepspeed_config("zero2", precision="fp16")


def test_tf_config_for_a_two_node_allocation():
    base = {"SLURM_JOB_ID": "123456", "SLURM_STEP_NODELIST": "gpu[01-02]",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    configs = [tf_config({**base, "SLURM_PROCID": str(r)}) for r in range(4)]
    port = 10000 + 123456 % 20000 + 1
    # a port per task of the job, not per task of a node: nodes sharing a machine never meet on one
    workers = [f"gpu01:{port}", f"gpu01:{port + 1}", f"gpu02:{port + 2}", f"gpu02:{port + 3}"]
    assert all(c["cluster"]["worker"] == workers for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": r} for r in range(4)]
    assert len(set(workers)) == 4
    exported = tf_config({**base, "SLURM_PROCID": "0", "MASTER_PORT": "20000"})   # the job's own port
    assert exported["cluster"]["worker"][0] == "gpu01:20001"
    with pytest.raises(DistEnvError, match="outside"):
        tf_config({**base, "SLURM_PROCID": "4"})
    with pytest.raises(DistEnvError, match="srun task"):
        tf_config({})


def test_the_jobs_shell_form_of_tf_config_is_the_modules(tmp_path):
    """What each task of a --launcher tensorflow job runs (bash and scontrol, no scaletrain) gives
    the TF_CONFIG tf_config() gives for one task per node, on every node."""
    import json
    import subprocess

    from scaletrain.frameworks.tensorflow import TASK_SHELL

    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\nprintf 'gpu01\\ngpu02\\ngpu03\\n'\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "gpu[01-03]", "MASTER_PORT": "12000",
           "SLURM_JOB_ID": "77"}
    for task in range(3):
        out = subprocess.run(["bash", "-c", TASK_SHELL + '; printf %s "$TF_CONFIG"'], capture_output=True, text=True,
                             env={**env, "SLURM_PROCID": str(task)}, timeout=30, check=True).stdout
        want = tf_config({**env, "SLURM_PROCID": str(task), "SLURM_STEP_NODELIST": "gpu[01-03]",
                          "SLURM_STEP_TASKS_PER_NODE": "1(x3)"})
        assert json.loads(out) == want
        assert want["cluster"]["worker"] == ["gpu01:12001", "gpu02:12002", "gpu03:12003"]
    empty = tmp_path / "none"
    empty.mkdir()
    (empty / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (empty / "scontrol").chmod(0o755)
    proc = subprocess.run(["bash", "-c", TASK_SHELL], capture_output=True, text=True, timeout=30,
                          env={**env, "PATH": f"{empty}:/usr/bin:/bin", "SLURM_PROCID": "0"})
    assert proc.returncode == 3 and "listed no node of job 77" in proc.stderr
