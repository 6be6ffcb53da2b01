"""An Alliance-style multi-node DDP job, written for the port tests (not the guide's text).

It builds a venv on every node with ``srun ... bash << EOF``, writes a config with a second
here-document, and passes the world size as ``$((SLURM_NTASKS_PER_NODE * SLURM_JOB_NUM_NODES))``.
``DDP_PROGRAM`` is the program it starts: the ranks meet through ``--init_method`` and all_reduce;
like the guide's, it imports torchvision, which only the venv the script builds has.
"""

ALLIANCE_DDP = """\
#!/bin/bash
#SBATCH --nodes 2
#SBATCH --gres=gpu:2          # two GPUs per node
#SBATCH --tasks-per-node=2    # one process per GPU
#SBATCH --cpus-per-task=1
#SBATCH --time=0-00:05
#SBATCH --output=%x-%j.out

module load python
srun -N $SLURM_NNODES -n $SLURM_NNODES bash << EOF
virtualenv --no-download $SLURM_TMPDIR/env
source $SLURM_TMPDIR/env/bin/activate
pip install --no-index torchvision
EOF
source $SLURM_TMPDIR/env/bin/activate

cat > run.cfg << EOF
nodes: $SLURM_JOB_NUM_NODES "from the here-document"
EOF
export MASTER_ADDR=$(hostname)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
srun python3 ddp_job.py --init_method tcp://$MASTER_ADDR:$MASTER_PORT --world_size $((SLURM_NTASKS_PER_NODE * SLURM_JOB_NUM_NODES))
"""

DDP_PROGRAM = """\
import argparse, os, sys
import torch
import torch.distributed as dist
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--init_method")
p.add_argument("--world_size", type=int)
a = p.parse_args()
rank = int(os.environ["SLURM_PROCID"])
dist.init_process_group("gloo", init_method=a.init_method, world_size=a.world_size, rank=rank)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
cfg = open("run.cfg").read().strip()
sys.stdout.write(f"RANK {rank} WORLD {a.world_size} SUM {value.item():g} VISION {torchvision.__version__} "
                 f"CFG {cfg}\\n")
sys.stdout.flush()
dist.destroy_process_group()
"""
