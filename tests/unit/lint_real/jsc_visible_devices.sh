#!/bin/bash
# JSC's guides ask scripts to list the node's GPUs; doing so is not reported.
# cluster: juwels-booster
# expect:
#SBATCH --account=training2400
#SBATCH --partition=booster
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=12
#SBATCH --gres=gpu:4
#SBATCH --time=00:15:00

export CUDA_VISIBLE_DEVICES=0,1,2,3
srun python3 train_lightning.py --num-nodes 4
