"""Inside the workers of ``scaletrain run``: a program's own rendezvous resolves and ends.

Three ways a program written for another launcher hangs silently under ours:

- it starts its own workers with ``torch.multiprocessing.spawn`` (the PyTorch DDP tutorial's
  form) while ``scaletrain run`` already started several: every copy spawns its own group and
  they all meet at the same hard-coded port, where they wait the 30-minute start-up timeout.
  :func:`patch_multiprocessing` says so when it happens;
- a rendezvous whose host does not resolve (a typo in ``MASTER_ADDR``) or that never
  completes. :func:`patch_c10d` resolves the host first (:mod:`scaletrain.runtime.masteraddr`)
  and bounds ``init_process_group``: after :data:`RENDEZVOUS_WAIT_S` (or
  ``SCALETRAIN_RENDEZVOUS_TIMEOUT`` seconds) the process stops with one line naming the address
  and the port. All workers of a local run start together, so a rendezvous among them that
  takes minutes is a hang, not a slow start. The bound holds at every world size, 1 included;
- a program that meets at a port of its own (``mp.spawn`` under ``--nproc-per-node 1``) while the
  worker's environment says to use the agent's store: :func:`own_store` lets its rank 0 host it.

The scaletrain modules these wrappers need are imported when they run, never at start-up: the
worker entry's error classes are then the ones raised.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from types import ModuleType
from typing import Any

from scaletrain.contract.environ import AGENT_PORT_VAR, NESTED_VAR, RENDEZVOUS_WAIT_VAR

RENDEZVOUS_WAIT_S = 300.0
_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
EXIT_RENDEZVOUS = 3  # a DistEnvError's exit code: the environment, not the program


def rendezvous_wait(environ: Any = os.environ) -> float:
    """Seconds a rendezvous may take before the process stops with a message."""
    try:
        value = float(environ.get(RENDEZVOUS_WAIT_VAR, ""))
    except ValueError:
        return RENDEZVOUS_WAIT_S
    return value if value > 0 else RENDEZVOUS_WAIT_S


def _who(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[object, object]:
    """(rank, world size) as passed to init_process_group, else as the environment says.

    Its positional order: backend, init_method, timeout, world_size, rank, store.
    """
    rank = kwargs.get("rank", args[4] if len(args) > 4 else -1)
    world = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
    if rank in (-1, None):
        rank = os.environ.get("RANK", "?")
    if world in (-1, None):
        world = os.environ.get("WORLD_SIZE", "?")
    return rank, world


def _collision() -> str:
    """The cause to name when this process's workers were spawned by one of several copies."""
    if os.environ.get(NESTED_VAR) != "1":
        return ""
    return (" - the program spawned its own workers under a launcher that had started "
            "several, and the copies collide there")


def _port_taken(exc: BaseException, where: str, rank: object) -> None:
    """A rendezvous whose port another copy of the program hosts already: one line, not the
    store's traceback (its EADDRINUSE blames nobody)."""
    cause = _collision()
    if cause and "EADDRINUSE" in str(exc):
        print(f"scaletrain: error: rank {rank}: the rendezvous at {where} is hosted already"
              f"{cause}\n  HINT: run it with 'scaletrain run --nproc-per-node 1', or drop "
              "mp.spawn and read RANK, LOCAL_RANK and WORLD_SIZE from the environment",
              file=sys.stderr, flush=True)
        os._exit(EXIT_RENDEZVOUS)


def _watchdog(where: str, rank: object, world: object, wait_s: float) -> threading.Event:
    """Stop this process with one line unless the returned event is set within ``wait_s``."""
    done = threading.Event()
    cause = _collision()

    def watch() -> None:
        if done.wait(wait_s):
            return
        print(f"scaletrain: error: rank {rank}: the rendezvous at {where} did not complete within "
              f"{wait_s:g} s ({world} processes expected){cause}\n  HINT: check that every "
              "process uses the same address and port and that only one group uses that port; "
              f"raise {RENDEZVOUS_WAIT_VAR} for a slow start", file=sys.stderr, flush=True)
        os._exit(EXIT_RENDEZVOUS)

    threading.Thread(target=watch, name="scaletrain-rendezvous-watchdog", daemon=True).start()
    return done


def _masteraddr() -> tuple[Any, Any, Any]:
    """scaletrain.runtime.masteraddr's functions, leaving no scaletrain module imported that the
    program did not import itself (a plain torchrun program must not find our runtime loaded;
    the error classes are the worker entry's, already imported)."""
    before = {name for name in sys.modules if name.startswith("scaletrain")}
    from scaletrain.runtime import masteraddr

    for name in [n for n in sys.modules if n.startswith("scaletrain") and n not in before]:
        del sys.modules[name]
    return masteraddr.rendezvous_target, masteraddr.resolve_or_fail, masteraddr.wait_limit


