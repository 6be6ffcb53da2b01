"""``scaletrain.Monitor``: per-step metrics that are cheap enough to leave on.

Typical use::

    monitor = scaletrain.Monitor("runs/exp1", total_steps=len(loader) * epochs)
    monitor.watch(model)                        # optional: DDP all-reduce wait per rank
    for batch in monitor.data(loader):          # measures time blocked on the loader
        loss = train_step(batch)
        monitor.step(samples=len(batch), loss=loss)
    monitor.close()                             # summary on rank 0, summary.json in run_dir

Per step it records step time, throughput (samples/s and tokens/s, global and per device), the
data-wait fraction, peak memory (device memory on a GPU, the process's peak RSS on the CPU) and
model FLOP utilisation when FLOPs per sample are given. The step path is a clock read, two list
appends and a few comparisons (:mod:`scaletrain.observe.steplog`). Every ``flush_s`` seconds
(default 1) rank 0 hands the buffered columns to a writer thread
(:mod:`scaletrain.observe.writer`), which converts the losses (so the monitor adds no per-step
device synchronisation), formats and writes the sinks; what a crash can lose is bounded by that
interval (see :meth:`Monitor.step`). Every ``every`` steps (default 100, or about a second's
worth of steps when that is more: the rule of :mod:`scaletrain.runtime.cadence`, which the stop
agreement follows too) the ranks exchange on the training thread: one reduction gives every rank
the slowest step time, and each rank's small record goes to rank 0 alone
(:mod:`scaletrain.observe.exchange`), which names stragglers and idle devices; the node's device
sampler (one thread per node, on its lowest local rank) sends its figures in that exchange.

``step()`` and ``close()`` must be called the same number of times on every rank (as the
training loop does), because of that exchange. ``samples`` is this process's batch: the global
figure is ``samples x world_size`` per step, summed exactly over ranks in the summary. The
settings: :class:`scaletrain.observe.config.MonitorConfig`.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from scaletrain import settings
from scaletrain.contract.files import SUMMARY_FILE
from scaletrain.fileio import atomic_write, json_text
from scaletrain.observe.commwait import CommWait, attach
from scaletrain.observe import exchange
from scaletrain.observe.config import MonitorConfig, make_config
from scaletrain.observe.devices import (DeviceSampler, device_key, device_peak_flops, lookup, peak_memory_gb,
                                        rank_sampler)
from scaletrain.observe.inputs import MAX_SAMPLES, check_loss, check_more, check_samples, warn_write_failure
from scaletrain.observe.health import HealthFinding, HealthTracker, RankWindow, windows_of
from scaletrain.observe.records import NEVER, Record, StepBatch, retune
from scaletrain.observe.sinks import JsonlSink, Sink, build_sinks, run_files, start_record
from scaletrain.observe.steplog import StepColumns
from scaletrain.observe.stepstats import StepStats
from scaletrain.observe.writer import SinkWriter
from scaletrain.runtime.cadence import MONITOR_EVERY, monitor_interval
from scaletrain.runtime.current import current_env, live_dist
from scaletrain.runtime.env import ENV


# the Monitor's arguments besides its settings (observe.config), in the settings vocabulary
RUN_DIR = settings.Spec(doc="the folder for metrics.jsonl and summary.json (None: console only)",
                        check=settings.path(), optional=True)
MODEL = settings.Spec(doc="the model, before its first forward pass, e.g. monitor.watch(model)",
                      check=settings.kind(lambda m: callable(m.parameters), "a torch.nn.Module"))
ITERABLE = settings.Spec(doc="the loader to time, e.g. for batch in monitor.data(loader)",
                         check=settings.kind(lambda v: hasattr(v, "__iter__") or hasattr(v, "__getitem__"),
                                             "an iterable (a loader, a list)"))

BUFFER_STEPS = 10_000  # steps buffered at most, however long flush_s: checked at each exchange


class Monitor:
    """Measure each training step and report it (see the module docstring).

    Args:
        run_dir: folder for ``metrics.jsonl``, ``summary.json`` and ``tensorboard/`` (rank 0
            writes them). None: console only.
        config: the settings (:class:`scaletrain.observe.config.MonitorConfig`); keyword
            arguments of the same names set them too (``Monitor(run_dir, total_steps=1000)``).
        env: the process's :class:`scaletrain.Env`; default: the one ``scaletrain.init()`` made.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, config: MonitorConfig | None = None, *,
                 env: Any = None, **options: Any) -> None:
        settings.check_value(RUN_DIR, run_dir, "Monitor: run_dir")
        settings.check_value(ENV, env, "Monitor: env")
        self.config = cfg = make_config(config, options)
        self._spaced = cfg.every is None  # exchanges spaced by time unless a step count was asked for
        self.env = env if env is not None else current_env()
        self.rank = self.env.rank if self.env is not None else 0
        self.world_size = self.env.world_size if self.env is not None else 1
        self.device = self.env.device if self.env is not None else "cpu"
        self.host = socket.gethostname()
        self.every = MONITOR_EVERY if cfg.every is None else cfg.every
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.peak_flops = cfg.peak_flops if cfg.peak_flops is not None else device_peak_flops(self.device)

        start = start_record(total_steps=cfg.total_steps, start_step=cfg.start_step, world_size=self.world_size,
                             device=self.device, host=self.host)
        self.sinks: list[Sink] = build_sinks(self.run_dir, cfg, rank=self.rank, start=start)

        self._writer = SinkWriter(self.sinks) if self.sinks else None
        self._device_id = cfg.device_id if cfg.device_id is not None else device_key(self.device)
        self._device_seen: dict[str, Any] | None = None   # this device's figures, last exchanged
        self._node = self.env.node_rank if self.env is not None else 0
        # one device sampler per node, on its lowest local rank; the others only name their device
        self._device_mode, self.sampler = rank_sampler(cfg.device_sampler, self.device, self.env,
                                                       interval_s=cfg.sample_interval_s)
        self._health = HealthTracker()
        self._comm: CommWait | None = None

        self._t0 = time.perf_counter()
        self._started = False        # the first step's start was set (start(), or data()'s first fetch)
        self._step = 0
        # the steps since the last hand-over, as columns; records are built off this thread
        self._cols = StepColumns(1, self._t0, self._t0)
        self._put_end, self._put_samples = self._cols.ends.append, self._cols.samples.append
        self._kept = self._cols.losses
        self._accounted = 0          # buffered steps already in the statistics below
        # Without a writer (ranks other than 0) nothing waits for a hand-over: the time check never fires
        self._flush_after = cfg.flush_s if self._writer is not None else math.inf
        self._hand_at = self._t0 + self._flush_after
        # losses kept for every N-th step only (records.loss_stride), retuned at each hand-over
        # (1 at first: every rank checks its first loss; ranks without a writer then keep none)
        self._loss_every = 1
        self._line_every = 1          # the spaced JSONL stride in force (records.spaced_every)
        self._strides = (any(isinstance(s, JsonlSink) for s in self.sinks), cfg.jsonl_every,
                         cfg.log_every if cfg.console else None, cfg.tensorboard)
        self._exchanged_at = 0
        self._next_exchange = self.every
        self._stats = StepStats(cfg.warmup)   # the window and the run, folded in off the step path
        self._findings: list[HealthFinding] = []
        self._peak_mem = 0.0
        self._closed = False
        self._loss_class: type | None = None  # the loss type last checked (check_loss)
        self._write_failed = False
        self.grad_bytes: int | None = None
        if self._writer is not None:  # an exit without close() still writes what was measured
            atexit.register(self._at_exit)

    def watch(self, model: Any) -> bool:
        """Time DDP's gradient all-reduces of ``model`` (before its first forward pass).

        This separates a rank's own work from its wait for the others, which is what names a
        straggler in a synchronised loop, and records the gradient size for the scaling model
        (``scaletrain plan --explain RUN_DIR``). Returns False when ``model`` is not wrapped
        in DistributedDataParallel (then only the gradient size is recorded).
        """
        settings.check_value(MODEL, model, "Monitor.watch(): model")
        # the bytes DDP all-reduces per step: what the scaling model (plan --explain) needs
        self.grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        timer = CommWait()
        if attach(model, timer):
            self._comm = timer
            return True
        return False

    # ------------------------------------------------------------------ the step path
    def start(self) -> None:
        """Start the clock of the next step now (default: the end of the step before it; for
        the first step, the first batch fetch or the Monitor's creation)."""
        now = time.perf_counter()
        if self._step == 0:
            self._begin(now)
        else:
            self._started = True
            self._cols.starts[self._step + 1] = now

    def _begin(self, now: float) -> None:
        """The first step starts now; the device's figures count from here (not the loading)."""
        self._started = True
        self._cols.start = now
        if self.sampler is not None:
            self.sampler.snapshot()

    def data(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``iterable``, adding the time blocked in each ``next()`` to the data wait."""
        settings.check_value(ITERABLE, iterable, "Monitor.data(): iterable")   # here, not at the first next()
        return self._data(iterable)

    def _data(self, iterable: Iterable[Any]) -> Iterator[Any]:
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            if not self._started:
                self._started = True
                if self._step == 0:
                    self._begin(t0)
            try:
                item = next(it)
            except StopIteration:
                return
            waits, coming = self._cols.waits, self._step + 1   # the step this batch is for
            waits[coming] = waits.get(coming, 0.0) + (time.perf_counter() - t0)
            yield item

    def step(self, *, samples: int | float, loss: Any = None, **more: Any) -> None:
        """Record one finished training step of this process.

        The step is buffered; rank 0 hands the buffer to the writer thread every ``flush_s``
        seconds, and :meth:`close`, leaving a ``with`` block, or the interpreter's exit
        (``atexit``) write the rest. A process killed outright (SIGKILL, out of memory) loses
        at most the last ``flush_s`` seconds of steps and whatever the writer had not written.

        Args:
            samples: samples this process trained on in the step.
            loss: the loss, a number or a tensor (converted only in the writer thread, a batch
                at a time, so the monitor adds no per-step device synchronisation). Only the
                losses a sink shows are kept (and checked), from the first step on.
            tokens: tokens in the step, for tokens/s (language models).
            data_wait_s: time blocked on data, when not measured by :meth:`data`.
            **extra: more numbers to log (TensorBoard ``extra/<name>``).
        """
        # The common call (an int sample count and a loss) costs one clock read, two list
        # appends and a handful of comparisons: tokens, data waits and extra fields arrive in
        # ``more``, two tests when absent (docs/benchmarks.md, "Monitor overhead", has the figures)
        now = time.perf_counter()
        if more:  # tokens, a data wait, extra fields: checked before anything is recorded
            check_more(more)
        if samples.__class__ is not int or not 0 <= samples <= MAX_SAMPLES:  # the usual int: one test
            samples = check_samples(samples)  # raises before anything is recorded
        n = self._step + 1
        if n % self._loss_every == 0 and loss is not None:
            if loss.__class__ is not self._loss_class:
                check_loss(loss)  # once per loss type, not per step; raises before anything is recorded
                self._loss_class = loss.__class__
                if self._writer is None:  # no sink here: the first loss is checked, none is kept
                    self._loss_every = NEVER
            # kept as given: converting a tensor here (.item(), 3-4 us in a real loop) would cost
            # more than the rest of the step path; the writer converts a batch in one call
            self._kept[n] = loss
        self._put_end(now)
        self._put_samples(samples)
        self._step = n
        if more or self._comm is not None:
            self._record_more(n, more)
        if n == self._next_exchange:
            self._exchange()
        if now >= self._hand_at:
            self._hand_over(now)

    def _record_more(self, n: int, more: dict[str, Any]) -> None:
        """The less common parts of a step: tokens, a given data wait, extra fields, the comm wait."""
        if more:
            self._cols.add_more(n, more)
        if self._comm is not None and (comm := self._comm.take()) is not None:
            self._cols.comms[n] = comm

    # ------------------------------------------------------------------ off the step path
    def _mfu_scale(self) -> float | None:
        flops = self.config.flops_per_sample
        return flops / self.peak_flops if flops and self.peak_flops else None

    def _account(self) -> None:
        """Fold the steps buffered since the last call into the window and run statistics."""
        if self._accounted < len(self._cols):
            self._stats.add(self._cols, self._accounted)
            self._accounted = len(self._cols)

    def _restart_buffer(self) -> None:
        """Start new columns after the buffered steps (handed over or folded in)."""
        self._cols = cols = self._cols.following()
        self._put_end, self._put_samples, self._kept = cols.ends.append, cols.samples.append, cols.losses
        self._accounted = 0

    def _hand_over(self, now: float | None = None) -> None:
        """Give the buffered steps to the writer thread (rank 0), with the peak memory so far."""
        self._hand_at = (time.perf_counter() if now is None else now) + self._flush_after
        self._account()
        if self._writer is not None and self._writer.error is not None:
            self._write_failed_once(self._writer.error)
        if len(self._cols) and self._writer is not None:
            mem = peak_memory_gb(self.device)  # read once per batch rather than once per step
            self._peak_mem = max(self._peak_mem, mem)
            self._writer.write(StepBatch(self._cols, mem_gb=mem, world_size=self.world_size,
                                         mfu_scale=self._mfu_scale(),
                                         # 1: every loss was kept, the sink may space the lines itself
                                         line_every=self._line_every if self._line_every > 1 else None))
            # from the batch just handed over: the JSONL stride and which losses to keep next
            self._line_every, self._loss_every = retune(self._strides, self._cols, self._step,
                                                        self._line_every, self._loss_every)
        self._restart_buffer()

    def _my_window(self) -> RankWindow:
        step_s, comm_s, wait_frac = self._stats.take_window()
        return RankWindow(rank=self.rank, host=self.host, device=self.device, step_s=step_s,
                          comm_wait_s=comm_s, data_wait_frac=wait_frac, num_workers=self.config.num_workers,
                          node=self._node, device_id=self._device_id,
                          node_samples=self.sampler.snapshot() if self.sampler is not None else None)

    def _exchange(self) -> None:
        """Share this window's statistics: the slowest step time reaches every rank (all derive the
        next exchange from it), the windows reach rank 0 only, which turns them into findings."""
        self._account()
        self._exchanged_at = self._step
        if self._writer is None:  # nothing to write here: the statistics are all that is kept
            self._restart_buffer()
        elif len(self._cols) >= BUFFER_STEPS:  # a long flush_s with very short steps: bounded memory
            self._hand_over()
        mine = self._my_window()
        slowest, gathered = self._gather(mine.to_dict(), mine.step_s)
        self._next_exchange = self._step + monitor_interval(slowest, self.every, spaced=self._spaced)
        if gathered is None:   # not rank 0: its window is on its way, nothing comes back
            return
        windows = windows_of(gathered)
        if self._device_mode == "remote":  # rank 0 sees its node's sampler in the windows at once
            samplers = {(w.host, w.node): w.node_samples for w in windows if w.node_samples is not None}
            self._device_seen = lookup(samplers.get((self.host, self._node)), mine.device_id)
        for finding in self._health.update(windows, step=self._step):
            self._findings.append(finding)
            if self._writer is not None:
                self._writer.event(finding.to_dict())

    def _gather(self, record: dict[str, Any], step_s: float) -> tuple[float, list[Any] | None]:
        """(the slowest rank's ``step_s``, every rank's ``record`` on rank 0 / None elsewhere):
        a collective (:mod:`scaletrain.observe.exchange`); ``[record]`` alone."""
        dist = live_dist()
        if dist is None or self.world_size == 1:
            return step_s, [record]
        return exchange.gather_records(record, step_s, rank=self.rank, world=self.world_size,
                                       comm=exchange.comm_for(dist))

    def _totals(self, own: float | None) -> tuple[float, int]:
        """(the ranks' samples/s per device summed, how many ranks had none): one reduction."""
        dist = live_dist()
        mine = [float(own or 0.0), 0.0 if own is not None else 1.0]
        if dist is None or self.world_size == 1:
            return mine[0], int(mine[1])
        total, unknown = exchange.reduce(mine, "sum", comm=exchange.comm_for(dist))
        return total, int(unknown)

    def _remote_figures(self) -> dict[str, Any] | None:
        """This rank's device figures over the run, from its node's sampler (a collective of every
        rank): the samplers' figures and every rank's device go to rank 0, which sends each rank
        its own device's line back. None without a process group."""
        dist = live_dist()
        if dist is None or self.world_size == 1:
            return None
        overall = self.sampler.overall() if self.sampler is not None else None
        comm = exchange.comm_for(dist)
        _, gathered = exchange.gather_records([self.host, self._node, self._device_id, overall], 0.0,
                                              rank=self.rank, world=self.world_size, comm=comm)
        answers = None
        if gathered is not None:
            samplers = {(h, n): o for h, n, _, o in gathered if o is not None}
            answers = [lookup(samplers.get((h, n)), d) for h, n, d, _ in gathered]
        return exchange.scatter_records(answers, rank=self.rank, comm=comm)

    def _device_util(self) -> dict[str, Any]:
        """This rank's device figures over the run (the sampling rank) or as last exchanged."""
        if self.sampler is not None:
            return lookup(self.sampler.overall(), self._device_id)
        return self._device_seen or {"available": False,
                                     "reason": "sampled by the lowest local rank; its figures come at close()"}

    def summary(self) -> Record:
        """The run so far: medians and rates over the steps after warm-up."""
        self._account()
        self._peak_mem = max(self._peak_mem, peak_memory_gb(self.device))
        out: Record = {"steps": self._step, "wall_s": time.perf_counter() - self._t0,
                       "world_size": self.world_size, "device": self.device,
                       "warmup_steps": min(self.config.warmup, self._step), "total_samples": self._stats.samples,
                       **self._stats.run_figures(world_size=self.world_size, mfu_scale=self._mfu_scale()),
                       "peak_mem_gb": self._peak_mem, "grad_bytes": self.grad_bytes,
                       "mem_kind": "device max allocated" if self.device.startswith("cuda") else "process peak RSS",
                       "findings": [f.to_dict() for f in self._findings]}
        if self._device_mode != "off":
            out["device_util"] = self._device_util()
        return out

    def close(self) -> Record:
        """Exchange a last time, write the summary (rank 0) and stop the threads."""
        if self._closed:
            return self.summary()
        self._closed = True
        atexit.unregister(self._at_exit)
        if self._step > self._exchanged_at:
            self._exchange()
        self._hand_over()
        own = self.summary().get("samples_per_s_per_device")
        total, unknown = self._totals(own)
        figures = self._remote_figures()   # a collective of every rank
        if self._device_mode == "remote":  # the whole run's figures from this node's sampler
            self._device_seen = figures
        summary = self.summary()
        if self.world_size > 1 and not unknown:   # exact global throughput: summed over ranks
            summary["samples_per_s"] = total
        if self.sampler is not None:
            self.sampler.close()
        if self.rank == 0 and self.run_dir is not None:   # where to look, said with the summary
            summary.update(run_files(self.run_dir, self.sinks))
        self._close_writer(summary)
        if self.rank == 0 and self.run_dir is not None:
            try:
                atomic_write(self.run_dir / SUMMARY_FILE, json_text(summary, indent=2, default=str) + "\n")
            except OSError as exc:
                self._write_failed_once(exc)
        return summary

    def _close_writer(self, summary: Record) -> None:
        if self._writer is not None:
            try:
                self._writer.close(summary)
            except OSError as exc:  # a full disk or a vanished folder: warn, never end the training
                self._write_failed_once(exc)

    def _write_failed_once(self, exc: BaseException) -> None:
        if not self._write_failed:
            self._write_failed = True
            warn_write_failure(self.run_dir, exc)

    def _close_locally(self) -> None:
        """Write what was measured, without a collective (other ranks may never reach one)."""
        self._closed = True
        atexit.unregister(self._at_exit)
        if self.sampler is not None:
            self.sampler.close()
        self._hand_over()
        self._close_writer(self.summary())

    def _at_exit(self) -> None:
        if not self._closed:
            try:
                self._close_locally()
            except Exception:  # noqa: BLE001 - at exit there is no one left to tell
                pass

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
            return
        self._close_locally()  # an exception: keep what was measured, no collective
