#!/bin/bash
# The log goes to a folder the script creates: Slurm opens the log before the script runs.
# cluster: none
# expect: log-dir@7
#SBATCH --nodes=1
#SBATCH --gpus-per-node=1
#SBATCH --output=logs/%x-%j.out
#SBATCH --time=01:00:00

mkdir -p logs
srun python train.py
