#!/bin/bash
# srun starts one plain python per node on a 4-GPU node: three GPUs idle unless the program uses them.
# cluster: none
# expect: tasks-per-gpu@11
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=16
#SBATCH --time=01:00:00

srun python train.py --batch-size 256
