"""Benchmarks a user runs on their own allocation: ``scaletrain bench scaling`` and ``bench comm``.

- :mod:`~scaletrain.bench.comm`: collective bandwidth per message size (the nccl-tests
  definitions of algorithm and bus bandwidth), run by :mod:`~scaletrain.bench.comm_worker`.
- :mod:`~scaletrain.bench.workloads`: built-in models on synthetic data (cnn, resnet, gpt).
- :mod:`~scaletrain.bench.scaling`: runs a workload at several sizes through the launcher,
  and :mod:`~scaletrain.bench.report` writes ``scaling.json``, a PNG plot and an HTML report.
- :mod:`~scaletrain.bench.explain`: ``plan --explain``, the scaling model's advice from a
  ``scaling.json`` (read by its writer's reader), a run folder's summary or the published default.
- :mod:`~scaletrain.bench.scaling_slurm`: the same at several node counts, one Slurm job per
  size (planned by :mod:`scaletrain.plan`, submitted through :mod:`scaletrain.slurm`).

Importing this package imports no torch; the workers do.
"""
