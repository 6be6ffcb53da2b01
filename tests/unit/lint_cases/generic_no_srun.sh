#!/bin/bash
# No cluster: only the cluster-independent rules run.
# cluster: none
# expect: time-missing@5 mem-conflict@9 no-srun@12
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --mem=64G
#SBATCH --mem-per-cpu=4G

source venv/bin/activate
python train.py --epochs 3
