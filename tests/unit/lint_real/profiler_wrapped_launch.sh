#!/bin/bash
# A one-GPU profiling run: nsys starts the program. It is a launch, not "no launch".
# cluster: none
# expect:
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-node=1
#SBATCH --time=00:20:00

module load pytorch
nsys profile -t cuda,nvtx -o "prof_${SLURM_JOB_ID}" python train.py --steps 50
