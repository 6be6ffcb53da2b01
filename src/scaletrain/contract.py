"""The launcher <-> runtime contract: the facts both sides of a job must agree on.

A generated batch script (``plan``), the local launcher (``scaletrain run``), the linter and the
per-process runtime (``scaletrain.init()``) each need the same few facts: how MASTER_PORT is
derived from a Slurm job id, which ``SCALETRAIN_*`` variables carry a choice from the launcher to
its workers, and which exit code means "stopped on purpose, state saved, requeue me". They live
here, in one leaf module that imports nothing of scaletrain, so no side has to reach into another.
"""

from __future__ import annotations

import zlib

# MASTER_PORT under Slurm: every task computes the same port from the job id, without talking.
# 10000..29999 lies below Linux's ephemeral range (32768-60999), so outgoing connections on
# the node never hold it, and 20000 ports make two jobs on one node unlikely to collide.
PORT_BASE = 10000
PORT_SPAN = 20000
# The same formula as shell arithmetic, for generated scripts and lint hints.
PORT_SHELL_EXPR = f"$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))"
# torch's own default, used when nothing else says which port (a plain local run).
DEFAULT_PORT = 29500

# Variables a launcher or a generated script sets for the processes it starts.
CLUSTER_VAR = "SCALETRAIN_CLUSTER"            # profile name or absolute .toml path
DEVICE_VAR = "SCALETRAIN_DEVICE"              # "cpu", "cuda", "cuda:N", "mps", "auto"
BACKEND_VAR = "SCALETRAIN_BACKEND"            # "gloo": NCCL refuses two ranks on one GPU
PROCS_PER_GPU_VAR = "SCALETRAIN_PROCS_PER_GPU"  # K: local rank r uses GPU r // K
BIND_VAR = "SCALETRAIN_CPU_BIND"              # "auto" or "none"
DATA_VAR = "SCALETRAIN_DATA"                  # where --stage-data copied the data on each node
TIMEOUT_VAR = "SCALETRAIN_TIMEOUT"            # collective timeout in seconds once training runs
RUN_DIR_VAR = "SCALETRAIN_RUN_DIR"            # `scaletrain run`'s folder: error records, stacks/
AGENT_PID_VAR = "SCALETRAIN_AGENT_PID"        # the launcher's PID: workers die with it
STOP_SIGNALS_VAR = "SCALETRAIN_STOP_SIGNALS"  # "USR1:time_limit,TERM:preempted" or "none"

# Exit code of a process that stopped on purpose at a time limit or preemption after its
# state was saved: "try again later" (BSD sysexits EX_TEMPFAIL). A batch script requeues the
# job only when its tasks ended with this code.
EXIT_STOPPED = 75


def port_from_job_id(job_id: str) -> int:
    """A rendezvous port derived from a job id: ``10000 + id % 20000`` (crc32 if not numeric)."""
    text = job_id.strip()
    number = int(text) if text.isdigit() else zlib.crc32(text.encode())
    return PORT_BASE + number % PORT_SPAN
