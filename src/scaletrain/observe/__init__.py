"""Observability: is every GPU earning its keep?

- :class:`~scaletrain.observe.monitor.Monitor` measures each training step (time, throughput,
  data wait, peak memory, model FLOP utilisation) and writes it to sinks: a console line, a
  JSONL file per run, TensorBoard event files (optional extra) and a final summary.
- :mod:`~scaletrain.observe.devices` samples GPU utilisation, memory and power off the step path
  (NVML, AMD SMI; "unavailable" elsewhere, never a crash).
- :mod:`~scaletrain.observe.health` names stragglers and idle devices from cross-rank statistics.
- :mod:`~scaletrain.observe.scaling` predicts step time and efficiency at N GPUs from one
  measured step and a cluster profile's bandwidths, with :mod:`~scaletrain.observe.overhead`'s
  cost of running distributed (calibrated by a 2-process run, else a published default and its
  range); :mod:`scaletrain.bench.explain` turns it and a ``scaling.json`` into advice for
  ``scaletrain plan --explain``.
- :mod:`~scaletrain.observe.monitorfiles` reads the Monitor's ``metrics.jsonl`` and ``summary.json``
  back, and :mod:`~scaletrain.observe.nodesampler` its own ``gpus-<host>.jsonl``: the after-submit
  verbs call these readers rather than parse the files themselves.
- :mod:`~scaletrain.observe.doctor` checks an environment or allocation for a bug report.

Importing this package imports neither torch nor any optional extra.
"""
