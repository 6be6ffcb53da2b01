"""Local launch: `scaletrain run`, built on torch's elastic agent.

This folder is the launcher's side (the agent's process); the code that runs inside the
user's own processes, the workers, is the :mod:`scaletrain.launch.inproc` room, and
``worker`` here is only its command-line entry (``python -m scaletrain.launch.worker``).

Modules: ``spec`` (request -> validated ``LaunchPlan``, pure), ``gpus`` (visible GPU count
without torch), ``threads`` (CPU threads per worker), ``ports`` (fixed-port checks),
``output`` (rank prefixes, ``--ranks 0``, captured stderr), ``failure`` (the error for a failed
worker), ``crash`` (a native crash's stack), ``mps`` (CUDA MPS daemon for ``--procs-per-gpu``),
``local`` (runs a plan with ``elastic_launch``), ``signals`` (stop signals passed on),
``reaper`` (every descendant ends with the run), ``group_check`` (did the workers form one
process group), ``rundir`` (the run folder both sides share),
``frames`` (whose code a frame runs, both sides), ``supervise`` (restart policy and the
agent/process-context hooks). ``patches``: every patch of torch's internals, each beside the
feature test that guards it; ``lean``: the launcher process's collector and exit.
Nothing here imports torch at import time.
"""
