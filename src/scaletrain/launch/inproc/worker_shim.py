"""What ``scaletrain run`` does inside each worker before the program's first line.

Activated by the ``sitecustomize`` in :mod:`scaletrain.launch.inproc.shim`, which the launcher puts on
its workers' PYTHONPATH only (the user's environment is never changed). It reads what the
launcher asked for from ``SCALETRAIN_*`` variables (:mod:`scaletrain.contract.environ`):

- ``SCALETRAIN_GROUP_RECORD``: record the process group each worker forms, so the launcher can
  say when N workers finished without ever forming one group of N (:mod:`group_record`);
- ``SCALETRAIN_EMULATE``: give the worker srun's or mpirun's variables (:mod:`emulate`);
- ``SCALETRAIN_CPU_SMOKE``: run a CUDA/NCCL program on the CPU (:mod:`cpu_smoke`).

torch is patched when the program imports it (an import hook), never imported here: a worker
that does not use torch pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from types import ModuleType
from typing import Any

from scaletrain.contract.environ import (CPU_SMOKE_VAR, DS_ACCELERATOR_VAR, EMULATE_GPUS_VAR, EMULATE_JOB_VAR,
                                         EMULATE_KEEP_VAR, EMULATE_NODES_VAR, EMULATE_VAR, GROUP_RECORD_VAR)

Hook = Callable[[ModuleType], None]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run hooks on a module right after it executes (before anyone imports names from it)."""

    def __init__(self, hooks: dict[str, list[Hook]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.hooks:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        hooks = self.hooks.pop(name)
        if not self.hooks and self in sys.meta_path:
            sys.meta_path.remove(self)
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            for hook in hooks:
                hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(hooks: dict[str, list[Hook]]) -> None:
    """Run ``hooks[name]`` when module ``name`` is first imported (now, if it already is)."""
    pending: dict[str, list[Hook]] = {}
    for name, fns in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            for fn in fns:
                fn(module)
        else:
            pending[name] = list(fns)
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


def _emulate(mode: str, environ: MutableMapping[str, str]) -> None:
    from scaletrain.launch.inproc.emulate import MODES, TORCHRUN_VARS, Place, emulated_vars

    if mode not in MODES:  # the launcher refuses it; the worker keeps torchrun's variables
        raise ValueError(f"unknown emulation {mode!r} (not one of {', '.join(MODES)})")
    world = int(environ["WORLD_SIZE"])
    nodes = int(environ.get(EMULATE_NODES_VAR, "1") or 1)
    place = Place(rank=int(environ["RANK"]), world=world, nodes=nodes,
                  cpus_per_task=max(1, int(environ.get("OMP_NUM_THREADS", "1") or 1)),
                  gpus_per_node=int(environ.get(EMULATE_GPUS_VAR, "0") or 0),
                  job_id=environ.get(EMULATE_JOB_VAR, "1"))
    for name in TORCHRUN_VARS:
        environ.pop(name, None)
    environ.update(emulated_vars(mode, place))
    if mode == "mpi":   # Horovod's Gloo rendezvous, when the launcher serves one
        from scaletrain.frameworks.horovod import horovod_vars
        from scaletrain.launch.inproc.emulate import node_names

        environ.update(horovod_vars(environ, rank=place.rank, world=place.world, local_rank=place.local_rank,
                                    local_size=place.per_node, node=place.node, nodes=place.nodes,
                                    host=node_names(place.nodes)[2][place.node]))
    environ.update(kept_exports(environ.get(EMULATE_KEEP_VAR, "")))


def kept_exports(text: str) -> dict[str, str]:
    """The launcher variables the user exported before ``scaletrain run --emulate``.

    A batch script that computes ``WORLD_SIZE`` from Slurm's variables, or picks its own
    ``MASTER_PORT``, and exports them before ``srun`` hands them to every task; the emulation
    must not take them away.
    """
    from scaletrain.jsonfile import loads

    try:
        kept = loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(kept, dict):
        return {}
    return {str(k): str(v) for k, v in kept.items() if isinstance(v, str)}


def activate(environ: MutableMapping[str, str] | None = None) -> None:
    """Apply what the launcher asked for (see the module docstring); never raises."""
    env = os.environ if environ is None else environ
    rank = env.get("RANK", "?")  # the launcher's rank, before an emulation hides it
    world = env.get("WORLD_SIZE", "")
    hooks: dict[str, list[Hook]] = {}
    try:
        from scaletrain.launch.inproc import rendezvous

        rendezvous.remember_agent_store(env)
        hooks["torch.distributed.distributed_c10d"] = [rendezvous.patch_c10d]
        hooks["torch.multiprocessing.spawn"] = [
            lambda module: rendezvous.patch_multiprocessing(module, world, rank)]
        record = env.get(GROUP_RECORD_VAR)
        if record:
            from scaletrain.launch.inproc import group_record

            group_record.start_recording(record, rank)
            hooks.setdefault("torch.distributed.distributed_c10d", []).append(
                group_record.patch_c10d)
            hooks.setdefault("torch.optim.optimizer", []).append(group_record.patch_optimizer)
            hooks.setdefault("horovod.torch", []).append(group_record.patch_horovod)
        if env.get(CPU_SMOKE_VAR) == "1":
            from scaletrain.launch.inproc import cpu_smoke

            cpu_smoke.clip_affinity()
            cpu_smoke.install_cuda_missing_hook(rank, mapped=True)
            hooks.setdefault("torch", []).append(cpu_smoke.patch_torch)
            hooks.setdefault("torch.distributed.distributed_c10d", []).insert(
                0, cpu_smoke.patch_c10d)
            hooks.setdefault("torch.distributed.device_mesh", []).append(
                cpu_smoke.patch_device_mesh)
        else:
            from scaletrain.launch.inproc.cpu_smoke import install_cuda_missing_hook

            install_cuda_missing_hook(rank)
        mode = env.get(EMULATE_VAR)
        if mode:
            _emulate(mode, env)
        if hooks:
            after_import(hooks)
    except Exception as exc:  # a broken shim must not take the user's program down
        print(f"scaletrain: worker set-up failed ({type(exc).__name__}: {exc}); "
              "running the program without it", file=sys.stderr)


def launcher_env(*, environ: Mapping[str, str], emulate: str | None, nodes: int,
                 cpu: bool, job_id: str, gpus_per_node: int = 0) -> dict[str, str]:
    """Launcher side: the variables that turn the shim on in the workers of one run.

    The shim's folder goes first on the workers' PYTHONPATH (never the user's own shell's).
    Under an emulation the agent does not share its store with the workers: a program written
    for srun makes rank 0 host the store at MASTER_PORT itself, as it would in a batch job.
    ``environ`` is the user's, with a ``--master-port`` already in it as MASTER_PORT.
    """
    shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim")
    path = environ.get("PYTHONPATH", "")
    out = {"PYTHONPATH": shim + (os.pathsep + path if path else "")}
    if emulate:
        from scaletrain.launch.inproc.emulate import USER_KEPT_VARS

        exported = {name: environ[name] for name in USER_KEPT_VARS if name in environ}
        out.update({EMULATE_VAR: emulate, EMULATE_NODES_VAR: str(nodes), EMULATE_JOB_VAR: job_id,
                    EMULATE_GPUS_VAR: str(gpus_per_node),
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
        if exported:
            import json

            out[EMULATE_KEEP_VAR] = json.dumps(exported, sort_keys=True, allow_nan=False)
    if cpu:
        out[CPU_SMOKE_VAR] = "1"
        # --cpu makes torch.cuda answer as a GPU node: DeepSpeed would take its CUDA accelerator
        # and JIT-build CUDA ops (FusedAdam); its CPU accelerator runs the same program on gloo
        if not environ.get(DS_ACCELERATOR_VAR):   # unless the user chose one
            out[DS_ACCELERATOR_VAR] = "cpu"
    return out
