"""``scaletrain.init()``: detect the job, pick the device, start torch.distributed, validate.

One code path from a laptop to many Slurm nodes::

    env = scaletrain.init()        # rank 0 of 1 on a laptop; rank 13 of 16 under srun
    model.to(env.device)

Steps, in order (each decision made once, in the module named):

1. who am I: ``runtime.detect`` reads the launcher's variables (torchrun, Slurm, MPI, PMI or
   a single process) into a ``Placement``; the request is ``init()``'s arguments or the
   launcher's ``SCALETRAIN_*`` variables;
2. resolve: ``runtime.resolve`` picks the device by local rank (``cuda:N``, ROCm's HIP
   devices alike; ``cpu`` when asked with ``init(device='cpu')`` or
   ``SCALETRAIN_DEVICE=cpu``, even with GPUs allocated) with torch's GPU count, the backend
   (nccl on GPUs, gloo on the CPU), the CPU binding and the intra-op threads, which are
   applied before the group starts so its threads inherit them;
3. the ``Env`` is built once from the placement and these choices;
4. join: ``init_process_group`` with an explicit ``tcp://MASTER_ADDR:MASTER_PORT`` so
   nothing is written to ``os.environ``, or the script's own group, adopted.

A single process gets a real one-rank process group too, on an in-memory ``HashStore`` (no
port, no network): DDP, FSDP2 and the collective helpers then run unchanged at world size 1.
The start-up timeout is long (30 min by default) because Slurm may start nodes minutes
apart. ``init()`` is idempotent; :func:`shutdown` (also run at exit) destroys the group.
"""

from __future__ import annotations

import atexit
import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from scaletrain import module_state, settings
from scaletrain.errors import DistEnvError, UsageError
from scaletrain.runtime.affinity import apply_binding
from scaletrain.runtime.detect import detect_placement
from scaletrain.runtime.device import gpu_view, normalize_request, torch_gpus
from scaletrain.runtime.env import Env, Placement
from scaletrain.runtime.gloo import FILES_MARGIN, enough_files
from scaletrain.runtime.masteraddr import Target, resolve_or_fail, wait_limit
from scaletrain.runtime import settle as _settle
from scaletrain.runtime.resolve import (CPU_HINT, CpuPlan, Request, choose_backend, choose_device,
                                        normalize_backend, plan_cpus, read_request)
from scaletrain.runtime import errorhook, session, timeouts
from scaletrain.runtime.threads import allowed_cpus, apply_threads
from scaletrain.runtime.timeouts import STARTUP_TIMEOUT_S



@dataclass(kw_only=True)
class _CpuUndo:
    """The affinity and thread count a process had before init() changed them."""

    previous_threads: int | None = None
    previous_affinity: set[int] | None = None


@dataclass(kw_only=True)
class _Runtime:
    """What init() did, so a second call can be checked and shutdown() can undo it."""

    env: Env
    requested_device: str
    requested_backend: str | None
    timeout_s: float
    owns_group: bool
    cpus: _CpuUndo


_LOCK = threading.RLock()
_STATE: _Runtime | None = None
module_state.register(__name__, "_STATE", leak=True)
_ATEXIT_REGISTERED = False
module_state.register(__name__, "_ATEXIT_REGISTERED", reset=False)


def current() -> Env | None:
    """The Env of the last successful :func:`init`, or None before it (and after shutdown)."""
    return session.get()


def _check_same(state: _Runtime, device: str | None, backend: str | None,
                timeout_s: float | None) -> None:
    """A second init() must not ask for something else than the first one got."""
    env = state.env
    if device is not None:
        want = normalize_request(device, os.environ)
        same = (want in (state.requested_device, env.device, "auto")
                or (want == "cuda" and env.device.startswith("cuda")))
        if not same:
            raise UsageError(f"scaletrain.init() already ran with device {env.device!r}; "
                             f"called again with device={device!r}",
                             "call scaletrain.shutdown() first, or pass the same device")
    want_backend = normalize_backend(backend)
    if want_backend is not None and want_backend != env.backend:
        raise UsageError(f"scaletrain.init() already ran with backend {env.backend!r}; "
                         f"called again with backend={backend!r}",
                         "call scaletrain.shutdown() first, or pass the same backend")
    if timeout_s is not None and timeout_s != state.timeout_s:
        raise UsageError(f"scaletrain.init() already ran with timeout_s={state.timeout_s:g}; "
                         f"called again with timeout_s={timeout_s!r}",
                         "call scaletrain.shutdown() first, or pass the same timeout")


