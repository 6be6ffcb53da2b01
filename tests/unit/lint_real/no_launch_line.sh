#!/bin/bash
# The launch line was lost: the job holds its GPUs and runs nothing.
# cluster: none
# expect: no-launch@11
#SBATCH --nodes=1
#SBATCH --gpus-per-node=2
#SBATCH --time=01:00:00

module load pytorch
source venv/bin/activate
echo "starting on $(hostname)"
