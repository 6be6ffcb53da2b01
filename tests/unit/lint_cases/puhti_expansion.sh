#!/bin/bash
# Per-task variables expanded by the batch shell, and a single-quoted job id.
# cluster: puhti
# expect: early-expansion@20 early-expansion@24 single-quoted-var@25 cluster-retired@6
#SBATCH --account=project_2001234
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=40
#SBATCH --mem=320G
#SBATCH --time=1:00:00
#SBATCH --gres=gpu:v100:4

MAIN_PROCESS_IP=$(hostname -i)
RUN_CMD="accelerate launch \
    --config_file=accelerate_config.yaml \
    --num_processes=8 \
    --num_machines=$SLURM_NNODES \
    --main_process_ip=$MAIN_PROCESS_IP \
    --machine_rank=$SLURM_NODEID \
    train.py"

srun bash -c "$RUN_CMD"
srun bash -c "echo rank $SLURM_PROCID on $(hostname)"
srun --ntasks-per-node=1 python3 eval.py --run-name 'run-$SLURM_JOB_ID'
