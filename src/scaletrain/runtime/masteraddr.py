"""Before a rendezvous: the rendezvous host must resolve, and a rendezvous must end.

A typo in ``MASTER_ADDR`` does not fail fast in torch: rank 0 hosts the store on every
interface and the others retry the unknown name until the start-up timeout (30 minutes).
:func:`resolve_or_fail` resolves the name first, retrying for a short bounded time (DNS at job
start can be slow on a cluster), then stops with one line naming the variable.

:func:`rendezvous_target` reads the address and port a call to ``init_process_group`` will
use, so a rendezvous that never completes can be reported with them
(:mod:`scaletrain.launch.inproc.rendezvous`). Pure standard library; no torch.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from scaletrain.contract.environ import RESOLVE_WAIT_VAR
from scaletrain.errors import DistEnvError

# Seconds to keep retrying a name that does not resolve (SCALETRAIN_RESOLVE_TIMEOUT overrides).
RESOLVE_WAIT_S = 15.0
_RETRY_EVERY_S = 1.0


@dataclass(frozen=True)
class Target:
    """Where a rendezvous meets: ``host:port``, and the setting that named the host."""

    host: str
    port: str
    origin: str  # "MASTER_ADDR", "--master-addr" or "init_method"


def rendezvous_target(init_method: str | None, environ: Mapping[str, str]) -> Target | None:
    """The host and port ``init_process_group(init_method=...)`` meets at; None for a file://
    rendezvous, an explicit store, or when the variables are missing."""
    method = init_method or "env://"
    if method.startswith("env://"):
        host, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
        return Target(host, port, "MASTER_ADDR") if host else None
    if method.startswith("tcp://"):
        parts = urlsplit(method)
        if parts.hostname:
            return Target(parts.hostname, str(parts.port or ""), "init_method")
    return None


def wait_limit(environ: Mapping[str, str]) -> float:
    """How long to retry an unresolvable name: RESOLVE_WAIT_S or the variable's seconds."""
    text = environ.get(RESOLVE_WAIT_VAR, "")
    try:
        value = float(text)
    except ValueError:
        return RESOLVE_WAIT_S
    return value if 0 <= value <= 3600 else RESOLVE_WAIT_S


def resolve_or_fail(target: Target, *, rank: object, wait_s: float = RESOLVE_WAIT_S,
                    resolve: Callable[[str], object] | None = None,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> None:
    """Return once ``target.host`` resolves; after ``wait_s`` seconds of failures, raise
    DistEnvError naming the setting (``MASTER_ADDR`` or ``init_method``) and the name.
    ``rank``: the process's rank for the message, None for the launcher."""
    lookup = resolve or (lambda host: socket.getaddrinfo(host, None))
    deadline = clock() + wait_s
    while True:
        try:
            lookup(target.host)
            return
        except (OSError, UnicodeError) as exc:
            why = str(exc)
        if clock() >= deadline:
            break
        sleep(min(_RETRY_EVERY_S, max(0.0, deadline - clock())))
    where = {"MASTER_ADDR": f"MASTER_ADDR={target.host!r}",
             "--master-addr": f"--master-addr {target.host!r}"}.get(
                 target.origin, f"the init_method host {target.host!r}")
    who = f"rank {rank}: " if rank is not None else ""
    raise DistEnvError(
        f"{who}{where} does not resolve (tried for {wait_s:g} s: {why})",
        "check the spelling; in a batch script take the first host of "
        "$SLURM_JOB_NODELIST (scontrol show hostnames), or let scaletrain set it")
