"""The one package that shells out to Slurm (sbatch, scontrol, sinfo, squeue)."""
