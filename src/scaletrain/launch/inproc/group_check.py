"""Never silently alone: did the workers of a run form one process group of all of them?

An Accelerate program on CPU without its CPU setting, a Lightning Trainer not told how many
processes there are, an example that skips ``init_process_group`` when it sees no GPU: each
worker then trains alone (world size 1), and the run exits 0 - N independent trainings, found
out after the GPU hours are spent. No launcher tells; ``scaletrain run`` does.

Worker side (through the worker shim): ``init_process_group`` is wrapped to record the group's
size as soon as it is formed (so a program that destroys its group early still counts), the
first optimizer step is recorded (a worker that stepped outside a group of all trained alone,
even when it crashed later), and at exit each worker records which frameworks it had imported.
Launcher side: :func:`verdict` reads those records once the workers have finished and returns
a warning, or None when every worker joined one group of the run's size.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from scaletrain.fileio import atomic_write

# Framework modules worth naming in the warning, and the setting that usually causes it.
FRAMEWORK_HINTS: dict[str, str] = {
    "accelerate": "Accelerate on CPU needs its CPU setting ('accelerate launch --cpu', "
                  "'use_cpu: true' in the config, or Accelerator(cpu=True)); without it each "
                  "process runs alone",
    "lightning": "Lightning starts its own processes unless the Trainer matches the launcher: "
                 "Trainer(devices=<workers per node>, num_nodes=<nodes>, strategy='ddp')",
    "pytorch_lightning": "Lightning starts its own processes unless the Trainer matches the "
                         "launcher: Trainer(devices=<workers per node>, num_nodes=<nodes>, "
                         "strategy='ddp')",
    "deepspeed": "DeepSpeed needs deepspeed.init_distributed() (or deepspeed.initialize) in "
                 "every process",
    "horovod": "Horovod forms its group through MPI: start it with mpirun or srun, not "
               "scaletrain run",
}
_GENERIC_HINT = ("the program may skip torch.distributed when it sees no GPU "
                 "(try 'scaletrain run --cpu' for a CPU smoke test), or call "
                 "init_process_group only under a launcher it recognises")
# Under --cpu the GPU checks already pass: suggesting --cpu again would send users in a circle.
_GENERIC_HINT_CPU = ("the program calls init_process_group only under a launcher it "
                     "recognises, or skips it on a path the CPU smoke test does not cover: look "
                     "for the condition around its init_process_group call")

_STATE: dict[str, Any] = {}


def start_recording(folder: str, rank: str) -> None:
    """Worker side: remember where to record, and record the frameworks at exit."""
    _STATE.update(folder=folder, rank=rank, world=None)
    atexit.register(_record_exit)


def _write(kind: str, payload: dict[str, Any]) -> None:
    folder = _STATE.get("folder")
    if not folder:
        return
    path = Path(folder) / f"{kind}-rank{_STATE['rank']}-pid{os.getpid()}.json"
    try:
        atomic_write(path, json.dumps(payload))
    except OSError:  # the launcher's folder is gone (it stopped): nothing to tell it
        pass


def _record_group(dist: ModuleType) -> None:
    try:
        world = int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a record must never break the program
        return
    _STATE["world"] = world
    _write("group", {"rank": _STATE.get("rank"), "world_size": world})


def patch_optimizer(optimizer: ModuleType) -> None:  # torch.optim.optimizer
    """Record the worker's first optimizer step, then stop listening (a global hook of torch's,
    removed at once: the steps after the first cost nothing)."""
    register = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if register is None:  # feature test: torch without global optimizer hooks
        return
    handles: list[Any] = []

    def first_step(*_: Any) -> None:
        for handle in handles:
            handle.remove()
        handles.clear()
        _write("step", {"rank": _STATE.get("rank"), "world_size": _STATE.get("world")})

    handles.append(register(first_step))


def _framework_worlds() -> dict[str, int]:
    """The process count a framework itself trained with, where it can be read.

    Accelerate forms a torch group of all workers and still trains each one alone
    (``DistributedType.NO``, ``num_processes == 1``) when its CPU setting is missing on a
    machine without GPUs: the torch group alone does not show it.
    """
    out: dict[str, int] = {}
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    if isinstance(shared, dict) and isinstance(shared.get("num_processes"), int):
        out["accelerate"] = shared["num_processes"]
    return out


def _record_exit() -> None:
    found = sorted(name for name in FRAMEWORK_HINTS if name in sys.modules)
    _write("exit", {"rank": _STATE.get("rank"), "frameworks": found,
                    "world_size": _STATE.get("world"), "framework_worlds": _framework_worlds()})


def patch_c10d(c10d: Any) -> None:  # torch.distributed.distributed_c10d, patched
    """Wrap ``init_process_group`` in torch.distributed.distributed_c10d to record the size."""
    original = getattr(c10d, "init_process_group")
    if getattr(original, "_scaletrain_recorded", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _record_group(c10d)
        return result

    setattr(init_process_group, "_scaletrain_recorded", True)
    setattr(c10d, "init_process_group", init_process_group)


@dataclass(frozen=True, kw_only=True)
class Records:
    """What the workers of one node recorded."""

    groups: dict[str, int]              # launcher rank -> size of the group it formed
    exited: set[str]                    # launcher ranks that reached a normal exit
    stepped: set[str]                   # launcher ranks that took an optimizer step
    frameworks: set[str]
    framework_worlds: dict[str, dict[str, int]]  # launcher rank -> {framework: its process count}


def read_records(folder: str | os.PathLike[str]) -> Records:
    """Collect the workers' records (unreadable ones are skipped)."""
    groups: dict[str, int] = {}
    exited: set[str] = set()
    stepped: set[str] = set()
    frameworks: set[str] = set()
    framework_worlds: dict[str, dict[str, int]] = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        rank = str(data.get("rank"))
        if path.name.startswith("group-") and isinstance(data.get("world_size"), int):
            groups[rank] = max(groups.get(rank, 0), data["world_size"])
        elif path.name.startswith("step-"):
            stepped.add(rank)
        elif path.name.startswith("exit-"):
            exited.add(rank)
            frameworks.update(str(f) for f in data.get("frameworks", ()))
            worlds = data.get("framework_worlds") or {}
            framework_worlds[rank] = {str(k): v for k, v in worlds.items() if isinstance(v, int)}
    return Records(groups=groups, exited=exited, stepped=stepped, frameworks=frameworks,
                   framework_worlds=framework_worlds)


