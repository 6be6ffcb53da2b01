#!/bin/bash
# JURECA-DC's dc-gpu partition hands out whole nodes; no profile describes it, so lint cannot say
# another job shares the node: the fixed port is no finding.
# cluster: none
# expect:
#SBATCH --account=training2400
#SBATCH --partition=dc-gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=128
#SBATCH --time=00:30:00

export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)i"
export MASTER_PORT=7010
srun bash -c 'torchrun --nnodes=$SLURM_NNODES --node_rank=$SLURM_NODEID --nproc_per_node=4 \
    --rdzv_id='"'"'$SLURM_JOB_ID'"'"' --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT train.py'
