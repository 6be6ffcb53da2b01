"""Job planning and Slurm script rendering: pure functions, dataclasses in, text out."""
