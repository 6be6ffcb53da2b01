#!/bin/bash
# cluster: none
# expect: merge-conflict@8
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --time=1:00:00

<<<<<<< HEAD
srun python train.py --lr 0.1
=======
srun python train.py --lr 0.01
>>>>>>> feature