def _on_emulated_node(host: str) -> bool:
    from scaletrain.contract.environ import EMULATE_VAR
    from scaletrain.launch.inproc.emulate import is_emulated_host

    return bool(os.environ.get(EMULATE_VAR)) and is_emulated_host(host)


def _to_loopback(origin: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A rendezvous at an emulated node's name (``--emulate slurm --nnodes 2``: the program took
    the first host of SLURM_JOB_NODELIST) meets on this machine's loopback instead."""
    if origin == "MASTER_ADDR":
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        return args, kwargs
    method = str(kwargs.get("init_method", args[1] if len(args) > 1 else ""))
    port = method.rpartition(":")[2]
    loopback = f"tcp://127.0.0.1:{port}"
    if "init_method" in kwargs:
        return args, {**kwargs, "init_method": loopback}
    return (args[0], loopback, *args[2:]), kwargs


def remember_agent_store(environ: Any = os.environ) -> None:
    """In a worker the agent started: note its store's port, unless a parent worker did."""
    if environ.get(_USE_AGENT_STORE) == "True" and environ.get("MASTER_PORT"):
        environ.setdefault(AGENT_PORT_VAR, environ["MASTER_PORT"])


def own_store(port: str, environ: Any = os.environ) -> None:
    """A rendezvous at a port other than the agent's is the program's own (``mp.spawn`` with a
    port of its choice, under ``--nproc-per-node 1``): its rank 0 must host the store there.
    torch would make every rank a client of a store nobody hosts, inherited from the worker's
    ``TORCHELASTIC_USE_AGENT_STORE``, and wait its 30-minute timeout."""
    if environ.get(_USE_AGENT_STORE) == "True" and port != environ.get(AGENT_PORT_VAR, port):
        environ[_USE_AGENT_STORE] = "False"


def patch_c10d(c10d: ModuleType) -> None:
    """Wrap ``init_process_group``: resolve its host first, and bound the rendezvous."""
    original = getattr(c10d, "init_process_group")

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        rendezvous_target, resolve_or_fail, wait_limit = _masteraddr()
        rank, world = _who(args, kwargs)
        init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
        store = kwargs.get("store", args[5] if len(args) > 5 else None)
        target = None if store is not None else rendezvous_target(init_method, os.environ)
        if target is None:
            return original(*args, **kwargs)
        own_store(target.port)
        if _on_emulated_node(target.host):
            args, kwargs = _to_loopback(target.origin, args, kwargs)
            target = rendezvous_target(kwargs.get("init_method", args[1] if len(args) > 1
                                                  else None), os.environ) or target
        resolve_or_fail(target, rank=rank, wait_s=wait_limit(os.environ))
        where = f"{target.host}:{target.port}"
        done = _watchdog(where, rank, world, rendezvous_wait())
        try:
            return original(*args, **kwargs)
        except Exception as exc:
            _port_taken(exc, where, rank)
            raise
        finally:
            done.set()

    setattr(c10d, "init_process_group", init_process_group)


def patch_multiprocessing(spawn_module: ModuleType, launcher_world: str, rank: str) -> None:
    """``torch.multiprocessing.spawn``/``start_processes`` under a launcher of several workers:
    say so once, and mark the spawned workers so a rendezvous of theirs names the collision."""
    if not launcher_world.isdigit() or int(launcher_world) <= 1:
        return
    said: list[bool] = []

    def wrap(name: str) -> None:
        original = getattr(spawn_module, name, None)
        if original is None:
            return

        @functools.wraps(original)
        def spawning(*args: Any, **kwargs: Any) -> Any:
            nprocs = kwargs.get("nprocs", args[2] if len(args) > 2 else 1)
            if not said and os.environ.get(NESTED_VAR) != "1":
                said.append(True)
                print(f"scaletrain: WARNING: rank {rank}: the program starts {nprocs} workers of "
                      f"its own (torch.multiprocessing.{name}) and scaletrain run started "
                      f"{launcher_world} already: each copy forms its own group, and copies "
                      "that share a port collide\n  HINT: run it with 'scaletrain run "
                      "--nproc-per-node 1', or drop mp.spawn and read RANK, LOCAL_RANK and "
                      "WORLD_SIZE from the environment", file=sys.stderr, flush=True)
            os.environ[NESTED_VAR] = "1"  # inherited by the processes it starts
            return original(*args, **kwargs)

        setattr(spawn_module, name, spawning)

    wrap("spawn")
    wrap("start_processes")
    package = sys.modules.get("torch.multiprocessing")
    if package is not None:
        for name in ("spawn", "start_processes"):
            if hasattr(package, name):
                setattr(package, name, getattr(spawn_module, name))
