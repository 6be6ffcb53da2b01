"""Configuration files for other frameworks, written from scaletrain's own names.

A user who says ``--strategy zero3 --precision bf16`` should not have to learn three config
formats to get the same thing from Accelerate, DeepSpeed or TensorFlow. Each module here is a
pure function from our names to that framework's settings, plus a writer:

- :mod:`.accelerate`: an ``accelerate launch --config_file`` YAML (DDP or FSDP, as the CSC guide
  shows it);
- :mod:`.deepspeed`: a ZeRO JSON (stages 1-3, offload to CPU, offload to NVMe on node-local
  scratch, as the Alliance guide shows them);
- :mod:`.tensorflow`: ``TF_CONFIG`` for each task of a MultiWorkerMirroredStrategy job, built
  from the Slurm allocation (``python -m scaletrain.frameworks.tensorflow`` prints it).

Nothing here imports torch or the frameworks themselves.
"""
