#!/bin/bash
# A guide's template, not filled in: one placeholder finding, no bash-syntax noise.
# cluster: none
# expect: placeholder@9
#SBATCH --nodes=1
#SBATCH --gpus-per-node=1
#SBATCH --time=00:10:00

module load python/<select version>
srun python train.py <options>
