#!/bin/bash
# cluster: mahti
# expect: visible-devices@12 launcher-tasks@13 cluster-retired@5
#SBATCH --account=project_2001234
#SBATCH --partition=gpumedium
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=1:00:00
#SBATCH --gres=gpu:a100:4

export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
srun apptainer_wrapper exec deepspeed train.py --deepspeed --deepspeed_config ds.json
