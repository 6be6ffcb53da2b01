#!/bin/bash
# 8 tasks over 2 nodes with no per-node count: Slurm may place 7 on one node and 1 on the other.
# cluster: none
# expect: ntasks-distribution@6
#SBATCH --nodes=2
#SBATCH --ntasks=8
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00

srun python train.py
