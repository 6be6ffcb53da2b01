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
agreement follows too) the ranks exchange one small record each (an ``all_gather_object``, on
the training thread), from which rank 0 names stragglers and idle devices; the node's device
sampler (one thread per node, on its lowest local rank) sends its figures in that exchange.

``step()`` and ``close()`` must be called the same number of times on every rank (as the
training loop does), because of that exchange. ``samples`` is this process's batch: the
global figure is ``samples x world_size`` per step, summed exactly over ranks in the summary.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from scaletrain.errors import UsageError
from scaletrain.fileio import atomic_write
from scaletrain.observe.commwait import CommWait
from scaletrain.observe.devices import DeviceSampler, device_key, lookup, node_sampler, samples_here
from scaletrain.observe.inputs import check_loss, check_samples, warn_write_failure
from scaletrain.observe.health import Finding, HealthTracker, RankWindow, attach_samples
from scaletrain.observe.records import DENSE_STEPS, NEVER, Record, StepBatch, loss_stride, spaced_every
from scaletrain.observe.sinks import JsonlSink, Sink, build_sinks, run_files, start_record
from scaletrain.observe.steplog import StepColumns
from scaletrain.observe.stepstats import StepStats
from scaletrain.observe.writer import SinkWriter
from scaletrain.runtime.cadence import MONITOR_EVERY, monitor_interval
from scaletrain.runtime.current import current_env, live_dist


BUFFER_STEPS = 10_000  # steps buffered at most, however long flush_s: checked at each exchange


