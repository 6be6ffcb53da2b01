"""The Env of this process's live :func:`scaletrain.init`, where every module can read it.

``init()`` records its Env here and ``shutdown()`` clears it; :mod:`scaletrain.runtime.current`
(who am I) reads it without importing ``init`` - which imports the error hook, the timeouts and
the stop path that themselves ask ``current``: with this module between them the runtime's
imports form no circle. Nothing here imports torch.
"""

from __future__ import annotations

from scaletrain import module_state
from scaletrain.runtime.env import Env

_ENV: Env | None = None
module_state.register(__name__, "_ENV", leak=True)


def get() -> Env | None:
    """The Env of the last successful ``init()``, or None before it and after ``shutdown()``."""
    return _ENV


def record(env: Env | None) -> None:
    """Set (``init()``) or clear (``shutdown()``) the process's Env."""
    global _ENV
    _ENV = env
