"""Stage 4, files: what the job writes and reads besides the program, its framework configs
(Accelerate's YAML and DeepSpeed's JSON), decided once into a ``Files`` record.

``--accelerate-config zero3`` or ``--deepspeed-config nvme`` name one of our strategies. The
config is decided here, at plan time, by the pure generators of :mod:`scaletrain.frameworks`,
and the batch script writes it when the job starts, into a folder of the job's working
directory that every node reads (``.scaletrain/job-$SLURM_JOB_ID``). The script stays the one
file to keep and to review, and a value that exists only inside the job (the node-local disk
for ZeRO's NVMe offload, which the resources stage sized) is filled in there. A path instead of
a name passes the user's own file unchanged.

How the program finds the DeepSpeed config: as the centres' guides run DeepSpeed programs
(``myprog.py --deepspeed --deepspeed_config FILE``, the arguments of
``deepspeed.add_config_arguments``), unless the program's arguments already name a
``--deepspeed...`` option; the path is also exported as ``SCALETRAIN_DEEPSPEED_CONFIG`` and as
``PL_DEEPSPEED_CONFIG_PATH``, which Lightning's ``DeepSpeedStrategy`` reads by itself.
"""

from __future__ import annotations

import dataclasses
import shlex

from scaletrain.clusters.model import ClusterProfile
from scaletrain.contract.environ import (ACCELERATE_CONFIG_VAR as ACCELERATE_VAR, DEEPSPEED_CONFIG_VAR as DEEPSPEED_VAR,
                                         LIGHTNING_DEEPSPEED_VAR)
from scaletrain.contract.script import SCRATCH_PLACEHOLDER as _SCRATCH
from scaletrain.errors import UsageError
from scaletrain.frameworks.accelerate import ALIASES, accelerate_config, to_yaml
from scaletrain.frameworks.deepspeed import STRATEGIES as DEEPSPEED_STRATEGIES, deepspeed_config, to_json
from scaletrain.parallel.options import PRECISIONS, STRATEGIES
from scaletrain.plan.records import Allocation, Files, JobFile, Settled
from scaletrain.plan.request import JobRequest

q = shlex.quote


def is_file(value: str) -> bool:
    """True when a config flag's value names a file (a path or a file name), not a strategy."""
    return "/" in value or "." in value or value.startswith("~")


def plan_files(settled: Settled, resources: Allocation) -> Files:
    """The config files, launch words and notes for ``--accelerate-config``/``--deepspeed-config``
    (and the note of ``--expand-args``, whose words the program's line carries).

    Raises UsageError for a combination that cannot work (an FSDP config on CPU workers, a
    DeepSpeed config with the Accelerate launcher).
    """
    request, profile = settled.request, settled.profile
    if request.precision not in PRECISIONS:
        raise UsageError(f"unknown --precision {request.precision!r}", f"use one of {', '.join(PRECISIONS)}")
    if request.micro_batch is not None and not request.deepspeed_config:
        raise UsageError("--micro-batch sets DeepSpeed's micro-batch: it goes with --deepspeed-config",
                         f"add --deepspeed-config {'|'.join(DEEPSPEED_STRATEGIES)}, or leave it out")
    # at most one survives: the Accelerate config needs --launcher accelerate, which refuses the
    # DeepSpeed one (Accelerate takes DeepSpeed settings from its own config)
    found = []
    if request.accelerate_config:
        found.append(_accelerate(request, profile, nodes=resources.nodes, world=resources.world_size,
                                 device=resources.device))
    if request.deepspeed_config:
        found.append(_deepspeed(request, profile))
    files = found[0] if found else Files()
    if not request.expand_args:
        return files
    expand = ("--expand-args: $NAME in the program's arguments expands when the job runs, in the batch "
              "shell (job-wide values)")
    return dataclasses.replace(files, notes=(expand, *files.notes))


