#!/bin/bash
# NERSC-style Shifter options come from a Slurm plugin: not unknown sbatch options.
# cluster: none
# expect:
#SBATCH --image=docker:nersc/pytorch:24.06
#SBATCH --module=gpu,nccl-plugin
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --time=00:30:00

srun shifter python train.py
