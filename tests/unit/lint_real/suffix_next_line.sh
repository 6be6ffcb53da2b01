#!/bin/bash
# JUWELS: the host name is read on one line and the InfiniBand suffix added on the next. No finding.
# cluster: juwels-booster
# expect:
#SBATCH --account=training2400
#SBATCH --partition=booster
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=12
#SBATCH --gres=gpu:4
#SBATCH --time=00:30:00

MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export MASTER_ADDR="${MASTER_ADDR}i"
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
srun python train.py
