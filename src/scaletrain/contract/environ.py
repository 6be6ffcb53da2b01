"""The environment between a launcher and the processes it starts.

A generated batch script (``plan``), the local launcher (``scaletrain run``), the linter and the
per-process runtime (``scaletrain.init()``) each need the same few facts: how MASTER_PORT is
derived from a Slurm job id, which ``SCALETRAIN_*`` variables carry a choice from the launcher to
its workers (and which ones a user sets to change scaletrain's waits), the format of their
values, which signals stop a job on purpose and which exit code means "stopped on purpose, state
saved, requeue me". Every environment variable scaletrain sets or reads for itself is spelt here
only (a unit test holds it); everything else imports it. A leaf module: it imports nothing of
scaletrain, so no side has to reach into another.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

# MASTER_PORT under Slurm: every task computes the same port from the job id, without talking.
# 10000..29999 lies below Linux's ephemeral range (32768-60999), so outgoing connections on
# the node never hold it, and 20000 ports make two jobs on one node unlikely to collide.
PORT_BASE = 10000
PORT_SPAN = 20000
# The same formula as shell arithmetic, for generated scripts and lint hints.
PORT_SHELL_EXPR = f"$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))"
# torch's own default, used when nothing else says which port (a plain local run).
DEFAULT_PORT = 29500


def port_from_job_id(job_id: str) -> int:
    """A rendezvous port derived from a job id: ``10000 + id % 20000`` (crc32 if not numeric)."""
    text = job_id.strip()
    number = int(text) if text.isdigit() else zlib.crc32(text.encode())
    return PORT_BASE + number % PORT_SPAN


# Variables a launcher or a generated script sets for the processes it starts.
CLUSTER_VAR = "SCALETRAIN_CLUSTER"            # profile name or absolute .toml path
DEVICE_VAR = "SCALETRAIN_DEVICE"              # "cpu", "cuda", "cuda:N", "mps", "auto"
BACKEND_VAR = "SCALETRAIN_BACKEND"            # "gloo": NCCL refuses two ranks on one GPU
PROCS_PER_GPU_VAR = "SCALETRAIN_PROCS_PER_GPU"  # K: local rank r uses GPU r // K
BIND_VAR = "SCALETRAIN_CPU_BIND"              # "auto" or "none"
DATA_VAR = "SCALETRAIN_DATA"                  # where --stage-data copied the data on each node
# The cluster profile's GPU -> nearest CPU cores map ("0:49-55;1:57-63"), exported by a generated
# script so the runtime can bind torchrun's workers without reading the profile itself.
GPU_CPU_MAP_VAR = "SCALETRAIN_GPU_CPU_MAP"
TIMEOUT_VAR = "SCALETRAIN_TIMEOUT"            # collective timeout in seconds once training runs
RUN_DIR_VAR = "SCALETRAIN_RUN_DIR"            # `scaletrain run`'s folder: error records, stacks/
AGENT_PID_VAR = "SCALETRAIN_AGENT_PID"        # the launcher's PID: workers die with it
STOP_SIGNALS_VAR = "SCALETRAIN_STOP_SIGNALS"  # format_stop_signals(...) or "none"
# Read by the runtime and the launcher only, set by the user to wait longer for a slow start.
RESOLVE_WAIT_VAR = "SCALETRAIN_RESOLVE_TIMEOUT"        # seconds to retry a MASTER_ADDR that does not resolve
RENDEZVOUS_WAIT_VAR = "SCALETRAIN_RENDEZVOUS_TIMEOUT"  # seconds to wait for every rank to join
# Set by the user: "1" runs torch's elastic agent as it is, without scaletrain's patches to it
# (launch/adapter.py), the way out when a torch lacks a private name a patch needs.
TORCH_AS_IS_VAR = "SCALETRAIN_TORCH_AS_IS"
# Read by the launcher, set by the user (launch/teardown.py): seconds the workers of a run whose
# training finished may take to exit before the launcher names them and ends those that wait
# without using CPU; and seconds after training that one still working is left to finish.
TEARDOWN_WAIT_VAR = "SCALETRAIN_TEARDOWN_TIMEOUT"
TEARDOWN_WORK_VAR = "SCALETRAIN_TEARDOWN_WORK_TIMEOUT"
NESTED_VAR = "SCALETRAIN_NESTED_SPAWN"   # "1" in the workers a worker spawns itself
# The port of the agent's store, as the worker was started with it (inherited, never rewritten,
# by the processes the program spawns): a rendezvous elsewhere is the program's own.
AGENT_PORT_VAR = "SCALETRAIN_AGENT_STORE_PORT"
# Read by scaletrain wherever it runs (plan, lint, clusters), set by the user.
CLUSTERS_DIR_VAR = "SCALETRAIN_CLUSTERS_DIR"   # the user's own cluster profiles
# Exported by a generated script that writes framework configs (plan/jobfiles.py), for the
# program and its launcher: the job's folder for them, and each config's path.
JOB_FILES_VAR = "SCALETRAIN_JOB_FILES"
ACCELERATE_CONFIG_VAR = "SCALETRAIN_ACCELERATE_CONFIG"
DEEPSPEED_CONFIG_VAR = "SCALETRAIN_DEEPSPEED_CONFIG"
LIGHTNING_DEEPSPEED_VAR = "PL_DEEPSPEED_CONFIG_PATH"   # read by Lightning's DeepSpeedStrategy (we export it)

# `scaletrain run` -> its workers, read by the worker shim (scaletrain/launch/inproc/worker_shim.py).
GROUP_RECORD_VAR = "SCALETRAIN_GROUP_RECORD"  # folder where each worker records its process group
EMULATE_VAR = "SCALETRAIN_EMULATE"            # "slurm" or "mpi": give workers that launcher's variables
EMULATE_NODES_VAR = "SCALETRAIN_EMULATE_NODES"  # emulated nodes the local workers are spread over
EMULATE_JOB_VAR = "SCALETRAIN_EMULATE_JOB"    # the emulated Slurm job id
EMULATE_KEEP_VAR = "SCALETRAIN_EMULATE_KEEP"  # JSON: torchrun variables the user exported, kept
EMULATE_GPUS_VAR = "SCALETRAIN_EMULATE_GPUS"  # GPUs per emulated node (faked ones under --cpu)
CPU_SMOKE_VAR = "SCALETRAIN_CPU_SMOKE"        # "1": run a CUDA/NCCL program on CPU processes
DS_ACCELERATOR_VAR = "DS_ACCELERATOR"          # DeepSpeed's accelerator: "cpu" under --cpu unless the user chose one
HOROVOD_RENDEZVOUS_VAR = "SCALETRAIN_HOROVOD_RENDEZVOUS"  # "HOST:PORT" of the --emulate mpi Horovod store

# Exit code of a process that stopped on purpose at a time limit or preemption after its
# state was saved: "try again later" (BSD sysexits EX_TEMPFAIL). A batch script requeues the
# job only when its tasks ended with this code.
EXIT_STOPPED = 75

# The stop signals, by name without "SIG" (as sbatch's --signal, bash's trap and
# SCALETRAIN_STOP_SIGNALS write them). Under --requeue Slurm sends TIME_LIMIT_SIGNAL to the batch
# shell (``--signal=B:USR1@N``) shortly before the time limit, and a preemption sends
# PREEMPT_SIGNAL; the batch shell and `scaletrain run` pass FORWARDED_SIGNALS on to the workers,
# whose runtime turns DEFAULT_STOP_SIGNALS into stop requests with these reasons.
# The signal of `scaletrain cancel --save`: the tasks save and stop (reason "requested"), and the
# batch shell of a --requeue script, which traps it, does NOT requeue the job afterwards.
SAVE_AND_STOP_SIGNAL = "USR2"
TIME_LIMIT_SIGNAL = "USR1"
PREEMPT_SIGNAL = "TERM"
FORWARDED_SIGNALS = ("USR1", "USR2", "TERM")
DEFAULT_STOP_SIGNALS: dict[str, str] = {TIME_LIMIT_SIGNAL: "time_limit", PREEMPT_SIGNAL: "preempted",
                                        SAVE_AND_STOP_SIGNAL: "requested"}   # scaletrain cancel --save


def format_stop_signals(signals: Mapping[str, str]) -> str:
    """``{"USR1": "time_limit", "TERM": "preempted"}`` -> ``"USR1:time_limit,TERM:preempted"``."""
    return ",".join(f"{name}:{reason}" for name, reason in signals.items())


def format_cores(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2,5'`` (taskset's list form)."""
    out: list[str] = []
    ordered = sorted(set(cores))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def format_gpu_cpu_map(cmap: Mapping[int, Sequence[int]]) -> str:
    """``{0: [49..55], 1: [57..63]}`` -> ``'0:49-55;1:57-63'`` (the value of GPU_CPU_MAP_VAR)."""
    return ";".join(f"{gpu}:{format_cores(cmap[gpu])}" for gpu in sorted(cmap))


def parse_gpu_cpu_map(text: str) -> dict[int, tuple[int, ...]]:
    """The inverse of :func:`format_gpu_cpu_map`; ValueError names the entry it cannot read."""
    out: dict[int, tuple[int, ...]] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        gpu, sep, cores = entry.partition(":")
        if not sep or not gpu.strip().isdigit():
            raise ValueError(f"{entry!r} is not GPU:CORES")
        found: list[int] = []
        for item in filter(None, (c.strip() for c in cores.split(","))):
            low, _, high = item.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"{entry!r}: {item!r} is not a core or a range of cores")
            found.extend(range(int(low), int(high or low) + 1))
        out[int(gpu)] = tuple(found)
    return out


def torch_as_is(environ: Mapping[str, str]) -> bool:
    """Whether the user asked for torch as it is (:data:`TORCH_AS_IS_VAR` set, and not "0"):
    read by the launcher (no patch of torch's agent) and by the runtime (no group timeout
    changed in place) alike."""
    return environ.get(TORCH_AS_IS_VAR, "").strip() not in ("", "0")