def verdict(records: Records, *, expected_world: int, local_ranks: list[str],
            cpu: bool = False, crashed: bool = False) -> str | None:
    """The warning to print when this node's workers did not all join one group of
    ``expected_world`` processes; None when they did (or there is nothing to judge).

    ``cpu``: the run was ``--cpu`` (the hint does not suggest it again). ``crashed``: the
    workers failed; then only evidence that they trained alone (a smaller group, a framework
    that counted fewer processes, an optimizer step outside any group) speaks - a worker that
    crashed before it reached ``init_process_group`` is the failure report's business, not a
    lone worker.
    """
    if expected_world <= 1 or not local_ranks:
        return None
    alone_in = sorted({name for r in local_ranks
                       for name, n in records.framework_worlds.get(r, {}).items()
                       if n != expected_world})
    joined = [r for r in local_ranks if records.groups.get(r) == expected_world]
    if len(joined) == len(local_ranks) and not alone_in:
        return None
    never = [r for r in local_ranks if r not in records.groups]
    smaller = sorted({records.groups[r] for r in local_ranks if r in records.groups
                      and records.groups[r] != expected_world})
    stepped_alone = [r for r in never if r in records.stepped]
    if crashed and not (smaller or alone_in or stepped_alone):
        return None
    parts = []
    if never:
        steps = (f", {len(stepped_alone)} of them took optimizer steps"
                 if crashed and stepped_alone else "")
        parts.append(f"{len(never)} of {len(local_ranks)} never started torch.distributed{steps}")
    if smaller:
        sizes = ", ".join(str(s) for s in smaller)
        parts.append(f"some formed groups of size {sizes} instead of {expected_world}")
    for name in alone_in:
        counts = sorted({records.framework_worlds[r][name] for r in local_ranks
                         if name in records.framework_worlds.get(r, {})})
        parts.append(f"{name} trained with {', '.join(map(str, counts))} process(es) instead of "
                     f"{expected_world}")
    blamed = alone_in or sorted(records.frameworks)
    hints = [FRAMEWORK_HINTS[f] for f in blamed if f in FRAMEWORK_HINTS]
    hint = "; ".join(dict.fromkeys(hints)) if hints else (_GENERIC_HINT_CPU if cpu
                                                            else _GENERIC_HINT)
    then = " before they failed" if crashed else ""
    return (f"the {expected_world} workers did not form one process group{then} "
            f"({'; '.join(parts)}): each trained on its own, not together.\nHINT: {hint}")
