"""Reads Open MPI's variables through scaletrain.init(); rank 0 writes every rank's view to argv[1]."""

import json
import os
import sys

import scaletrain
import torch.distributed as dist

env = scaletrain.init()
views = [None] * env.world_size
dist.all_gather_object(views, {"launcher": env.launcher, "rank": env.rank,
                               "local_rank": env.local_rank, "world": env.world_size,
                               "node": env.node_rank, "ompi": os.environ.get("OMPI_COMM_WORLD_RANK")})
if env.rank == 0:
    with open(sys.argv[1], "w") as fh:
        json.dump(views, fh)
scaletrain.shutdown()