def _accelerate(request: JobRequest, profile: ClusterProfile, *, nodes: int, world: int,
                device: str) -> Files:
    value = request.accelerate_config or ""
    if request.launcher != "accelerate":
        raise UsageError("--accelerate-config goes with --launcher accelerate", "add --launcher accelerate")
    if profile.scheduler != "slurm":
        raise UsageError(f"--accelerate-config needs a Slurm cluster: the {profile.name} profile starts the "
                         "workers with 'scaletrain run', which never reads an Accelerate config",
                         "plan for a cluster (--cluster roihu ...), or try the program here with "
                         "'scaletrain run --nproc-per-node N train.py'")
    if is_file(value):
        return Files(accelerate_config=q(value), notes=(
            "accelerate: the strategy comes from your --accelerate-config file; scaletrain passes only the "
            "layout (--num_processes, --num_machines, --machine_rank, the main process address)",))
    cpu = device == "cpu"
    config = accelerate_config(value, precision=request.precision, num_machines=nodes,
                               num_processes=world, cpu=cpu)
    text = f"# Accelerate config for --accelerate-config {value}, written by scaletrain\n" + to_yaml(config)
    kind = config["distributed_type"]
    note = (f"accelerate: the job writes an Accelerate config ({kind}"
            + (f", {config['fsdp_config']['fsdp_sharding_strategy']}" if "fsdp_config" in config else "")
            + f", mixed_precision {config['mixed_precision']}) and passes it with --config_file")
    notes: tuple[str, ...] = (note,)
    if value in ALIASES and value in STRATEGIES:   # our ZeRO-looking names: say what they really are
        notes += (f"--accelerate-config {value} is the older name of {ALIASES[value]}: PyTorch FSDP through "
                  f"Accelerate, not DeepSpeed ZeRO (for that: --launcher deepspeed --deepspeed-config {value})",)
    return Files(
        job_files=(JobFile(ACCELERATE_VAR, "accelerate.yaml", text,
                           f"Accelerate config (--accelerate-config {value}): {kind}"),),
        accelerate_config=f'"${ACCELERATE_VAR}"', notes=notes)


def _names_deepspeed(words: tuple[str, ...]) -> bool:
    return any(w.startswith("--deepspeed") for w in words)


def _deepspeed(request: JobRequest, profile: ClusterProfile) -> Files:
    value = request.deepspeed_config or ""
    if request.launcher == "accelerate":
        raise UsageError("--deepspeed-config is for DeepSpeed's own launcher or one task per GPU; Accelerate "
                         "takes DeepSpeed settings from its own config",
                         "use --launcher deepspeed (or scaletrain/srun), or pass an Accelerate config file with "
                         "distributed_type: DEEPSPEED as --accelerate-config FILE")
    own_args = _names_deepspeed(request.script_args)
    notes: list[str] = []
    if own_args:
        notes.append(f"deepspeed: your arguments name a --deepspeed option, so scaletrain adds none; the "
                     f"config's path is ${DEEPSPEED_VAR} (pass it with --expand-args)")
    if is_file(value):
        extra = () if own_args else ("--deepspeed", "--deepspeed_config", q(value))
        return Files(program_extra=extra, env=((DEEPSPEED_VAR, value), (LIGHTNING_DEEPSPEED_VAR, value)),
                     notes=tuple(notes))
    scratch = profile.scratch_var if value == "nvme" else None   # checked and sized by the resources stage
    # Lightning fills the micro-batch from the program's DataLoader when the config leaves it out
    micro = request.micro_batch or (None if request.launcher == "lightning" else 1)
    config = deepspeed_config(value, micro_batch_per_gpu=micro, precision=request.precision,
                              nvme_path=f"{_SCRATCH}/deepspeed-nvme" if scratch else None)
    if micro is not None and request.micro_batch is None:
        notes.append("deepspeed: train_micro_batch_size_per_gpu is 1 in the written config; give your per-GPU "
                     "batch with --micro-batch N")
    zero = config["zero_optimization"]
    where = {"cpu": "optimizer state and parameters offloaded to CPU memory",
             "nvme": f"optimizer state and parameters offloaded to node-local NVMe ({scratch}/deepspeed-nvme)"}
    offload = zero.get("offload_param", {}).get("device")
    notes.append(f"deepspeed: the job writes a ZeRO stage {zero['stage']} config"
                 + (f" ({where[offload]})" if offload in where else "")
                 + ("" if own_args else "; the program gets --deepspeed --deepspeed_config FILE, as in the "
                    "centres' DeepSpeed examples"))
    extra = () if own_args else ("--deepspeed", "--deepspeed_config", f'"${DEEPSPEED_VAR}"')
    return Files(
        job_files=(JobFile(DEEPSPEED_VAR, "ds_config.json", to_json(config),
                           f"DeepSpeed config (--deepspeed-config {value}): ZeRO stage {zero['stage']}", scratch),),
        program_extra=extra, notes=tuple(notes))
