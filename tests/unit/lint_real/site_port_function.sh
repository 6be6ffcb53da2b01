#!/bin/bash
# get_free_port is a shell function one centre provides; elsewhere MASTER_PORT ends up empty.
# cluster: none
# expect: site-command@10
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --time=01:00:00

export MASTER_PORT=$(get_free_port)
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes=2 --nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT train.py