class Monitor:
    """Measure each training step and report it (see the module docstring).

    Args:
        run_dir: folder for ``metrics.jsonl``, ``summary.json`` and ``tensorboard/`` (rank 0
            writes them). None: console only.
        total_steps: steps in the run, for the progress bar and ETA.
        console: print progress on rank 0 (a bar on a terminal, a line every ``log_every``
            steps elsewhere).
        jsonl: write ``run_dir/metrics.jsonl``.
        jsonl_every: a JSONL line for every N-th step. Left out: a line per step for the first
            100 steps, then about one per 10 ms of training, i.e. every step when steps take 10 ms
            or more (formatting a line costs ~1% of a 0.25 ms step; see docs/benchmarks.md).
            The summary, the console and the cross-rank checks see every step either way.
        tensorboard: write TensorBoard event files to ``run_dir/tensorboard`` (needs the
            ``monitor`` extra).
        every: steps between cross-rank exchanges (straggler and idle-device checks). Left
            out: 100, spaced further to about one exchange a second when steps are shorter
            than 10 ms (the ranks agree on it from the exchanged figures).
        flush_s: seconds between hand-overs of the buffered steps to the sinks: the console
            lags and a killed process loses at most this much (plus the writer's backlog).
        warmup: first steps left out of the summary's medians and rates (compilation, caches).
        flops_per_sample: training FLOPs per sample (forward + backward), for MFU; see
            :func:`scaletrain.observe.flops.count_train_flops`.
        peak_flops: the device's peak FLOP/s; default from a table of datasheet figures.
        device_sampler: "auto" (NVML/AMD SMI for the node's GPUs), None (off), or a backend:
            an object with ``read() -> {device id: Sample}`` and ``close()`` (tests pass a fake
            one). Either way only the node's lowest local rank samples; the others start nothing.
        device_id: this rank's device as the sampler names it; default
            :func:`scaletrain.observe.devices.device_key` of the device.
        num_workers: the loader's worker count, quoted in idle-device hints.
        env: the process's :class:`scaletrain.Env`; default: the one ``scaletrain.init()`` made.
        start_step: the step this run resumes from (what ``Checkpointer.load_latest`` returned);
            written in the run's ``start`` line of ``metrics.jsonl``, where ``scaletrain status``
            and ``report`` add it to this run's step numbers (which start at 1 in every run).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *, total_steps: int | None = None,
                 console: bool = True, jsonl: bool = True, jsonl_every: int | None = None, tensorboard: bool = False,
                 every: int | None = None, flush_s: float = 1.0, log_every: int = 10, warmup: int = 1,
                 flops_per_sample: float | None = None, peak_flops: float | None = None,
                 device_sampler: Any = "auto", device_id: str | None = None, num_workers: int | None = None,
                 env: Any = None, stream: Any = None, start_step: int = 0) -> None:
        self._spaced = every is None  # exchanges spaced by time unless a step count was asked for
        every = MONITOR_EVERY if every is None else every
        if (every < 1 or log_every < 1 or (jsonl_every is not None and jsonl_every < 1) or warmup < 0
                or not flush_s > 0):
            raise UsageError("Monitor: every, log_every and jsonl_every must be >= 1, flush_s > 0 and "
                             "warmup >= 0",
                             "e.g. Monitor(run_dir, every=100, flush_s=1.0, log_every=10, warmup=1)")
        if total_steps is not None and total_steps < 1:
            raise UsageError(f"Monitor: total_steps must be positive, got {total_steps}",
                             "leave it out when the number of steps is not known")
        self.env = env if env is not None else current_env()
        self.rank = self.env.rank if self.env is not None else 0
        self.world_size = self.env.world_size if self.env is not None else 1
        self.device = self.env.device if self.env is not None else "cpu"
        self.host = socket.gethostname()
        self.total_steps = total_steps
        self.every = every
        self.flush_s = flush_s
        self.warmup = warmup
        self.flops_per_sample = flops_per_sample
        self.num_workers = num_workers
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.peak_flops = peak_flops if peak_flops is not None else self._peak_flops()

        start = start_record(total_steps=total_steps, start_step=start_step, world_size=self.world_size,
                             device=self.device, host=self.host)
        self.sinks: list[Sink] = build_sinks(self.run_dir, rank=self.rank, console=console, jsonl=jsonl,
                                             jsonl_every=jsonl_every, tensorboard=tensorboard,
                                             total_steps=total_steps, log_every=log_every, stream=stream,
                                             start=start)

        self._writer = SinkWriter(self.sinks) if self.sinks else None
        self._setup_sampler(device_sampler, device_id)
        self._health = HealthTracker()
        self._comm: CommWait | None = None
        self._cuda = self.device.startswith("cuda")

        self._t0 = time.perf_counter()
        self._started = False        # the first step's start was set (start(), or data()'s first fetch)
        self._step = 0
        # the steps since the last hand-over, as columns; records are built off this thread
        self._cols = StepColumns(1, self._t0, self._t0)
        self._put_end, self._put_samples = self._cols.ends.append, self._cols.samples.append
        self._kept = self._cols.losses
        self._accounted = 0          # buffered steps already in the statistics below
        # Without a writer (ranks other than 0) nothing waits for a hand-over: the time check never fires
        self._flush_after = flush_s if self._writer is not None else math.inf
        self._hand_at = self._t0 + self._flush_after
        # losses kept for every N-th step only (records.loss_stride), retuned at each hand-over
        # (1 at first: every rank checks its first loss; ranks without a writer then keep none)
        self._loss_every = 1
        self._line_every = 1          # the spaced JSONL stride in force (records.spaced_every)
        self._strides = (any(isinstance(s, JsonlSink) for s in self.sinks), jsonl_every,
                         log_every if console else None, tensorboard)
        self._exchanged_at = 0
        self._next_exchange = every
        self._stats = StepStats(warmup)   # the window and the run, folded in off the step path
        self._findings: list[Finding] = []
        self._peak_mem = 0.0
        self._closed = False
        self._loss_class: type | None = None  # the loss type last checked (check_loss)
        self._write_failed = False
        self.grad_bytes: int | None = None
        if self._writer is not None:  # an exit without close() still writes what was measured
            atexit.register(self._at_exit)

    def _setup_sampler(self, device_sampler: Any, device_id: str | None) -> None:
        """One device sampler per node, on its lowest local rank; the others only name their device."""
        self._device_id = device_id if device_id is not None else device_key(self.device)
        self._device_seen: dict[str, Any] | None = None   # this device's figures, from the last exchange
        self.sampler: DeviceSampler | None = None
        self._node = self.env.node_rank if self.env is not None else 0
        if device_sampler is None:
            self._device_mode = "off"
            return
        local_rank = self.env.local_rank if self.env is not None else 0
        if not samples_here(local_rank):
            self._device_mode = "remote"  # the node's sampling rank reports this device
            return
        self._device_mode = "here"
        if device_sampler == "auto":
            self.sampler = node_sampler(self.device)
        else:
            self.sampler = DeviceSampler(device_sampler)

    # ------------------------------------------------------------------ set-up helpers
    def _peak_flops(self) -> float | None:
        if not self._is_cuda():
            return None
        import torch

        from scaletrain.observe.flops import peak_flops

        return peak_flops(torch.cuda.get_device_name(torch.device(self.device)))

    def _is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def watch(self, model: Any) -> bool:
        """Time DDP's gradient all-reduces of ``model`` (before its first forward pass).

        This separates a rank's own work from its wait for the others, which is what names a
        straggler in a synchronised loop, and records the gradient size for the scaling model
        (``scaletrain plan --explain RUN_DIR``). Returns False when ``model`` is not wrapped
        in DistributedDataParallel (then only the gradient size is recorded).
        """
        # the bytes DDP all-reduces per step: what the scaling model (plan --explain) needs
        self.grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        timer = CommWait()
        from scaletrain.observe.commwait import attach

        if attach(model, timer):
            self._comm = timer
            return True
        return False

    # ------------------------------------------------------------------ the step path
    def start(self) -> None:
        """Start the clock of the next step now (default: the end of the step before it; for
        the first step, the first batch fetch or the Monitor's creation)."""
        now = time.perf_counter()
        self._started = True
        if self._step == 0:
            self._cols.start = now
        else:
            self._cols.starts[self._step + 1] = now

    def data(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``iterable``, adding the time blocked in each ``next()`` to the data wait."""
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            if not self._started:
                self._started = True
                if self._step == 0:
                    self._cols.start = t0
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
        # appends and five comparisons: tokens, data waits and extra fields arrive in ``more``,
        # one test when absent (docs/benchmarks.md, "Monitor overhead", has the figures)
        now = time.perf_counter()
        if samples.__class__ is not int or samples < 0:  # the usual int costs one test
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
        cols = self._cols
        if more:
            tokens = more.pop("tokens", None)
            if tokens is not None:
                cols.tokens[n] = tokens
            if "data_wait_s" in more:
                wait = more.pop("data_wait_s")
                if wait is not None:  # given: it replaces what data() measured
                    cols.waits.pop(n, None)
                    if wait:
                        cols.waits[n] = float(wait)
            if more:
                cols.extras[n] = more
        if self._comm is not None:
            comm = self._comm.take()
            if comm is not None:
                cols.comms[n] = comm

    def _memory_gb(self) -> float:
        if self._cuda:
            import torch

            return torch.cuda.max_memory_allocated(self.device) / 1024 ** 3
        # ru_maxrss is in KiB on Linux (bytes on macOS)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / (1024 ** 3 if sys.platform == "darwin" else 1024 ** 2)

    # ------------------------------------------------------------------ off the step path
    def _mfu_scale(self) -> float | None:
        return self.flops_per_sample / self.peak_flops if self.flops_per_sample and self.peak_flops else None

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
            mem = self._memory_gb()  # read once per batch rather than once per step
            self._peak_mem = max(self._peak_mem, mem)
            self._writer.write(StepBatch(self._cols, mem_gb=mem, world_size=self.world_size,
                                         mfu_scale=self._mfu_scale(),
                                         # 1: every loss was kept, the sink may space the lines itself
                                         line_every=self._line_every if self._line_every > 1 else None))
            self._retune_losses()
        self._restart_buffer()

    def _retune_losses(self) -> None:
        """From the batch just handed over: the JSONL stride and which losses to keep next."""
        has_jsonl, fixed, console_every, tensorboard = self._strides
        if tensorboard:  # it logs every step's loss
            return
        line: int | None = None
        if has_jsonl:
            if fixed is None:
                self._line_every = spaced_every(self._cols) if self._step >= DENSE_STEPS else 1
            line = fixed or self._line_every
        self._loss_every = loss_stride(line, console_every)

    def _my_window(self) -> RankWindow:
        step_s, comm_s, wait_frac = self._stats.take_window()
        win = RankWindow(rank=self.rank, host=self.host, device=self.device, step_s=step_s,
                         comm_wait_s=comm_s, data_wait_frac=wait_frac, num_workers=self.num_workers,
                         node=self._node, device_id=self._device_id,
                         node_samples=self.sampler.snapshot() if self.sampler is not None else None)
        return win

    def _exchange(self) -> None:
        """Share this window's statistics; rank 0 turns them into findings."""
        self._account()
        self._exchanged_at = self._step
        if self._writer is None:  # nothing to write here: the statistics are all that is kept
            self._restart_buffer()
        elif len(self._cols) >= BUFFER_STEPS:  # a long flush_s with very short steps: bounded memory
            self._hand_over()
        mine = self._my_window()
        dist = live_dist()
        if dist is not None and self.world_size > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine.to_dict())
            windows = attach_samples([RankWindow(**g) for g in gathered])
        else:
            windows = attach_samples([mine])
        # every rank computes it from the same gathered windows: all agree on the step
        slowest = max(w.step_s for w in windows)
        self._next_exchange = self._step + monitor_interval(slowest, self.every, spaced=self._spaced)
        me = windows[self.rank] if len(windows) > self.rank else windows[0]
        if self._device_mode != "off":
            samplers = {(w.host, w.node): w.node_samples for w in windows if w.node_samples is not None}
            self._device_seen = lookup(samplers.get((self.host, self._node)), me.device_id)
        if self.rank != 0:
            return
        for finding in self._health.update(windows, step=self._step):
            self._findings.append(finding)
            if self._writer is not None:
                self._writer.event(finding.to_dict())

    def _device_util(self) -> dict[str, Any]:
        """This rank's device figures over the run (the sampling rank) or as last exchanged."""
        if self.sampler is not None:
            return lookup(self.sampler.overall(), self._device_id)
        return self._device_seen or {"available": False,
                                     "reason": "sampled by the lowest local rank; figures after the first exchange"}

    def summary(self) -> Record:
        """The run so far: medians and rates over the steps after warm-up."""
        self._account()
        self._peak_mem = max(self._peak_mem, self._memory_gb())
        out: Record = {"steps": self._step, "wall_s": time.perf_counter() - self._t0,
                       "world_size": self.world_size, "device": self.device,
                       "warmup_steps": min(self.warmup, self._step), "total_samples": self._stats.samples,
                       **self._stats.run_figures(world_size=self.world_size, mfu_scale=self._mfu_scale()),
                       "peak_mem_gb": self._peak_mem, "grad_bytes": self.grad_bytes,
                       "mem_kind": "device max allocated" if self._cuda else "process peak RSS",
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
        dist = live_dist()
        if dist is not None and self.world_size > 1:  # exact global throughput: sum over ranks
            mine = (self.summary().get("samples_per_s_per_device"), self.host, self._node,
                    self.sampler.overall() if self.sampler is not None else None)
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine)
            if self._device_mode == "remote":  # the whole run's figures from this node's sampler
                overall = {(h, n): o for _, h, n, o in gathered if o is not None}
                self._device_seen = lookup(overall.get((self.host, self._node)), self._device_id)
        else:
            gathered = []
        summary = self.summary()
        if gathered and all(g[0] is not None for g in gathered):
            summary["samples_per_s"] = float(sum(g[0] for g in gathered))
        if self.sampler is not None:
            self.sampler.close()
        if self.rank == 0 and self.run_dir is not None:   # where to look, said with the summary
            summary.update(run_files(self.run_dir, self.sinks))
        self._close_writer(summary)
        if self.rank == 0 and self.run_dir is not None:
            try:
                atomic_write(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
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
