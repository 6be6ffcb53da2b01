"""``TF_CONFIG`` for a ``tf.distribute.MultiWorkerMirroredStrategy`` job, from Slurm's variables.

Each srun task is one worker. The worker list is every task of the step in rank order, task ``i``
at ``host:port`` with ``port = MASTER_PORT + 1 + i`` (MASTER_PORT: the job's rendezvous port, the
contract's formula when it is not exported). Ports differ for every task of the job, not only on
a node: TensorFlow's server listens on every interface, and nodes that share one machine (a test
cluster) would meet on one port otherwise.

Two forms of the same rule, kept together here:

- :data:`TASK_SHELL`, what a batch job runs in each task (one task per node, ``--launcher
  tensorflow``): bash and ``scontrol`` only, so the job's Python needs TensorFlow and nothing of
  scaletrain (it runs on the centre's TensorFlow module as the centres' own examples do);
- :func:`tf_config` (``python -m scaletrain.frameworks.tensorflow`` prints it), for any number of
  tasks per node, e.g. under ``scaletrain run --emulate slurm``::

    srun bash -c 'export TF_CONFIG="$(python3 -m scaletrain.frameworks.tensorflow)"; exec python3 train.py'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from scaletrain.contract.environ import port_from_job_id
from scaletrain.errors import DistEnvError
from scaletrain.fileio import json_text
from scaletrain.runtime.nodelist import expand_hostlist, parse_tasks_per_node


def _get(environ: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value
    raise DistEnvError(f"{names[0]} is not set: TF_CONFIG is built inside an srun task",
                       "run it as 'srun ... python3 -m scaletrain.frameworks.tensorflow'")


def first_port(environ: Mapping[str, str]) -> int:
    """The first worker's port: MASTER_PORT + 1 (the job exports MASTER_PORT; else its formula)."""
    master = environ.get("MASTER_PORT", "").strip()
    if master.isdigit():
        return int(master) + 1
    return port_from_job_id(_get(environ, "SLURM_JOB_ID", "SLURM_JOBID")) + 1


# What each task of a batch job runs before the program (one task per node, in node-list order,
# so SLURM_PROCID is the node's index): the list tf_config() makes for that layout. No single
# quote in it: the launch line quotes it whole for 'srun bash -c'.
# The workers are collected in an array and joined once: appending to a string copies it each
# time, 5 s a task at 6,000 nodes against 0.2 s (docs/scale.md).
TASK_SHELL = (
    'w=(); i=0; for h in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do '
    'w+=("\\"$h:$((MASTER_PORT + 1 + i))\\""); i=$((i + 1)); done; '
    '[ "${#w[@]}" -gt 0 ] || { echo "scaletrain: TF_CONFIG: scontrol listed no node of job $SLURM_JOB_ID" >&2; exit 3; }; '
    'workers=$(IFS=,; printf %s "${w[*]}"); '
    'export TF_CONFIG="{\\"cluster\\":{\\"worker\\":[$workers]},\\"task\\":{\\"type\\":\\"worker\\",'
    '\\"index\\":$SLURM_PROCID}}"')


def tf_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """The TF_CONFIG mapping of the srun task described by ``environ``."""
    hosts = expand_hostlist(_get(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    counts = parse_tasks_per_node(_get(environ, "SLURM_STEP_TASKS_PER_NODE",
                                       "SLURM_TASKS_PER_NODE"))
    if len(counts) != len(hosts):
        raise DistEnvError(f"{len(hosts)} hosts but task counts for {len(counts)} nodes",
                           "run inside one srun step of the job")
    base = first_port(environ)
    tasks = [host for host, count in zip(hosts, counts) for _ in range(count)]
    workers = [f"{host}:{base + i}" for i, host in enumerate(tasks)]
    index = int(_get(environ, "SLURM_PROCID"))
    if not 0 <= index < len(workers):
        raise DistEnvError(f"SLURM_PROCID={index} is outside the step's {len(workers)} tasks",
                           "run inside one srun step of the job")
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def main() -> int:
    """Print this task's TF_CONFIG as JSON (for ``export TF_CONFIG=$(...)``)."""
    try:
        print(json_text(tf_config(os.environ), separators=(",", ":")))
    except DistEnvError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
