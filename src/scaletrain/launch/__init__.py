"""Local launch: `scaletrain run`, built on torch's elastic agent.

Modules: ``spec`` (request -> validated ``LaunchPlan``, pure), ``gpus`` (visible GPU count
without torch), ``threads`` (CPU threads per worker), ``ports`` (fixed-port checks),
``output`` (rank prefixes, ``--ranks 0``, captured stderr), ``failure`` (the error for a failed
worker), ``mps`` (CUDA MPS daemon for ``--procs-per-gpu``), ``local`` (runs a plan with
``elastic_launch``). Failures: ``worker`` (the entry every worker runs: dies with its agent,
ScaletrainErrors as records, timeout diagnosis), ``hang`` (stacks on request, who did not
arrive), ``rundir`` (the run folder both sides share), ``supervise`` (restart policy and the
agent/process-context hooks). Speed: ``agent_speed`` (slow spots of torch's agent) and ``lean``
(the launcher process's collector and exit). Nothing here imports torch at import time.
"""
