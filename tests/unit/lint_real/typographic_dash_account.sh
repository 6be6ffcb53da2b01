#!/bin/bash
# Pasted from a web page: the account line starts with an em dash, so sbatch does not read it.
# cluster: none
# expect: sbatch-unicode@6
#SBATCH --job-name=ddp
#SBATCH —account=project_2001234
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --time=01:00:00

srun python train.py
