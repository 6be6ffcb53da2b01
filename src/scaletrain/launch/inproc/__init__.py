"""The code of `scaletrain run` that runs inside the user's own processes (its workers).

Everything else in :mod:`scaletrain.launch` runs in the launcher: the elastic agent's process.
What is here is loaded into the program being trained - by the worker entry
(``python -m scaletrain.launch.worker`` hands over to :mod:`.worker`) and by the
``sitecustomize`` in ``shim/``, which the launcher puts on its workers' PYTHONPATH only and
which activates :mod:`.worker_shim` - so it keeps to stricter rules than the agent's side:
it never imports torch itself (the shim patches torch when the program imports it), loads as
little of scaletrain as it can, and imports nothing of the agent's side; of ``launch`` it uses
only the two modules both sides share, :mod:`~scaletrain.launch.rundir` (the run folder) and
:mod:`~scaletrain.launch.frames` (whose code a frame runs).

A sub-package rather than a sibling of ``launch``: nothing else starts this code, the launcher
imports the few names it needs to start and read its workers (``worker.worker_args``,
``worker_shim.launcher_env``, ``emulate.MODES``, ``cpu_smoke.BANNER``, ``hang.diagnose_dead``,
``group_record.read_records``), and `scaletrain run` stays one folder.

Modules: ``worker`` (the entry: dies with its agent, ScaletrainErrors as records, timeout
diagnosis), ``worker_shim`` (what runs before the program's first line), ``hang`` (stacks on
request, who did not arrive), ``rendezvous`` (the program's own rendezvous resolves and ends),
``group_record`` (each worker's process-group records; the launcher judges them in
``launch.group_check``),
``emulate`` (srun's or mpirun's variables), ``cpu_smoke``/``cpu_cuda``/``cpu_map`` (``--cpu``:
a CUDA/NCCL program on CPU processes).
"""
