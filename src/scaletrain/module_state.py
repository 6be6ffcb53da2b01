"""Module-level state, registered where it is defined.

A few modules keep state for the life of the process: the runtime's set-up (``init()``), the
stop handlers and their listeners, the checkpoint's own process group, the error hook and the
hook it replaced, the lean exit's flags, caches and warn-once sets. Each such global is declared
here by the module that defines it, right below its definition::

    _ENV: DistEnv | None = None
    module_state.register(__name__, "_ENV", leak=True)

The test suite's hygiene fixture (``tests/conftest.py``) reads :func:`registered` to put every
one back after each test, so no hand-kept list can miss a new one; a test
(``tests/unit/test_module_state_registry.py``) finds every module global a function rebinds or
mutates and fails when one is not registered. Nothing here imports anything: any module may call it.
"""

from __future__ import annotations

from typing import NamedTuple


class State(NamedTuple):
    """One registered global: where, and how a test that changes it is treated."""

    module: str
    name: str
    leak: bool    # a change left by a test is a failure (the runtime left set up), not only reset
    reset: bool   # put back after each test; False: a once-per-process fact (an atexit hook registered)


_REGISTERED: dict[tuple[str, str], State] = {}


def register(module: str, *names: str, leak: bool = False, reset: bool = True) -> None:
    """Declare ``module``'s globals ``names`` as state (call it right below their definitions)."""
    for name in names:
        _REGISTERED[(module, name)] = State(module=module, name=name, leak=leak, reset=reset)


def registered() -> list[State]:
    """Every global registered so far (by the modules imported so far), in registration order."""
    return list(_REGISTERED.values())


__all__ = ["State", "register", "registered"]
