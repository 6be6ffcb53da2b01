"""Loaded by Python at start-up in the workers of ``scaletrain run`` (and only there).

``scaletrain run`` puts this folder first on its workers' PYTHONPATH; Python imports
``sitecustomize`` from it before the program runs. It hands over to
:mod:`scaletrain.launch.inproc.worker_shim` (which reads what the launcher asked for from
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


def _activate() -> None:
    """Run the shim, then take the scaletrain modules it loaded out of ``sys.modules``.

    A plain torchrun program must not find scaletrain imported behind its back; the shim's
    hooks keep working from their own module objects, and a program that imports scaletrain
    itself gets it as usual.
    """
    before = {name for name in sys.modules if name == "scaletrain" or name.startswith("scaletrain.")}
    try:
        from scaletrain.launch.inproc.worker_shim import activate
    except ImportError:  # scaletrain not importable in this interpreter: leave the program alone
        return
    try:
        activate()
    finally:
        for name in [n for n in sys.modules if n == "scaletrain" or n.startswith("scaletrain.")]:
            if name not in before:
                del sys.modules[name]


_activate()
_next_sitecustomize()
