#!/bin/bash
# A GPU type LUMI does not have: sbatch refuses the job (an error).
# cluster: lumi
# expect: gpu-syntax@7
#SBATCH --account=project_465000001
#SBATCH --partition=small-g
#SBATCH --gres=gpu:v100:2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=7
#SBATCH --mem=120G
#SBATCH --time=01:00:00

srun python train.py
