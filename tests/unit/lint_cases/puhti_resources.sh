#!/bin/bash
# A Puhti job that asks for what Puhti does not have.
# cluster: puhti
# expect: gpu-syntax@10 tasks-per-gpu@7 mem-limit@8 time-limit@9 account-missing@1 cluster-retired@5
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --mem=400G
#SBATCH --time=4-00:00:00
#SBATCH --gres=gpu:a100:4

module load pytorch
srun python3 train.py --epochs 10
