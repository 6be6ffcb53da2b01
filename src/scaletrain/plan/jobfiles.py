"""Framework config files a job writes for itself: Accelerate's YAML and DeepSpeed's JSON.

``--accelerate-config zero3`` or ``--deepspeed-config nvme`` name one of our strategies. The
config is decided here, at plan time, by the pure generators of :mod:`scaletrain.frameworks`,
and the batch script writes it when the job starts, into a folder of the job's working
directory that every node reads (``.scaletrain/job-$SLURM_JOB_ID``). The script stays the one
file to keep and to review, and a value that exists only inside the job (the node-local disk
for ZeRO's NVMe offload) is filled in there. A path instead of a name passes the user's own
file unchanged.

How the program finds the DeepSpeed config: as the centres' guides run DeepSpeed programs
(``myprog.py --deepspeed --deepspeed_config FILE``, the arguments of
``deepspeed.add_config_arguments``), unless the program's arguments already name a
``--deepspeed...`` option; the path is also exported as ``SCALETRAIN_DEEPSPEED_CONFIG`` and as
``PL_DEEPSPEED_CONFIG_PATH``, which Lightning's ``DeepSpeedStrategy`` reads by itself.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from scaletrain.clusters.profile import ClusterProfile
from scaletrain.contract.environ import (ACCELERATE_CONFIG_VAR as ACCELERATE_VAR, DEEPSPEED_CONFIG_VAR as DEEPSPEED_VAR,
                                         JOB_FILES_VAR as FILES_VAR)
from scaletrain.contract.script import HEREDOC_END as _EOF, SCRATCH_PLACEHOLDER as _SCRATCH
from scaletrain.errors import PlanError, UsageError
from scaletrain.frameworks.accelerate import ALIASES, accelerate_config, to_yaml
from scaletrain.frameworks.deepspeed import STRATEGIES as DEEPSPEED_STRATEGIES, deepspeed_config, to_json
from scaletrain.parallel.options import PRECISIONS, STRATEGIES
from scaletrain.plan.request import JobRequest

q = shlex.quote

LIGHTNING_DEEPSPEED_VAR = "PL_DEEPSPEED_CONFIG_PATH"   # read by Lightning's DeepSpeedStrategy
# ZeRO-3 offload to NVMe keeps fp32 master weights and Adam's two moments (12 bytes a parameter)
# and the 16-bit parameters (2) on the disk, sharded over the nodes; a quarter more for DeepSpeed's
# swap buffers, and never less than the guides' usual request
_NVME_BYTES_PER_PARAM = 14 * 1.25
_NVME_MIN_GB = 100


def is_file(value: str) -> bool:
    """True when a config flag's value names a file (a path or a file name), not a strategy."""
    return "/" in value or "." in value or value.startswith("~")


@dataclass(frozen=True)
class JobFile:
    """A config file the job writes before it launches."""

    var: str             # the exported variable that holds its path
    name: str            # the file's name in the job's folder
    text: str            # its content (``_SCRATCH`` stands for the node-local disk)
    what: str            # the script's comment
    scratch: str | None = None   # the node-local disk (``$LOCAL_SCRATCH`` or a path) the text uses


@dataclass(frozen=True)
class FrameworkFiles:
    """What the framework flags add to a plan."""

    files: tuple[JobFile, ...] = ()
    accelerate_word: str | None = None   # the ``--config_file`` value, a shell word
    program_extra: tuple[str, ...] = ()  # shell words after the program's own arguments
    env: tuple[tuple[str, str], ...] = ()   # literal exports (the user's own config file)
    notes: tuple[str, ...] = ()
    disk_gb: int | None = None           # node-local disk for NVMe offload (GRES clusters)


