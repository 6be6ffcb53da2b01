#!/bin/bash
# One task per node, four torchrun workers, each told to use all of the task's cores.
# cluster: none
# expect: omp-threads@12
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --gpus-per-node=4
#SBATCH --time=01:00:00

module load pytorch
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
srun torchrun --standalone --nproc_per_node=4 train.py
