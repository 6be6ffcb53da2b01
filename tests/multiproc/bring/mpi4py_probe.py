"""mpi4py and scaletrain.init() side by side; rank 0 writes every rank's view to argv[1]."""

import json
import sys

from mpi4py import MPI

import scaletrain

env = scaletrain.init()
comm = MPI.COMM_WORLD
views = comm.gather({"mpi_rank": comm.Get_rank(), "mpi_size": comm.Get_size(),
                     "launcher": env.launcher, "rank": env.rank, "world": env.world_size,
                     "local_rank": env.local_rank, "node": env.node_rank}, root=0)
total = scaletrain.all_reduce_mean(float(env.rank)) if hasattr(scaletrain, "all_reduce_mean") else None
if comm.Get_rank() == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump({"views": views, "mean_rank": total}, fh)
scaletrain.shutdown()
