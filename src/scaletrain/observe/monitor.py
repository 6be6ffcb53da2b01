"""``scaletrain.Monitor``: per-step metrics that are cheap enough to leave on.

Typical use::

    monitor = scaletrain.Monitor("runs/exp1", total_steps=len(loader) * epochs)
    monitor.watch(model)                        # optional: DDP all-reduce wait per rank
    for batch in monitor.data(loader):          # measures time blocked on the loader
        loss = train_step(batch)
        monitor.step(samples=len(batch), loss=loss)
    monitor.close()                             # summary on rank 0, summary.json in run_dir

Per step it records step time, throughput (samples/s and tokens/s, global and per device),
the data-wait fraction, peak memory (device memory on a GPU, the process's peak RSS on the
CPU) and model FLOP utilisation when FLOPs per sample are given. The step path does only a
clock read, a few additions and a tuple append; every ``every`` steps (default 100) the buffered tuples go to a
writer thread (:mod:`scaletrain.observe.writer`) that builds the records, converts losses (one
call for the batch, so the monitor adds no per-step device synchronisation) and writes the
sinks. Also every ``every`` steps the ranks exchange one small record each (an
``all_gather_object``, on the training thread), from which rank 0 names stragglers and idle
devices.

``step()`` and ``close()`` must be called the same number of times on every rank (as the
training loop does), because of that exchange. ``samples`` is this process's batch: the
global figure is ``samples x world_size`` per step, summed exactly over ranks in the summary.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Iterator

from scaletrain.errors import UsageError
from scaletrain.fileio import atomic_write
from scaletrain.observe.commwait import CommWait
from scaletrain.observe.health import Finding, HealthTracker, RankWindow
from scaletrain.observe.sinks import ConsoleSink, JsonlSink, Record, Sink, TensorBoardSink
from scaletrain.observe.writer import SinkWriter


RECENT_STEPS = 10_000  # step times kept for the summary's median (the last ones)


def _dist() -> Any | None:
    """torch.distributed when a process group is up (without importing torch otherwise)."""
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _number(value: Any) -> float | None:
    """A float from a number or a one-element tensor (this synchronises a GPU tensor)."""
    if value is None:
        return None
    return float(value.item()) if hasattr(value, "item") else float(value)


def _numbers(values: list[Any]) -> list[float | None]:
    """Floats from numbers and one-element tensors: the tensors in one call (one device sync)."""
    tensors = [v for v in values if hasattr(v, "detach") and v.numel() == 1]
    if len(tensors) > 1:
        import torch

        with torch.no_grad():
            try:
                flat = torch.stack([t if t.dim() == 0 else t.reshape(()) for t in tensors]).tolist()
            except RuntimeError:  # tensors on different devices: one by one
                flat = [t.item() for t in tensors]
        it = iter(flat)
        return [next(it) if (hasattr(v, "detach") and v.numel() == 1) else _number(v) for v in values]
    return [_number(v) for v in values]


class Monitor:
    """Measure each training step and report it (see the module docstring).

    Args:
        run_dir: folder for ``metrics.jsonl``, ``summary.json`` and ``tensorboard/`` (rank 0
            writes them). None: console only.
        total_steps: steps in the run, for the progress bar and ETA.
        console: print progress on rank 0 (a bar on a terminal, a line every ``log_every``
            steps elsewhere).
        jsonl: write ``run_dir/metrics.jsonl``.
        tensorboard: write TensorBoard event files to ``run_dir/tensorboard`` (needs the
            ``monitor`` extra).
        every: steps between flushes to the sinks and cross-rank exchanges.
        warmup: first steps left out of the summary's medians and rates (compilation, caches).
        flops_per_sample: training FLOPs per sample (forward + backward), for MFU; see
            :func:`scaletrain.observe.flops.count_train_flops`.
        peak_flops: the device's peak FLOP/s; default from a table of datasheet figures.
        device_sampler: "auto" (NVML/AMD SMI for this rank's GPU), None (off), or an object with
            ``snapshot()``, ``overall()`` and ``close()`` (tests pass a fake one).
        num_workers: the loader's worker count, quoted in idle-device hints.
        env: the process's :class:`scaletrain.Env`; default: the one ``scaletrain.init()`` made.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *, total_steps: int | None = None,
                 console: bool = True, jsonl: bool = True, tensorboard: bool = False,
                 every: int = 100, log_every: int = 10, warmup: int = 1,
                 flops_per_sample: float | None = None, peak_flops: float | None = None,
                 device_sampler: Any = "auto", num_workers: int | None = None,
                 env: Any = None, stream: Any = None) -> None:
        if every < 1 or log_every < 1 or warmup < 0:
            raise UsageError("Monitor: every and log_every must be >= 1 and warmup >= 0",
                             "e.g. Monitor(run_dir, every=100, log_every=10, warmup=1)")
        if total_steps is not None and total_steps < 1:
            raise UsageError(f"Monitor: total_steps must be positive, got {total_steps}",
                             "leave it out when the number of steps is not known")
        self.env = env if env is not None else self._current_env()
        self.rank = self.env.rank if self.env is not None else 0
        self.world_size = self.env.world_size if self.env is not None else 1
        self.device = self.env.device if self.env is not None else "cpu"
        self.host = socket.gethostname()
        self.total_steps = total_steps
        self.every = every
        self.warmup = warmup
        self.flops_per_sample = flops_per_sample
        self.num_workers = num_workers
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.peak_flops = peak_flops if peak_flops is not None else self._peak_flops()

        self.sinks: list[Sink] = []
        if self.rank == 0:
            if console:
                self.sinks.append(ConsoleSink(total=total_steps, every=log_every, stream=stream))
            if self.run_dir is not None:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                if jsonl:
                    self.sinks.append(JsonlSink(self.run_dir / "metrics.jsonl"))
                if tensorboard:
                    self.sinks.append(TensorBoardSink(self.run_dir / "tensorboard"))
        elif tensorboard:  # same error on every rank when the extra is missing
            try:
                import tensorboard as _tb  # noqa: F401
            except ImportError:
                TensorBoardSink("/nonexistent")  # raises the UsageError with the hint

        self._writer = SinkWriter(self.sinks, self._build) if self.sinks else None
        if device_sampler == "auto":
            from scaletrain.observe.devices import sampler_for_device

            device_sampler = sampler_for_device(self.device)
        self.sampler = device_sampler
        self._health = HealthTracker()
        self._comm: CommWait | None = None
        self._cuda = self.device.startswith("cuda")

        self._t0 = time.perf_counter()
        self._last: float | None = None
        self._wait = 0.0
        self._step = 0
        self._buffer: list[tuple[Any, ...]] = []  # raw tuples; records are built off this thread
        self._window: list[tuple[float, float, float | None]] = []  # (step_s, wait_s, comm_s)
        # after warm-up: running sums (time, wait, samples, tokens, steps) and the recent step
        # times for the median, bounded so that a million-step run holds no million tuples
        self._sums = [0.0, 0.0, 0, 0, 0]
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._samples = 0
        self._findings: list[Finding] = []
        self._peak_mem = 0.0
        self._closed = False
        self.grad_bytes: int | None = None

    # ------------------------------------------------------------------ set-up helpers
    @staticmethod
    def _current_env() -> Any:
        from scaletrain.runtime.init import current

        return current()

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
        """Start the clock of the first step now (default: the first batch fetch or step)."""
        self._last = time.perf_counter()

    def data(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``iterable``, adding the time blocked in each ``next()`` to the data wait."""
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            if self._last is None:
                self._last = t0
            try:
                item = next(it)
            except StopIteration:
                return
            self._wait += time.perf_counter() - t0
            yield item

    def step(self, *, samples: int, tokens: int | None = None, loss: Any = None,
             data_wait_s: float | None = None, **extra: Any) -> None:
        """Record one finished training step of this process.

        Args:
            samples: samples this process trained on in the step.
            tokens: tokens in the step, for tokens/s (language models).
            loss: the loss, a number or a tensor (converted only at the next flush).
            data_wait_s: time blocked on data, when not measured by :meth:`data`.
            extra: more numbers to log (TensorBoard ``extra/<name>``).
        """
        now = time.perf_counter()
        start = self._last if self._last is not None else self._t0
        step_s = max(now - start, 1e-9)
        self._last = now
        wait = self._wait if data_wait_s is None else float(data_wait_s)
        self._wait = 0.0
        self._step += 1
        comm = self._comm.take() if self._comm is not None else None
        self._window.append((step_s, wait, comm))
        if self._step > self.warmup:
            sums = self._sums
            sums[0] += step_s
            sums[1] += wait
            sums[2] += samples
            sums[3] += tokens or 0
            sums[4] += 1
            self._recent.append(step_s)
        self._samples += samples
        if self.rank == 0:  # a tuple now; the record (and the loss as a number) at the flush
            self._buffer.append((self._step, now - self._t0, step_s, samples, tokens, loss, wait, extra))
        if self._step % self.every == 0:
            self._flush()

    def _memory_gb(self) -> float:
        if self._cuda:
            import torch

            return torch.cuda.max_memory_allocated(self.device) / 1024 ** 3
        # ru_maxrss is in KiB on Linux (bytes on macOS)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / (1024 ** 3 if sys.platform == "darwin" else 1024 ** 2)

    # ------------------------------------------------------------------ off the step path
    def _build(self, steps: list[Any], mem: float) -> list[Record]:
        """Buffered step tuples as records (in the writer thread): losses converted in one call."""
        losses = _numbers([b[5] for b in steps])
        records = []
        for (step, t, step_s, samples, tokens, _, wait, extra), loss in zip(steps, losses):
            rec: Record = {"step": step, "t": t, "step_s": step_s, "samples": samples, "loss": loss,
                           "data_wait_s": wait, "peak_mem_gb": mem,
                           "samples_per_s": samples * self.world_size / step_s,
                           "samples_per_s_per_device": samples / step_s,
                           "data_wait_frac": min(1.0, wait / step_s)}
            if tokens:  # fields that do not apply are left out, not written as null
                rec["tokens"] = tokens
                rec["tokens_per_s"] = tokens * self.world_size / step_s
            if self.flops_per_sample and self.peak_flops:
                rec["mfu"] = self._mfu(samples, step_s)
            for key, value in extra.items():
                rec[key] = _number(value) if hasattr(value, "item") else value
            records.append(rec)
        return records

    def _mfu(self, samples: float, step_s: float) -> float | None:
        if not self.flops_per_sample or not self.peak_flops:
            return None
        return self.flops_per_sample * samples / step_s / self.peak_flops

    def _hand_over(self) -> None:
        """Give the buffered steps to the writer thread (rank 0), with the peak memory so far."""
        if self._buffer and self._writer is not None:
            mem = self._memory_gb()  # read once per flush rather than once per step
            self._peak_mem = max(self._peak_mem, mem)
            self._writer.records(self._buffer, mem)
        self._buffer = []

    def _flush(self) -> None:
        self._hand_over()
        self._exchange()

    def _my_window(self) -> RankWindow:
        steps = [s for s, _, _ in self._window] or [0.0]
        total = sum(steps) or 1e-9
        comms = [c for _, _, c in self._window if c is not None]
        util = None
        if self.sampler is not None:
            snap = self.sampler.snapshot()
            if snap.get("available") and snap.get("util_pct") is not None:
                util = float(snap["util_pct"])
        win = RankWindow(rank=self.rank, host=self.host, device=self.device,
                         step_s=statistics.median(steps),
                         comm_wait_s=statistics.median(comms) if comms else None,
                         data_wait_frac=sum(w for _, w, _ in self._window) / total,
                         util_pct=util, num_workers=self.num_workers)
        self._window = []
        return win

    def _exchange(self) -> None:
        """Share this window's statistics; rank 0 turns them into findings."""
        mine = self._my_window()
        dist = _dist()
        if dist is not None and self.world_size > 1:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine.to_dict())
            windows = [RankWindow(**g) for g in gathered]
        else:
            windows = [mine]
        if self.rank != 0:
            return
        for finding in self._health.update(windows, step=self._step):
            self._findings.append(finding)
            if self._writer is not None:
                self._writer.event(finding.to_dict())

    def summary(self) -> Record:
        """The run so far: medians and rates over the steps after warm-up."""
        self._peak_mem = max(self._peak_mem, self._memory_gb())
        time_s, wait_s, samples, tokens, count = self._sums
        recent = list(self._recent)
        out: Record = {"steps": self._step, "wall_s": time.perf_counter() - self._t0,
                       "world_size": self.world_size, "device": self.device,
                       "warmup_steps": min(self.warmup, self._step), "total_samples": self._samples,
                       "step_s_median": statistics.median(recent) if recent else None,
                       "step_s_mean": time_s / count if count else None,
                       "peak_mem_gb": self._peak_mem, "grad_bytes": self.grad_bytes,
                       "mem_kind": "device max allocated" if self._cuda else "process peak RSS",
                       "findings": [f.to_dict() for f in self._findings]}
        if count and time_s > 0:
            out["samples_per_s_per_device"] = samples / time_s
            out["samples_per_step"] = samples / count
            out["samples_per_s"] = samples * self.world_size / time_s
            out["tokens_per_s"] = tokens * self.world_size / time_s if tokens else None
            out["data_wait_frac"] = wait_s / time_s
            out["mfu"] = self._mfu(samples, time_s) if samples else None
        if self.sampler is not None:
            out["device_util"] = self.sampler.overall()
        return out

    def close(self) -> Record:
        """Flush, exchange a last time, write the summary (rank 0) and stop the sampler."""
        if self._closed:
            return self.summary()
        self._closed = True
        if self._buffer or self._window:
            self._flush()
        summary = self.summary()
        dist = _dist()
        if dist is not None and self.world_size > 1:  # exact global throughput: sum over ranks
            rates: list[Any] = [None] * self.world_size
            dist.all_gather_object(rates, summary.get("samples_per_s_per_device"))
            if all(r is not None for r in rates):
                summary["samples_per_s"] = float(sum(rates))
        if self.sampler is not None:
            self.sampler.close()
        if self._writer is not None:
            self._writer.close(summary)
        if self.rank == 0 and self.run_dir is not None:
            atomic_write(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        return summary

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
            return
        # an exception: no collective (other ranks may never reach it); keep what was measured
        self._closed = True
        if self.sampler is not None:
            self.sampler.close()
        self._hand_over()
        if self._writer is not None:
            self._writer.close(self.summary())
