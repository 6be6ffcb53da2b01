"""The one package that shells out to Slurm (sbatch, scontrol, sinfo, scancel).

``parse``: pure parsers of Slurm's output (``scontrol show ... -o`` records, GRES, times, exit
codes), unit-tested on captured text. ``commands``: small typed wrappers that run the commands
(``sbatch_parsable``, ``job_info``, ``wait``, ``cancel``, ``show_nodes_text``, ...) and turn
failures into one-line ``SlurmError``s. Nothing here imports torch.
"""
