#!/bin/bash
# cluster: mahti
# expect: partition-limit@9 cpu-limit@7 sbatch-after-command@14 cluster-retired@5
#SBATCH --account=project_2001234
#SBATCH --partition=gpusmall
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=64
#SBATCH --time=12:00:00
#SBATCH --gres=gpu:a100:4

module purge
module load pytorch
export MASTER_PORT=29500
#SBATCH --mem=200G
srun python3 train.py
