#!/bin/bash
# cluster: lumi
# expect: torchrun-standalone@13 torchrun-nproc@13
#SBATCH --account=project_462000001
#SBATCH --partition=small-g
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=56
#SBATCH --gpus-per-node=8
#SBATCH --mem=480G
#SBATCH --time=1:00:00

srun python3 -m torch.distributed.run --standalone --nnodes=2 --nproc_per_node=16 \
    train.py --epochs 1