def _init_method(env: Env) -> str:
    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    return f"tcp://{host}:{env.master_port}"


def _start_group(env: Env, backend: str, device: str, timeout: timedelta) -> None:
    """init_process_group, with start-up failures turned into one-line errors."""
    import torch
    import torch.distributed as dist

    kwargs: dict[str, object] = {"backend": backend, "timeout": timeout,
                                 "rank": env.rank, "world_size": env.world_size}
    if backend == "nccl" and device.startswith("cuda"):
        kwargs["device_id"] = torch.device(device)  # eager NCCL init on the right GPU
    if env.world_size == 1:
        kwargs["store"] = dist.HashStore()  # one rank: no port, no network
    else:
        kwargs["init_method"] = _init_method(env)
        resolve_or_fail(Target(env.master_addr, str(env.master_port), "MASTER_ADDR"),
                        rank=env.rank, wait_s=wait_limit(os.environ))
        if env.rank == 0:
            # rank 0 hosts the rendezvous store (a socket per rank) and later the root of
            # scaletrain's own gloo group (another): a login shell's 1024 would refuse rank 1024
            enough_files(2 * env.world_size + FILES_MARGIN)
    try:
        dist.init_process_group(**kwargs)  # type: ignore[arg-type]
    except RuntimeError as exc:  # DistNetworkError / DistStoreError are RuntimeErrors
        text = str(exc)
        where = f"{env.master_addr}:{env.master_port}"
        if "address already in use" in text.lower() or "EADDRINUSE" in text:
            raise DistEnvError(f"rank {env.rank}: rendezvous port {where} is already in use",
                               "set MASTER_PORT to a free port (or let scaletrain run pick one)"
                               ) from exc
        if "timed out" in text.lower() or "timeout" in text.lower():
            raise DistEnvError(
                f"rank {env.rank}: not all {env.world_size} processes reached the rendezvous at "
                f"{where} within {timeout.total_seconds():g} s",
                "check that every rank was started and can reach MASTER_ADDR "
                "(firewall, NCCL_SOCKET_IFNAME), or raise init(timeout_s=...)") from exc
        raise


def _apply_cpus(plan: CpuPlan, undo: _CpuUndo) -> CpuPlan:
    """Bind and set threads as planned, noting in ``undo`` how to revert; returns what held."""
    binding = plan.binding
    if binding is not None:
        previous = apply_binding(binding)
        if previous is None:  # not Linux, or the cores vanished meanwhile
            binding = None
        else:
            undo.previous_affinity = previous
    undo.previous_threads = apply_threads(plan.threads)
    return CpuPlan(binding=binding, threads=plan.threads)


def _undo_cpus(undo: _CpuUndo) -> None:
    if undo.previous_affinity:
        try:
            os.sched_setaffinity(0, undo.previous_affinity)
        except (AttributeError, OSError):
            pass
    if undo.previous_threads is not None:
        import torch

        torch.set_num_threads(undo.previous_threads)


