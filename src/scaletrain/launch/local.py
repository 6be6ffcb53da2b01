"""Run a ``LaunchPlan`` on this node with torch's elastic agent (what torchrun runs).

We build a ``LaunchConfig`` and call ``elastic_launch``: rendezvous, the torchrun environment
contract for every worker, process supervision, output teeing and shutdown are all torch's.
What we add is around it: the worker environment (threads, backend for shared GPUs), a
fixed-port check, the MPS daemon, and one readable error for a failed worker.

The agent writes ``os.environ`` and installs signal handlers in the calling process; both
are restored when ``launch`` returns, so calling it from Python leaves no trace - except after
workers that stopped on purpose (exit 75): then USR1/USR2/TERM stay ignored, because the
caller is about to exit with 75 and a late SIGTERM must not kill it (see launch.signals).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from scaletrain.contract.environ import EXIT_STOPPED, GROUP_RECORD_VAR
from scaletrain.errors import LaunchError
from scaletrain.frameworks.horovod import rendezvous_store
from scaletrain.launch.inproc.cpu_smoke import BANNER
from scaletrain.launch.failure import (FailedRank, collect_failures, render_tail, root_cause,
                                       worker_failed_error)
from scaletrain.launch.group_check import verdict
from scaletrain.launch.inproc.group_record import read_records
from scaletrain.launch.mps import mps_daemon
from scaletrain.launch import lean, rundir
from scaletrain.launch.adapter import LEAN_EXIT, check as check_torch
from scaletrain.launch.patches import install_lasting, scoped_patches
from scaletrain.launch.output import ensure_std_streams, make_logs_specs, prefix_template, shown_on_console
from scaletrain.launch.ports import check_port_free
from scaletrain.launch.reaper import ending_with_run
from scaletrain.launch.crash import crash_stack
from scaletrain.launch.rundir import read_errors, read_finished
from scaletrain.launch.signals import TORCH_SIGNALS, forward_stop_signals, stop_outcome
from scaletrain.launch.spec import LaunchPlan
from scaletrain.runtime.masteraddr import Target, resolve_or_fail, wait_limit
from scaletrain.launch.supervise import run_folder, supervised_agent, worker_environ
from scaletrain.launch.teardown import watching_teardown
from scaletrain.launch.inproc.worker import worker_args
from scaletrain.torch_features import launch_config_fields

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

# How often the agent polls its workers (torchrun's default). Lower costs CPU on small
# machines; higher delays noticing a finished or failed worker.
MONITOR_INTERVAL_S = 0.1
# Seconds between SIGTERM and SIGKILL when the launcher is interrupted (torch's default is
# 30). A worker blocked in a collective dies at SIGTERM; a checkpointing handler gets this
# long. (After a worker *failure* torch's process context uses its own fixed 30 s.)
SHUTDOWN_TIMEOUT_S = 15
_HANDLED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@contextmanager
def _scoped_environ(extra: Mapping[str, str]) -> Iterator[None]:
    """Add ``extra`` to os.environ (the agent copies it into every worker), then restore it."""
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def _scoped_signal_handlers() -> Iterator[None]:
    saved = {}
    for name in _HANDLED_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.getsignal(sig)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):  # not the main thread, or a C-level handler
                pass


def _config(plan: LaunchPlan, logs_specs: object) -> LaunchConfig:
    from torch.distributed.launcher.api import LaunchConfig

    rdzv_configs: dict[str, object] = {}
    if plan.rdzv_backend == "static":
        rdzv_configs["rank"] = plan.node_rank
        run_id = os.environ.get("SLURM_JOB_ID", "scaletrain")  # the same on every node
    else:
        run_id = uuid.uuid4().hex
    # Fields newer torch added (torch_features.launch_config_fields): passed where torch has
    # them. Without shutdown_timeout the agent waits its own 30 s before SIGKILL; without
    # signals_to_handle, patches.torch_leaves_forwarded_signals keeps SIGTERM ours (launch/adapter.py
    # refuses a torch where it cannot).
    optional: dict[str, Any] = {
        "shutdown_timeout": _shutdown_timeout(),
        "signals_to_handle": TORCH_SIGNALS,  # SIGTERM: forwarded so workers can save (signals.py)
    }
    fields = launch_config_fields()
    return LaunchConfig(
        min_nodes=plan.nnodes, max_nodes=plan.nnodes, nproc_per_node=plan.nproc_per_node,
        run_id=run_id, role="default", rdzv_endpoint=plan.rdzv_endpoint,
        rdzv_backend=plan.rdzv_backend, rdzv_configs=rdzv_configs,
        max_restarts=plan.max_restarts, monitor_interval=MONITOR_INTERVAL_S,
        start_method="spawn", log_line_prefix_template=prefix_template(plan.ranks),
        local_addr=plan.local_addr, logs_specs=logs_specs,  # type: ignore[arg-type]
        **{name: value for name, value in optional.items() if name in fields},
    )


def _shutdown_timeout() -> int:
    shutdown = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "")
    return int(shutdown) if shutdown.isdigit() else SHUTDOWN_TIMEOUT_S


def _quiet_agent_logs() -> None:
    """Hide the agent's own warnings ("Sending process N closing signal") unless LOGLEVEL asks.

    We report failures ourselves, once; torchrun users who want the agent's log set LOGLEVEL.
    """
    import logging

    if os.environ.get("LOGLEVEL"):
        return
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("torch.distributed.elastic") or name.startswith("torch.distributed.launcher"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def _launch_error(exc: BaseException, plan: LaunchPlan) -> LaunchError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "address already in use" in str(exc).lower() or "EADDRINUSE" in str(exc):
        return LaunchError(f"the rendezvous port at {plan.rdzv_endpoint} is already in use",
                           "pick another with --master-port P, or unset MASTER_PORT")
    if plan.rdzv_backend == "static" and plan.node_rank > 0:
        return LaunchError(f"could not join the rendezvous at {plan.rdzv_endpoint}: {text}",
                           "start node rank 0 with the same --master-addr/--master-port, and "
                           "check that this node can reach it")
    return LaunchError(f"workers could not be started: {type(exc).__name__}: {text}",
                       "run again with LOGLEVEL=INFO for the elastic agent's log")


def _check_resolves(plan: LaunchPlan) -> None:
    """The rendezvous host must resolve before the agent waits its 5 minutes on it."""
    host = plan.local_addr or plan.rdzv_endpoint.rpartition(":")[0]
    if not host or host in ("localhost", "127.0.0.1"):
        return
    origin = "MASTER_ADDR" if os.environ.get("MASTER_ADDR") == host else "--master-addr"
    resolve_or_fail(Target(host, plan.rdzv_endpoint.rpartition(":")[2], origin),
                    rank=None, wait_s=wait_limit(os.environ))


def launch(plan: LaunchPlan) -> int:
    """Start ``plan``'s workers, wait for them, and return 0 (or raise WorkerFailedError).

    Raises ``LaunchError`` when workers cannot start, ``WorkerFailedError`` naming the rank
    when one fails. USR1/USR2/TERM are passed to the workers (see launch.signals); when they
    stop on purpose (exit code EXIT_STOPPED) so does this. A SIGINT, a second SIGTERM, or
    workers that ignore the first, stop the workers and return 128+N.
    """
    ensure_std_streams()
    if plan.master_port_fixed is not None:
        check_port_free(plan.master_port_fixed, where="--master-port/MASTER_PORT")
    _check_resolves(plan)

    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    _quiet_agent_logs()

    adapter = check_torch(os.environ, max_restarts=plan.max_restarts)  # before any worker
    lean.imports_done(skip_teardown=LEAN_EXIT in adapter)
    install_lasting(adapter)   # or, under SCALETRAIN_TORCH_AS_IS, an earlier launch's put back
    log_dir = tempfile.mkdtemp(prefix="scaletrain_run_")
    logs_specs = make_logs_specs(log_dir, ranks=plan.ranks, node_rank=plan.node_rank)
    records = os.path.join(log_dir, "groups")
    os.mkdir(records)
    if plan.cpu:
        print(f"scaletrain: {BANNER}", file=sys.stderr, flush=True)

    def failures(report: Mapping[int, object]) -> list[FailedRank]:
        crashes = {int(r): c for r in report if (c := crash_stack(run_dir, int(r))) is not None}
        return collect_failures(report, logs_specs.stderr_paths, records=read_errors(run_dir),
                                finished=read_finished(run_dir), crashes=crashes)

    try:
        # forward_stop_signals first: it exits last, so its choice of handlers stays. The MPS
        # daemon is stopped after the reaper has stopped what the workers left running: its
        # quit waits for every CUDA client, and such a process is one
        with forward_stop_signals() as forwarding, \
                mps_daemon(plan.procs_per_gpu is not None and plan.gpus > 0,
                           grace_s=_shutdown_timeout()) as mps_env, \
                rendezvous_store(plan.emulate == "mpi" and importlib.util.find_spec("horovod") is not None) \
                as horovod_env, \
                ending_with_run(_shutdown_timeout()), \
                run_folder(plan.run_dir) as run_dir, \
                _scoped_environ({**plan.worker_env, **mps_env, **horovod_env, **worker_environ(run_dir),
                                 GROUP_RECORD_VAR: records}), \
                _scoped_signal_handlers(), \
                scoped_patches(adapter, one_node=plan.rdzv_backend == "c10d" and plan.nnodes == 1), \
                supervised_agent(run_dir, failures, plan.nproc_per_node * plan.nnodes, adapter,
                                 plan.max_restarts), \
                watching_teardown(run_dir, records, _node_ranks(plan), plan.teardown) as watch:
            rundir.forget_ranks(run_dir, _node_ranks(plan))   # a --run-dir used before
            forwarding.finished = lambda: rundir.finished_pids(run_dir)
            config = _config(plan, logs_specs)
            try:
                elastic_launch(config, plan.entrypoint)(*worker_args(plan.args))
            except ChildFailedError as exc:
                if watch.ended_training():
                    sys.stdout.flush()   # training finished; the lines above name who hung
                    print("scaletrain: training finished; the ranks stuck in teardown were "
                          "stopped", file=sys.stderr)
                    _check_group(plan, records)
                    return 0
                stopped = stop_outcome(forwarding, (f.exitcode for f in exc.failures.values()))
                if stopped is not None:  # a stop on purpose (75) or by our SIGTERM, no failure
                    sys.stdout.flush()
                    print(stopped[1], file=sys.stderr)
                    return stopped[0]
                failed = failures(exc.failures)
                cause = root_cause(failed)
                sys.stdout.flush()
                # one rank stopped on purpose, the rest were stopped by the agent
                if cause.record is None and cause.exitcode == EXIT_STOPPED:
                    print(f"scaletrain: rank {cause.rank} stopped on purpose after saving its "
                          f"state (exit {EXIT_STOPPED}); run again, or requeue, to resume",
                          file=sys.stderr)
                    return EXIT_STOPPED
                error = worker_failed_error(failed, plan.node_rank, emulate=plan.emulate)
                print(render_tail(cause, shown=shown_on_console(plan.ranks, plan.node_rank,
                                                                cause.local_rank)),
                      file=sys.stderr)
                _warn_alone(plan, records, crashed=True)
                raise error from None
            except SignalException as exc:
                sys.stdout.flush()
                print(f"scaletrain: received {exc.sigval.name}; stopped the workers",
                      file=sys.stderr)
                return 128 + int(exc.sigval)
            except (LaunchError, KeyboardInterrupt):
                raise
            except Exception as exc:  # rendezvous/store failures: one line, no traceback
                raise _launch_error(exc, plan) from exc
        _check_group(plan, records)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def _node_ranks(plan: LaunchPlan) -> list[int]:
    """The global ranks of this node's workers."""
    first = plan.node_rank * plan.nproc_per_node
    return list(range(first, first + plan.nproc_per_node))


