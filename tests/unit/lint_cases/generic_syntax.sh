#!/bin/bash
# cluster: none
# expect: time-missing@4 sbatch-typo@5 bash-syntax@13
#SBATCH --nodes=1
# SBATCH --time=1:00:00
#SBATCH --ntasks=1

if [ -n "$SLURM_JOB_ID" ]; then
    echo "in a job"
for i in 1 2; do
    srun python train.py --seed "$i"
done