def _resolve_on_torch(placement: Placement, request: Request,
                      environ: Mapping[str, str]) -> tuple[str, str]:
    """The resolve step against torch (the truth): device and backend, checked usable."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise DistEnvError(f"torch {torch.__version__} was built without torch.distributed",
                           "install an official torch wheel")
    if request.device == "mps" and not torch.backends.mps.is_available():
        raise DistEnvError("device='mps' asked for but this torch sees no MPS device",
                           CPU_HINT)
    count, build = torch_gpus() if request.device not in ("cpu", "mps") else (0, "")
    device = choose_device(placement, request, gpu_view(environ, probe=False),
                           torch_gpus=count, build=build,
                           under_slurm=bool(environ.get("SLURM_JOB_ID")))
    backend = choose_backend(request, device)
    if backend == "nccl" and not dist.is_nccl_available():
        raise DistEnvError(f"torch {torch.__version__} has no NCCL/RCCL support",
                           "install a CUDA or ROCm build of torch, or use backend='gloo'")
    if dist.is_initialized():  # the script made its own group: adopt it if it matches
        if dist.get_rank() != placement.rank or dist.get_world_size() != placement.world_size:
            raise DistEnvError(
                f"a process group already exists as rank {dist.get_rank()} of "
                f"{dist.get_world_size()} but {placement.launcher} says rank {placement.rank} "
                f"of {placement.world_size}",
                "call scaletrain.init() instead of init_process_group()")
        backend = str(dist.get_backend())
    return device, backend


def _warn_batch_step(placement: Placement) -> None:
    ntasks = placement.extra.get("slurm_ntasks", "")
    if placement.extra.get("slurm_batch_step") and ntasks.isdigit() and int(ntasks) > 1:
        warnings.warn(f"scaletrain: running as ONE process in the batch script of Slurm job "
                      f"{placement.job_id}, which asked for {ntasks} tasks; start the program with "
                      "srun (or 'scaletrain run') to use them", RuntimeWarning, stacklevel=3)


# init()'s other arguments in the settings vocabulary (what each value means is checked where it
# is read: runtime.device, runtime.resolve, runtime.preempt); the timeouts are runtime.timeouts'
DEVICE = settings.Spec(doc="'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'", check=settings.text(), optional=True)
BACKEND = settings.Spec(doc="'nccl' or 'gloo' (default: nccl on GPUs, gloo on the CPU)", check=settings.text(),
                        optional=True)
STOP_SIGNALS = settings.Spec(
    doc="e.g. {'USR1': 'time_limit', 'TERM': 'preempted'}, 'USR1:time_limit,TERM:preempted' or 'none'",
    check=settings.kind(lambda v: isinstance(v, str) or (isinstance(v, Mapping) and all(
        isinstance(k, str) and isinstance(r, str) for k, r in v.items())),
        "a mapping of signal name to reason, or text like 'USR1:time_limit'"), optional=True)


def init(*, device: str | None = None, backend: str | None = None,
         timeout_s: float | None = None, step_timeout_s: float | None = None,
         stop_signals: Mapping[str, str] | str | None = None) -> Env:
    """Join the job and return this process's :class:`Env`.

    Args:
        device: ``None``/``"auto"`` (GPU by local rank when torch sees GPUs, else CPU),
            ``"cpu"`` (even with GPUs allocated), ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
            ``SCALETRAIN_DEVICE`` gives the same choice from outside.
        backend: torch.distributed backend; default nccl on GPUs, gloo on the CPU. ``"gloo"``
            also allows several local ranks to share one GPU (CUDA MPS).
        timeout_s: start-up rendezvous and collective timeout (default 1800 s).
        step_timeout_s: collective timeout once training runs (default ``SCALETRAIN_TIMEOUT``,
            set by ``scaletrain run --timeout``, else 600 s, at most ``timeout_s``); applied
            by :func:`scaletrain.runtime.timeouts.training_started`.
        stop_signals: signals that ask the training loop to save and stop, with their reason,
            e.g. ``{"USR1": "time_limit", "TERM": "preempted", "USR2": "requested"}`` (the
            default; USR2 is ``scaletrain cancel --save``) or the same as
            ``"USR1:time_limit,TERM:preempted,USR2:requested"``; ``"none"`` installs nothing.
            ``SCALETRAIN_STOP_SIGNALS`` gives the same choice from outside
            (see :mod:`scaletrain.runtime.preempt`).

    Idempotent: a second call returns the same Env; one with different arguments raises
    UsageError. Raises :class:`DistEnvError` when the environment contradicts itself or the
    allocation (more local ranks than GPUs, GPUs allocated to a CPU-only torch, ...).
    """
    global _STATE
    # first, so init's own errors (a contradictory environment) are one line too under srun/python
    errorhook.install()
    # each argument checked where it enters (the settings vocabulary), before any is used
    asked_s = timeouts.check_seconds(timeout_s, "timeout_s")
    timeouts.check_seconds(step_timeout_s, "step_timeout_s")
    settings.check_value(DEVICE, device, "init(): device")
    settings.check_value(BACKEND, backend, "init(): backend")
    settings.check_value(STOP_SIGNALS, stop_signals, "init(): stop_signals")
    with _LOCK:
        if _STATE is not None:
            _check_same(_STATE, device, backend, asked_s)
            return _STATE.env
        seconds = asked_s if asked_s is not None else STARTUP_TIMEOUT_S
        from scaletrain.runtime import preempt

        stop_signals = preempt.resolve(stop_signals)  # a bad value fails before any rendezvous
        step_seconds = timeouts.step_timeout(seconds, step_timeout_s, os.environ)
        environ = os.environ

        # 1. Who am I in the job (environment only), and what was asked for.
        placement = detect_placement(environ)
        request = read_request(environ, device=device, backend=backend)
        _warn_batch_step(placement)

        # 2. Resolve once: device and backend against torch, then CPU binding and threads.
        dev, chosen_backend = _resolve_on_torch(placement, request, environ)
        import torch
        import torch.distributed as dist

        if dev.startswith("cuda"):
            torch.cuda.set_device(int(dev.split(":", 1)[1]))
        undo = _CpuUndo()
        owns = False
        try:
            # bound before the group starts, so gloo's and NCCL's threads inherit the mask
            cpus = _apply_cpus(plan_cpus(placement, dev, environ, allowed=allowed_cpus()), undo)

            # 3. The Env, built once.
            env = placement.with_device(device=dev, backend=chosen_backend,
                                        facts=cpus.facts())
            # 4. Join: the process group (or the script's own, adopted in step 2).
            if not dist.is_initialized():
                _start_group(env, chosen_backend, dev, timedelta(seconds=seconds))
                owns = True
            # a raise from here on undoes everything above.
            # The shorter collective timeout applies once the first step has run
            # (runtime.timeouts.training_started), not during start-up.
            timeouts.configure(step_seconds)
        except BaseException:
            if owns and dist.is_initialized():
                _settle.destroy_group()
            _undo_cpus(undo)
            raise
        _STATE = _Runtime(env=env, requested_device=request.device,
                          requested_backend=request.backend, timeout_s=seconds,
                          owns_group=owns, cpus=undo)
        session.record(env)
        _register_atexit()
        # the stop handlers last, once nothing can fail: a signal during the rendezvous still
        # has its default effect (the job's own stop), there is no state yet to save
        preempt.install(stop_signals)
        return env


def _register_atexit() -> None:
    global _ATEXIT_REGISTERED
    if not _ATEXIT_REGISTERED:
        atexit.register(shutdown)
        _ATEXIT_REGISTERED = True


def shutdown() -> None:
    """Destroy the process group init() created and undo its CPU binding and thread count.

    Safe to call twice, or without init(); a group the script created itself is left alone.
    Waits until gloo's worker threads are idle, so the interpreter can exit under them.
    Runs at interpreter exit too.
    """
    global _STATE
    with _LOCK:
        state, _STATE = _STATE, None
        session.record(None)
    if state is None:
        return
    import sys

    from scaletrain.runtime import preempt

    preempt.uninstall()  # the handlers init() replaced come back
    timeouts.configure(None)

    dist = sys.modules.get("torch.distributed")
    if state.owns_group and dist is not None and dist.is_initialized():
        _settle.destroy_group()  # waits for gloo's threads before and after
    else:
        # gloo's worker threads may still be releasing finished work; exiting under them aborts
        _settle.settle_gloo_workers()
    _undo_cpus(state.cpus)
