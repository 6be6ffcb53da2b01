#!/bin/bash
# Whole nodes (--exclusive): a fixed MASTER_PORT cannot collide with another job. No finding.
# cluster: none
# expect:
#SBATCH --job-name=ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --exclusive
#SBATCH --time=02:00:00

export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=29500
srun python train.py
