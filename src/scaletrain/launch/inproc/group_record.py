"""Each worker's record of the process group it formed, for the launcher's check that the
workers of a run formed one group of all of them (:mod:`scaletrain.launch.group_check`).

Worker side (through the worker shim): ``init_process_group`` is wrapped to record the group's
size as soon as it is formed (so a program that destroys its group early still counts), the
first optimizer step is recorded (a worker that stepped outside a group of all trained alone,
even when it crashed later), and at exit each worker records which frameworks it had imported
and whether its program's own files name any call that forms a group.
The records' format is declared once, here: :func:`read_records` is what the launcher reads
them with once the workers have finished.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from scaletrain import module_state
from scaletrain.fileio import atomic_write, read_bounded, read_json

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
    "horovod": "Horovod forms its group through MPI: start it with mpirun or srun, or with "
               "'scaletrain run --emulate mpi' (Horovod's Gloo rendezvous)",
}
_STATE: dict[str, Any] = {}
module_state.register(__name__, "_STATE")


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
        atomic_write(path, json.dumps(payload, allow_nan=False))
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


# What a program that forms a group names somewhere in its code: torch's calls, scaletrain's
# own set-up, DeepSpeed's, Horovod's. A program none of whose files names any of them is a
# single-process program (the launcher's hint then says so, not "look for its call").
_GROUP_WORDS = (b"init_process_group", b"init_device_mesh", b"DeviceMesh", b"scaletrain",
                b"init_distributed", b"deepspeed.initialize", b"hvd.init", b"Horovod")
_MAX_SCANNED = 64            # program files read at exit, at most
_SCAN_LIMIT = 1 << 20        # bytes of each


def _program_files() -> list[str]:
    """The program's own files: its main script and the modules it imported from its folders."""
    from scaletrain.launch.frames import is_program_file

    files = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    files.add(_main_file())   # run by runpy, whose __main__ is gone from sys.modules by exit
    # absolute paths of files that exist: torch.ops and torch.classes name "_ops.py", "_classes.py"
    return sorted(f for f in files if isinstance(f, str) and f.endswith(".py") and os.path.isabs(f)
                  and os.path.isfile(f) and is_program_file(f))


def names_a_group(files: list[str]) -> bool:
    """Whether one of ``files`` names a call that forms a process group; True where one
    cannot be read, or there are none (not said to lack one)."""
    for path in files[:_MAX_SCANNED]:
        try:
            text = read_bounded(path, _SCAN_LIMIT)
        except OSError:
            return True
        if any(word in text for word in _GROUP_WORDS):
            return True
    return not files


def _main_file() -> str | None:
    """The program's main file: the worker entry leaves ``sys.argv[0]`` the script (or, under
    ``-m``, the module's name)."""
    first = sys.argv[0] if sys.argv else ""
    if first.endswith(".py"):
        return os.path.abspath(first)
    try:
        import importlib.util

        spec = importlib.util.find_spec(first) if first.isidentifier() or "." in first else None
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _record_exit() -> None:
    found = sorted(name for name in FRAMEWORK_HINTS if name in sys.modules)
    _write("exit", {"rank": _STATE.get("rank"), "frameworks": found,
                    "world_size": _STATE.get("world"), "framework_worlds": _framework_worlds(),
                    "names_group": names_a_group(_program_files())})


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
    destroy = getattr(c10d, "destroy_process_group", None)
    if callable(destroy):
        setattr(c10d, "destroy_process_group", _recording_teardown(destroy))


def _recording_teardown(destroy: Any) -> Any:
    """``destroy_process_group`` of the default group, after recording that this worker's
    training is over (the launcher's teardown watch, launch/teardown.py) and letting gloo's
    worker threads go idle.

    Why the wait: right after the last step a gloo thread may still be dropping its last
    work, which takes the GIL to free the tensors' Python objects (runtime/settle.py). torch's
    shutdown of the group waits for its threads while the main thread holds the GIL: a
    deadlock when it comes first (the teardown hang of issue 39). The wait releases the GIL
    until every gloo thread sleeps, at most a few seconds.
    """

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if (args[0] if args else kwargs.get("group")) is None:
            _write("teardown", {"rank": _STATE.get("rank"), "pid": os.getpid()})
            from scaletrain.runtime import settle  # torch-free; imported only when used

            settle.settle_gloo_workers()
        return destroy(*args, **kwargs)

    return destroy_process_group


def patch_horovod(hvd: Any) -> None:  # horovod.torch
    """Wrap ``hvd.init`` to record Horovod's world as the worker's group (it forms its own, not
    torch.distributed's)."""
    original = getattr(hvd, "init", None)
    if original is None or getattr(original, "_scaletrain_recorded", False):
        return

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            world = int(hvd.size())
        except Exception:  # noqa: BLE001 - a record must never break the program
            return result
        _STATE["world"] = world
        _write("group", {"rank": _STATE.get("rank"), "world_size": world})
        return result

    setattr(init, "_scaletrain_recorded", True)
    setattr(hvd, "init", init)


@dataclass(frozen=True, kw_only=True)
class Records:
    """What the workers of one node recorded."""

    groups: dict[str, int]              # launcher rank -> size of the group it formed
    exited: set[str]                    # launcher ranks that reached a normal exit
    stepped: set[str]                   # launcher ranks that took an optimizer step
    frameworks: set[str]
    framework_worlds: dict[str, dict[str, int]]  # launcher rank -> {framework: its process count}
    torn_down: set[int] = field(default_factory=set)  # pids that called destroy_process_group()
    no_group_call: set[str] = field(default_factory=set)  # ranks whose program never names one


def read_records(folder: str | os.PathLike[str]) -> Records:
    """Collect the workers' records (unreadable ones are skipped)."""
    groups: dict[str, int] = {}
    exited: set[str] = set()
    stepped: set[str] = set()
    frameworks: set[str] = set()
    framework_worlds: dict[str, dict[str, int]] = {}
    torn_down: set[int] = set()
    no_group_call: set[str] = set()
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = read_json(path)
        except (OSError, ValueError):
            continue
        rank = str(data.get("rank"))
        if path.name.startswith("group-") and isinstance(data.get("world_size"), int):
            groups[rank] = max(groups.get(rank, 0), data["world_size"])
        elif path.name.startswith("step-"):
            stepped.add(rank)
        elif path.name.startswith("teardown-") and isinstance(data.get("pid"), int):
            torn_down.add(data["pid"])
        elif path.name.startswith("exit-"):
            exited.add(rank)
            frameworks.update(str(f) for f in data.get("frameworks", ()))
            worlds = data.get("framework_worlds") or {}
            framework_worlds[rank] = {str(k): v for k, v in worlds.items() if isinstance(v, int)}
            if data.get("names_group") is False:
                no_group_call.add(rank)
    return Records(groups=groups, exited=exited, stepped=stepped, frameworks=frameworks,
                   framework_worlds=framework_worlds, torn_down=torn_down,
                   no_group_call=no_group_call)