def framework_files(request: JobRequest, profile: ClusterProfile, *, nodes: int, world: int,
                    device: str) -> FrameworkFiles:
    """The config files, launch words and notes for ``--accelerate-config``/``--deepspeed-config``.

    Raises UsageError for a combination that cannot work (an FSDP config on CPU workers, a
    DeepSpeed config with the Accelerate launcher) and PlanError for NVMe offload on a
    cluster without node-local disk.
    """
    if request.precision not in PRECISIONS:
        raise UsageError(f"unknown --precision {request.precision!r}", f"use one of {', '.join(PRECISIONS)}")
    if request.micro_batch is not None and not request.deepspeed_config:
        raise UsageError("--micro-batch sets DeepSpeed's micro-batch: it goes with --deepspeed-config",
                         f"add --deepspeed-config {'|'.join(DEEPSPEED_STRATEGIES)}, or leave it out")
    # at most one survives: the Accelerate config needs --launcher accelerate, which refuses the
    # DeepSpeed one (Accelerate takes DeepSpeed settings from its own config)
    found = []
    if request.accelerate_config:
        found.append(_accelerate(request, profile, nodes=nodes, world=world, device=device))
    if request.deepspeed_config:
        found.append(_deepspeed(request, profile, nodes=nodes))
    return found[0] if found else FrameworkFiles()


