#!/bin/bash
# Every GPU and core of two Puhti nodes: nobody else runs there, the fixed port is fine.
# cluster: puhti
# expect: cluster-retired@6
#SBATCH --account=project_2001234
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=10
#SBATCH --mem=320G
#SBATCH --gres=gpu:v100:4
#SBATCH --time=04:00:00

export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=12345
srun python train.py
