#!/bin/bash
# Mahti wants the GPU type in --gres; the message must name the untyped form, not contradict the hint.
# cluster: mahti
# expect: gpu-syntax@7 cluster-retired@6
#SBATCH --account=project_2001234
#SBATCH --partition=gpusmall
#SBATCH --gres=gpu:1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --time=01:00:00

srun python train.py