def _accelerate(request: JobRequest, profile: ClusterProfile, *, nodes: int, world: int,
                device: str) -> FrameworkFiles:
    value = request.accelerate_config or ""
    if request.launcher != "accelerate":
        raise UsageError("--accelerate-config goes with --launcher accelerate", "add --launcher accelerate")
    if profile.scheduler != "slurm":
        raise UsageError(f"--accelerate-config needs a Slurm cluster: the {profile.name} profile starts the "
                         "workers with 'scaletrain run', which never reads an Accelerate config",
                         "plan for a cluster (--cluster roihu ...), or try the program here with "
                         "'scaletrain run --nproc-per-node N train.py'")
    if is_file(value):
        return FrameworkFiles(accelerate_word=q(value), notes=(
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
    return FrameworkFiles(
        files=(JobFile(ACCELERATE_VAR, "accelerate.yaml", text,
                       f"Accelerate config (--accelerate-config {value}): {kind}"),),
        accelerate_word=f'"${ACCELERATE_VAR}"', notes=notes)


def _names_deepspeed(words: tuple[str, ...]) -> bool:
    return any(w.startswith("--deepspeed") for w in words)


def _deepspeed(request: JobRequest, profile: ClusterProfile, *, nodes: int) -> FrameworkFiles:
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
        return FrameworkFiles(program_extra=extra, env=((DEEPSPEED_VAR, value), (LIGHTNING_DEEPSPEED_VAR, value)),
                              notes=tuple(notes))
    scratch, disk = None, None
    if value == "nvme":
        scratch, disk = _nvme_disk(request, profile, nodes=nodes)
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
    return FrameworkFiles(
        files=(JobFile(DEEPSPEED_VAR, "ds_config.json", to_json(config),
                       f"DeepSpeed config (--deepspeed-config {value}): ZeRO stage {zero['stage']}", scratch),),
        program_extra=extra, notes=tuple(notes), disk_gb=disk)


def _nvme_disk(request: JobRequest, profile: ClusterProfile, *, nodes: int) -> tuple[str, int | None]:
    """The node-local disk for ZeRO's NVMe offload, and the GB to request where it is a GRES."""
    if not profile.scratch_var or profile.scratch_in_memory:
        why = "their local /tmp is memory" if profile.scratch_in_memory else "they have no node-local disk"
        raise PlanError(f"--deepspeed-config nvme needs node-local NVMe, and {profile.name}'s nodes do not "
                        f"have it ({why})",
                        "use --deepspeed-config offload (optimizer state and parameters in CPU memory)")
    if not profile.scratch_gres:
        _check_quota(request, profile, nodes=nodes)
        return profile.scratch_var, None
    need = _NVME_MIN_GB
    if request.params:
        need = max(need, math.ceil(request.params * _NVME_BYTES_PER_PARAM / nodes / 1e9))
    if profile.scratch_max_gb and need > profile.scratch_max_gb:
        raise PlanError(f"ZeRO offload to NVMe needs about {need} GB of local disk per node, more than "
                        f"{profile.name}'s {int(profile.scratch_max_gb)} GB",
                        "use more nodes (the offloaded state is sharded over them), or --deepspeed-config offload")
    return profile.scratch_var, need


def _check_quota(request: JobRequest, profile: ClusterProfile, *, nodes: int) -> None:
    """PlanError when the offloaded model state (the summary's table: one replica, sharded over
    the nodes) does not fit the node-local disk a user may fill (Roihu: 150 GiB per user)."""
    if not (request.params and profile.scratch_max_gb):
        return
    from scaletrain.parallel.memory import estimate_memory   # lazily: plan imports stay small

    replica = estimate_memory(int(request.params)).replica
    quota = profile.scratch_max_gb * 1024 ** 3
    if replica / nodes <= quota:
        return
    fit = math.ceil(replica / quota)
    raise PlanError(f"ZeRO offload to NVMe of {request.params:.3g} parameters needs about "
                    f"{replica / nodes / 1024 ** 3:.0f} GiB of local disk per node on {nodes} node"
                    f"{'s' if nodes != 1 else ''}, but {profile.scratch_var} on {profile.name} holds "
                    f"{profile.scratch_max_gb:g} GiB per user",
                    f"use {fit} nodes or more (the offloaded state is sharded over them), or --deepspeed-config "
                    "offload (CPU memory)")


def folder_word(*, slurm: bool, folder: str | None = None) -> str:
    """The job's own folder as a shell word: ``folder`` (submit's run folder) or
    ``$PWD/.scaletrain/job-$SLURM_JOB_ID``, on the file system every node reads."""
    job = "$SLURM_JOB_ID" if slurm else "${SLURM_JOB_ID:-local-$$}"
    return q(folder) if folder else f'"$PWD/.scaletrain/job-{job}"'


def shell_lines(files: tuple[JobFile, ...], *, slurm: bool, folder: str | None = None) -> list[str]:
    """The script lines that write ``files`` (each whole, then renamed) and export their paths.

    ``folder``: where they go (``submit`` gives its run folder); by default a folder of the
    job's working directory named after the job, which every node reads.
    """
    if not files:
        return []
    out = ["", "# framework configs, written by the job into a folder every node reads",
           "# (they stay there as the job's record)",
           f"export {FILES_VAR}={folder_word(slurm=slurm, folder=folder)}",
           f'mkdir -p "${FILES_VAR}"']
    for f in files:
        path = f'"${f.var}"'
        out += [f"# {f.what}", f'export {f.var}="${FILES_VAR}/{f.name}"']
        if f.var == DEEPSPEED_VAR:
            out.append(f'export {LIGHTNING_DEEPSPEED_VAR}="${DEEPSPEED_VAR}"')
        body = f.text.rstrip("\n").split("\n")
        if f.scratch is None:
            out.append(f"cat > \"${f.var}.tmp\" <<'{_EOF}'")
            out += body
        else:
            where = _scratch_word(f.scratch)
            if f.scratch.startswith("$"):
                name = f.scratch.strip("${}")
                out.append(f'[ -n "${{{name}:-}}" ] || {{ echo "scaletrain: \\${name} is not set: this job has no '
                           f'node-local disk for ZeRO\'s NVMe offload" >&2; exit 3; }}')
            # unquoted here-document: only the disk's variable expands, everything else is escaped
            out.append(f'cat > "${f.var}.tmp" <<{_EOF}')
            out += [_escape(line).replace(_SCRATCH, where) for line in body]
        out += [_EOF, f'mv -f "${f.var}.tmp" {path}']
    return out


def _scratch_word(scratch: str) -> str:
    return "${" + scratch.strip("${}") + "}" if scratch.startswith("$") else _escape(scratch)


def _escape(line: str) -> str:
    # inside an unquoted here-document only \ $ ` are special
    return "".join("\\" + c if c in "\\$`" else c for c in line)
