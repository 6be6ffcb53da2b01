"""A job program for the Slurm integration tests: join the job, all_reduce rank+1, print one line.

With world size W the sum is W(W+1)/2 on every rank; the test reads each rank's line from the
job's output file. Runs the same under srun (one task per GPU) and under ``scaletrain run``
started once per node (torchrun mode).
"""

import os
import socket
import sys

import scaletrain


def main() -> int:
    env = scaletrain.init()
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(env.rank + 1)])
    dist.all_reduce(value)
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    args = " ".join(sys.argv[1:])
    # one write per line: ranks share the job's output file and run unbuffered (PYTHONUNBUFFERED),
    # where print() writes the text and the newline separately and lines of two ranks can interleave
    sys.stdout.write(f"RANK {env.rank} WORLD {env.world_size} LOCAL {env.local_rank}/{env.local_world_size} "
                     f"NODE {env.node_rank}/{env.num_nodes} HOST {node} LAUNCHER {env.launcher} "
                     f"DEVICE {env.device} SUM {value.item():g} ARGS {args}\n")
    sys.stdout.flush()
    scaletrain.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
