"""Is every rank earning its keep? Stragglers and idle devices from cross-rank statistics.

Every ``every`` steps each rank contributes a :class:`RankWindow` (its step times, data wait,
time waiting for other ranks in gradient all-reduces, device utilisation); rank 0 passes the
list to :class:`HealthTracker.update`, which returns findings to report.

- A *straggler* is a rank whose busy time (step time less the time it waited for the others in
  collectives) stays above ``1.2 x`` the median of the other ranks for ``patience`` windows in a
  row. In a data-parallel loop every rank's *step* time is the same (they meet in the
  all-reduce each step), so the wait has to come out; without comm timing (``Monitor.watch``
  not called) the step time itself is compared, which finds stragglers in loops that do not
  synchronise every step.
- An *idle* device is busy less than ``idle_util_pct`` percent of the sampled time; the likely
  cause follows from the data-wait fraction. The utilisation comes from the node's one sampler
  (:mod:`scaletrain.observe.devices`), whose figures travel in its rank's window and are
  matched to each rank's device by :func:`attach_samples`.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from scaletrain.observe.devices import lookup


@dataclass(frozen=True, kw_only=True)
class RankWindow:
    """One rank's statistics over the last aggregation window."""

    rank: int
    host: str
    device: str
    step_s: float                      # median step time in the window
    comm_wait_s: float | None = None   # median time per step spent in gradient all-reduces
    data_wait_frac: float = 0.0        # share of the window's time blocked on the data loader
    util_pct: float | None = None      # device utilisation (sampler), None when unavailable
    num_workers: int | None = None     # the loader's worker processes, when known
    node: int = 0                      # node rank: with host, which sampler covers this rank
    device_id: str | None = None       # the device's node-level id (devices.device_key)
    node_samples: dict[str, Any] | None = None  # the node sampler's snapshot, from its rank only

    @property
    def busy_s(self) -> float:
        """Step time less the time spent waiting for others (a lower bound of 0)."""
        return max(0.0, self.step_s - (self.comm_wait_s or 0.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class HealthFinding:
    """Something a user should know about, with the rank, host and a hint."""

    kind: str                          # "straggler" | "idle"
    rank: int
    host: str
    message: str
    hint: str
    step: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def attach_samples(windows: list[RankWindow]) -> list[RankWindow]:
    """Each rank's device utilisation from the sampler of its node (matched by host, node, id)."""
    samplers = {(w.host, w.node): w.node_samples for w in windows if w.node_samples is not None}
    out = []
    for w in windows:
        figures = _reading(samplers, w.host, w.node, w.device_id)
        out.append(w if figures is None else replace(w, util_pct=figures[0], device_id=figures[1]))
    return out


def windows_of(records: list[dict[str, Any]]) -> list[RankWindow]:
    """:func:`attach_samples` of the windows in ``records`` (``RankWindow.to_dict`` of each, as the
    exchange brings them), each window made once: at 24,000 ranks a copy per window costs more
    than the rest of the exchange."""
    samplers = {(r["host"], r["node"]): r["node_samples"] for r in records if r.get("node_samples") is not None}
    out = []
    for r in records:
        figures = _reading(samplers, r["host"], r["node"], r.get("device_id"))
        if figures is not None:
            r = {**r, "util_pct": figures[0], "device_id": figures[1]}
        out.append(RankWindow(**r))
    return out


def _reading(samplers: dict[tuple[str, int], Any], host: str, node: int,
             device_id: str | None) -> tuple[float, str] | None:
    """(utilisation, the sampler's id of the device) read in this window, or None.

    Only figures read in the window count (a UUID becomes the index): a window without a
    reading (samples 0, the latest repeated) says nothing about it."""
    figures = lookup(samplers.get((host, node)), device_id)
    if figures.get("available") and figures.get("util_pct") is not None and figures.get("samples", 1):
        return figures["util_pct"], figures["device"]
    return None


def medians_of_others(values: list[float]) -> list[float | None]:
    """For each value, the median of all the others (None for a single value).

    One sort for all of them: without one value, the median of the rest is one or two of the
    sorted values next to the middle, shifted by one where the value left out sat before them.
    (A median per rank over a copy of the others was N sorts of N values on rank 0: minutes at
    24,000 ranks, every exchange.)
    """
    n = len(values)
    if n < 2:
        return [None] * n
    ordered = sorted(values)
    rest = n - 1

    def kept(k: int, gone: int) -> float:   # the k-th smallest of the others
        return ordered[k] if k < gone else ordered[k + 1]

    out: list[float | None] = []
    for v in values:
        gone = bisect.bisect_left(ordered, v)   # any copy of v leaves the same others
        if rest % 2:
            out.append(kept(rest // 2, gone))
        else:
            out.append((kept(rest // 2 - 1, gone) + kept(rest // 2, gone)) / 2)
    return out


def stragglers(windows: list[RankWindow], *, ratio: float = 1.2) -> list[tuple[RankWindow, float]]:
    """Ranks whose busy time exceeds ``ratio`` times the median of the others, with the factor."""
    busy = [w.busy_s for w in windows]
    found = []
    for w, b, median in zip(windows, busy, medians_of_others(busy)):
        if median and median > 0 and b > ratio * median:
            found.append((w, b / median))
    return found


def idle_cause(w: RankWindow) -> tuple[str, str]:
    """The likely cause of an idle device, and the hint that goes with it.

    The data wait is a share of the step time, as the device's idle time is (100% less its
    utilisation): when the wait is most of the idle time (or 30% of the time and more) the
    loader is the cause; otherwise the step leaves the device idle on its own (the CPU does
    not give it work fast enough: small kernels, launches, host-side work), and a wait of
    10% or more is named beside it. The message quotes the figures it is drawn from.
    """
    wait = w.data_wait_frac * 100
    idle = 100.0 - (w.util_pct or 0.0)
    workers = f" (now {w.num_workers})" if w.num_workers is not None else ""
    loader = (f"raise the loader's num_workers{workers} and --cpus-per-task to match, and stage the "
              "data to node-local disk (scaletrain plan --stage-data) instead of reading a shared "
              "file system")
    step = ("raise the per-GPU batch size, use mixed precision (precision='bf16') or "
            "torch.compile, or look for host-side work (.item(), logging, CPU transforms) in the step")
    if wait >= 30 or wait >= idle / 2:
        return f"the data loader: {wait:.0f}% of the time is spent waiting for batches", loader
    own = f"the step itself ({w.step_s * 1000:.1f} ms a step): the GPU waits for the CPU to give it work"
    if wait >= 10:
        return (f"mostly {own}; partly the data loader, waited for {wait:.0f}% of the time",
                f"{step}; then {loader}")
    return f"{own}, not the data loader (data wait {wait:.0f}%)", step


@dataclass
class HealthTracker:
    """Keeps findings persistent over windows so one noisy window does not name a rank."""

    ratio: float = 1.2
    patience: int = 2
    idle_util_pct: float = 30.0
    _streak: dict[int, int] = field(default_factory=dict)
    _reported: set[tuple[str, int]] = field(default_factory=set)

    def update(self, windows: list[RankWindow], *, step: int = 0) -> list[HealthFinding]:
        """Findings from this window (each kind and rank reported once per run)."""
        out: list[HealthFinding] = []
        slow = {w.rank: factor for w, factor in stragglers(windows, ratio=self.ratio)}
        for w in windows:
            self._streak[w.rank] = self._streak.get(w.rank, 0) + 1 if w.rank in slow else 0
            if self._streak[w.rank] >= self.patience and ("straggler", w.rank) not in self._reported:
                self._reported.add(("straggler", w.rank))
                what = "busy time" if w.comm_wait_s is not None else "step time"
                cause = (f"; it waits for data {w.data_wait_frac * 100:.0f}% of the time"
                         if w.data_wait_frac >= 0.2 else "")
                out.append(HealthFinding(
                    kind="straggler", rank=w.rank, host=w.host, step=step,
                    message=(f"rank {w.rank} on {w.host} ({w.device}) is a straggler: its {what} "
                             f"{w.busy_s * 1000:.1f} ms is {slow[w.rank]:.1f}x the other ranks' "
                             f"median for {self._streak[w.rank]} windows{cause}; every rank waits for it"),
                    hint=("check that host for other jobs or a throttled GPU (nvidia-smi -q -d "
                          "PERFORMANCE), its data path, and its CPU binding; exclude a bad node "
                          "with sbatch --exclude=HOST")))
        for w in windows:
            if (w.util_pct is not None and w.util_pct < self.idle_util_pct
                    and ("idle", w.rank) not in self._reported):
                self._reported.add(("idle", w.rank))
                cause, hint = idle_cause(w)
                gpu = f" (GPU {w.device_id} of the node)" if w.device_id is not None else ""
                out.append(HealthFinding(
                    kind="idle", rank=w.rank, host=w.host, step=step,
                    message=(f"rank {w.rank} on {w.host}: {w.device}{gpu} is busy only {w.util_pct:.0f}% "
                             f"of the time; likely cause: {cause}"),
                    hint=hint))
        return out
