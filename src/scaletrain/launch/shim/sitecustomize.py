"""Loaded by Python at start-up in the workers of ``scaletrain run`` (and only there).

``scaletrain run`` puts this folder first on its workers' PYTHONPATH; Python imports
``sitecustomize`` from it before the program runs. It hands over to
:mod:`scaletrain.launch.worker_shim` (which reads what the launcher asked for from
``SCALETRAIN_*`` variables), then runs the next ``sitecustomize`` on the path, if any, so a
site's own customisation still happens. Nothing here imports torch.
"""

import os
import sys


def _next_sitecustomize() -> None:
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.curdir)
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location("_scaletrain_next_sitecustomize", candidate)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        return


try:
    from scaletrain.launch.worker_shim import activate
except ImportError:  # scaletrain not importable in this interpreter: leave the program alone
    pass
else:
    activate()
_next_sitecustomize()
