#!/bin/bash
# Two GPUs of a shared node and a hard-coded port in tcp://: two such jobs on one node collide.
# cluster: narval
# expect: master-port@15
#SBATCH --account=def-someuser
#SBATCH --nodes=1
#SBATCH --gres=gpu:a100:2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=6
#SBATCH --mem=64G
#SBATCH --time=0-03:00

export MASTER_ADDR=$(hostname)
module load python
srun python ddp.py --init_method tcp://$MASTER_ADDR:3456 --world_size $SLURM_NTASKS
