#!/bin/bash
# cluster: juwels-booster
# expect: gpus-per-node@8 launcher-nodes@15 node-rank-missing@14
#SBATCH --account=training2324
#SBATCH --partition=booster
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=96
#SBATCH --mem=0
#SBATCH --time=01:00:00

export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)i"
srun torchrun \
    --nnodes=4 --nproc_per_node=8 \
    --master_addr=$MASTER_ADDR --master_port=29500 \
    train.py
