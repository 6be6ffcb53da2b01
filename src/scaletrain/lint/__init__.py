"""`scaletrain lint`: rules that check existing Slurm batch scripts."""
