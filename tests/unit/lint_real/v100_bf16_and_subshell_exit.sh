#!/bin/bash
# A DeepSpeed job on V100 that asks for bf16 (no native bf16 there), and a data check whose exit
# ends only the subshell, so the job goes on without its data.
# cluster: puhti
# expect: subshell-exit@17 bf16-unsupported@20 cluster-retired@7
#SBATCH --account=project_2001234
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=40
#SBATCH --mem=320G
#SBATCH --gres=gpu:v100:4
#SBATCH --time=04:00:00

module purge
module load pytorch
test -d "$LOCAL_SCRATCH/data" || (echo "data not staged"; exit 1)
cat > ds_config.json <<'JSON'
{
  "bf16": {"enabled": true},
  "train_micro_batch_size_per_gpu": 8
}
JSON
srun deepspeed --num_gpus=4 train.py --deepspeed ds_config.json