def _alone(plan: LaunchPlan, records: str, *, crashed: bool) -> str | None:
    """The lone-worker warning for this node's workers, or None (see group_check.verdict)."""
    world = plan.nproc_per_node * plan.nnodes
    return verdict(read_records(records), expected_world=world,
                   local_ranks=[str(rank) for rank in _node_ranks(plan)],
                   cpu=plan.cpu, crashed=crashed)


def _warn_alone(plan: LaunchPlan, records: str, *, crashed: bool) -> None:
    """After a failure: say so when the workers had been training alone (one cause fewer)."""
    warning = _alone(plan, records, crashed=crashed)
    if warning is not None:
        print(f"scaletrain: WARNING: {warning}", file=sys.stderr)


def _check_group(plan: LaunchPlan, records: str) -> None:
    """After a successful run: say loudly when the workers never formed one group of all."""
    sys.stdout.flush()
    warning = _alone(plan, records, crashed=False)
    if plan.cpu:
        print("scaletrain: finished a CPU smoke test (--cpu); GPU runs may still differ",
              file=sys.stderr)
    if warning is None:
        return
    if plan.strict:
        message, hint = warning.split("\nHINT: ", 1)
        raise LaunchError(message, hint)
    print(f"scaletrain: WARNING: {warning}\n(exit code 0 kept; use --strict to fail the run)",
          file=sys.stderr)
