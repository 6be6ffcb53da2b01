"""``TF_CONFIG`` for a ``tf.distribute.MultiWorkerMirroredStrategy`` job, from Slurm's variables.

Each srun task is one worker. The worker list is every task of the step in rank order, each at
``host:port`` with ports counted from the job's rendezvous port (the same formula the runtime
uses for MASTER_PORT) plus one, plus the task's local id, so tasks sharing a node never share a
port. In a batch script::

    srun bash -c 'export TF_CONFIG="$(python3 -m scaletrain.frameworks.tensorflow)"; exec python3 train.py'
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from scaletrain.contract import port_from_job_id
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


def tf_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """The TF_CONFIG mapping of the srun task described by ``environ``."""
    hosts = expand_hostlist(_get(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    counts = parse_tasks_per_node(_get(environ, "SLURM_STEP_TASKS_PER_NODE",
                                       "SLURM_TASKS_PER_NODE"))
    if len(counts) != len(hosts):
        raise DistEnvError(f"{len(hosts)} hosts but task counts for {len(counts)} nodes",
                           "run inside one srun step of the job")
    base = port_from_job_id(_get(environ, "SLURM_JOB_ID", "SLURM_JOBID")) + 1
    workers = [f"{host}:{base + local}" for host, count in zip(hosts, counts)
               for local in range(count)]
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
