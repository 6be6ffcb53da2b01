"""The facts that two sides of scaletrain must agree on, one module per audience.

- :mod:`~scaletrain.contract.environ`: between a launcher (``scaletrain run``, a generated
  script) and the processes it starts: the ``SCALETRAIN_*`` variables and their values' formats,
  the port formula, the stop signals and the exit code of a process that stopped on purpose.
- :mod:`~scaletrain.contract.files`: the file names of a run folder and a checkpoint folder.
- :mod:`~scaletrain.contract.script`: the words of a generated script read back by another verb
  (the provenance header, the trap) or filled in by the job (a here-document's end, a placeholder).

Leaf modules: they import nothing of scaletrain but each other, and nothing is re-exported here,
so an import names the audience it serves.
"""
