"""A scaling model: step time and efficiency at N devices from one measured step.

Data parallelism (DDP) at N devices with the same per-device batch (weak scaling) does the same
compute per device plus a gradient all-reduce. Per step::

    comm(N)    = 2 (N-1)/N x gradient bytes / bus bandwidth + 2 (N-1) x latency   (ring all-reduce)
    hidden(N)  = min(comm(N), overlap x backward time)       (DDP overlaps buckets with backward)
    step(N)    = data wait + compute x contention(N) + comm(N) - hidden(N) + overhead(N)
    efficiency = step(1) / step(N)

``overhead(N)`` is the cost of running distributed at all (synchronisation, stragglers, launch,
bucket boundaries; :mod:`scaletrain.observe.overhead`): zero at 1, calibrated by a measured
2-process run or, without one, a published default with its range. So the model never says a
step at N > 1 is free: each prediction carries an efficiency range and whether it is calibrated.

The bus bandwidth is the intra-node one while the job fits on one node, else the inter-node
one. ``contention`` is 1 on GPUs; where the "devices" are CPU cores shared by several processes
(this machine, the ``local`` profile) it is how much slower a process runs when ``N`` of them and
the machine's other runnable threads (``background_load``) share the cores, than when one does:
``max(1, (load + N) / cores) / max(1, (load + 1) / cores)``; with no other load, ``N / cores``.

Time to solution for a fixed amount of work (samples) is ``startup + samples / (N x samples per
device per step) x step(N)``; billed GPU-hours count whole nodes where the cluster bills them.
The model ignores what it cannot know from one step: per-job start-up (pass ``startup_s`` when
known), evaluation and checkpoint pauses, file-system contention, and bandwidth lost to other
jobs' traffic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from scaletrain.observe.overhead import Overhead

# The profiles give peak link rates. What an all-reduce achieves (nccl-tests bus bandwidth) is
# lower: NVLink/xGMI rates are quoted for both directions together and a ring uses one, and
# protocols cost some more. These fractions turn a profile's peak into the model's bandwidth.
INTRA_ACHIEVED = 0.4     # of intra_node_gbps (bidirectional NVLink/xGMI figure)
INTER_ACHIEVED = 0.8     # of inter_node_gbps (per-direction NIC rate, all NICs of a node)
BACKWARD_SHARE = 2 / 3   # backward is about twice the forward: 2/3 of compute can hide comm
DEFAULT_THRESHOLD = 0.8  # recommend the largest N whose predicted efficiency stays above this
# Said wherever a range is printed: what a per-step model cannot know from one measured step
# (on JSC's whole-job times these cost up to 28 points at 128 GPUs, docs/benchmarks.md).
UNSEEN = ("the ranges are per training step: they leave out start-up, per-epoch pauses (evaluation, "
          "data-loader restarts), checkpoints and file-system contention, which whole-job times include")


@dataclass(frozen=True, kw_only=True)
class StepProfile:
    """One measured single-device step."""

    compute_s: float                 # forward + backward + optimizer, no communication
    grad_bytes: int                  # bytes all-reduced per step (parameters x gradient dtype)
    samples_per_step: int = 1        # per device
    data_wait_s: float = 0.0         # time blocked on the loader per step


@dataclass(frozen=True, kw_only=True)
class Links:
    """Bandwidths between devices and the node shape."""

    intra_gbs: float                 # achieved all-reduce bus bandwidth inside a node, GB/s
    inter_gbs: float | None          # ... between nodes, GB/s (None: single node only)
    devices_per_node: int            # GPUs (or worker processes on CPU) per node
    latency_s: float = 10e-6         # per ring step
    overlap: float = 0.8             # share of the backward that DDP overlaps with comm
    slots: int | None = None         # CPU: cores/threads; processes beyond them share cores
    background_load: float = 0.0     # CPU: runnable threads of other users (a shared machine)
    whole_nodes: bool = False        # the cluster bills whole nodes


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The model at one size."""

    n: int
    nodes: int
    step_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    data_wait_s: float
    efficiency: float
    limit: str                       # what costs most against perfect scaling
    overhead_s: float = 0.0          # the cost of running distributed at all (observe.overhead)
    efficiency_low: float = 1.0      # the range: overhead at the high end of its estimate ...
    efficiency_high: float = 1.0     # ... and at the low end
    calibrated: bool = False         # the overhead was measured (bench scaling), not the default

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def links_from_profile(profile: Any, *, overlap: float = 0.8) -> Links | None:
    """Links from a cluster profile's peak rates, or None when it has none."""
    if not profile.intra_node_gbps:
        return None
    inter = profile.inter_node_gbps / 8 * INTER_ACHIEVED if profile.inter_node_gbps else None
    whole = any(p.whole_node for p in profile.partitions.values()) or profile.mem_request == "whole_node"
    return Links(intra_gbs=profile.intra_node_gbps / 8 * INTRA_ACHIEVED, inter_gbs=inter,
                 devices_per_node=max(1, profile.gpus_per_node), overlap=overlap, whole_nodes=whole)


def comm_time(grad_bytes: int, n: int, bandwidth_gbs: float, latency_s: float) -> float:
    """Ring all-reduce time of ``grad_bytes`` on ``n`` devices at a bus bandwidth in GB/s."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * grad_bytes / (bandwidth_gbs * 1e9) + 2 * (n - 1) * latency_s


def _step(step: StepProfile, links: Links, n: int, share: float = 1.0) -> tuple[float, float, float, float, int]:
    nodes = math.ceil(n / links.devices_per_node)
    per_node = min(n, links.devices_per_node)
    bandwidth = links.intra_gbs if nodes == 1 else (links.inter_gbs or links.intra_gbs)
    comm = comm_time(step.grad_bytes, n, bandwidth, links.latency_s)
    contention = 1.0
    if links.slots:  # the scheduler shares the cores among ours and everyone else's threads
        slots = links.slots

        def crowding(k: int) -> float:
            return max(1.0, (links.background_load + k) / slots)
        contention = crowding(per_node) / crowding(1)
    compute = step.compute_s * share * contention
    hidden = min(comm, links.overlap * BACKWARD_SHARE * compute)
    return step.data_wait_s * share + compute + comm - hidden, compute, comm, comm - hidden, nodes


def predict(step: StepProfile, links: Links, n: int, *, share: float = 1.0,
            overhead: Overhead | None = None) -> Prediction:
    """Step time, efficiency (with its range) and the limiting cost at ``n`` devices.

    ``share`` is each device's work at ``n`` relative to the measured step: 1 for weak scaling (the
    per-device batch stays), ``1/n`` for strong scaling (one global batch split ``n`` ways; the exact
    per-device batch ratio when it does not divide). Efficiency is throughput against ``n`` times the
    one-device throughput either way: ``share * step(1) / step(n)``. ``overhead`` is the cost of
    running distributed (default: the published, uncalibrated estimate).
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    ov = overhead or Overhead()
    base, *_ = _step(step, links, 1)
    plain, compute, comm, exposed, nodes = _step(step, links, n, share)
    # the overhead rides on each GPU's step as it is at n, and what of it falls inside exposed
    # communication is counted once (a rank waiting for a straggler waits in the all-reduce); how
    # much of it does is not known, so the range's pessimistic end counts both in full
    seconds = {b: ov.seconds(step.compute_s * share, n, b) for b in ("low", "mid", "high")}
    extra = {"low": max(0.0, seconds["low"] - exposed), "mid": max(0.0, seconds["mid"] - exposed),
             "high": seconds["high"]}
    step_s = plain + extra["mid"]
    losses = {"communication": exposed, "shared CPU cores": compute - step.compute_s * share,
              "distributed overhead (sync, stragglers)": extra["mid"]}
    worst = max(losses, key=lambda k: losses[k])
    if n > 1 and step.data_wait_s > 0.2 * step_s and losses[worst] <= 0.02 * step_s:
        limit = "data loading"
    elif n > 1:
        limit = worst       # never "compute-bound" beyond one device: something always costs
    else:
        limit = "data loading" if step.data_wait_s > 0.2 * step_s else "none (compute-bound)"
    return Prediction(n=n, nodes=nodes, step_s=step_s, compute_s=compute, comm_s=comm,
                      exposed_comm_s=exposed, data_wait_s=step.data_wait_s * share,
                      efficiency=share * base / step_s, limit=limit, overhead_s=extra["mid"],
                      efficiency_low=share * base / (plain + extra["high"]),
                      efficiency_high=share * base / (plain + extra["low"]), calibrated=ov.calibrated)


def modelled_without_overhead(step: StepProfile, links: Links, n: int, *, share: float = 1.0) -> float:
    """The model's step at ``n`` before the distributed overhead: what a calibration compares with."""
    return _step(step, links, n, share)[0]


def exposed_communication(step: StepProfile, links: Links, n: int, *, share: float = 1.0) -> float:
    """The all-reduce time at ``n`` that the backward does not hide (a calibration's ``exposed_s``)."""
    return _step(step, links, n, share)[3]


def percent(efficiency: float, n: int) -> int:
    """A predicted efficiency in whole percent; beyond one device at most 99 (never a free step)."""
    value = int(round(efficiency * 100))
    return value if n == 1 else min(99, value)


def range_text(efficiency: float, low: float, high: float, n: int) -> str:
    """"87% (83-90%)": a figure and its range; never 100% beyond one device."""
    if n == 1:
        return f"{percent(efficiency, 1)}%"
    return f"{percent(efficiency, n)}% ({percent(low, n)}-{percent(high, n)}%)"


def efficiency_text(p: Prediction) -> str:
    """A prediction's efficiency and range as :func:`range_text` writes them."""
    return range_text(p.efficiency, p.efficiency_low, p.efficiency_high, p.n)


def time_to_solution(pred: Prediction, step: StepProfile, *, samples: float, startup_s: float = 0.0) -> float:
    """Seconds to train on ``samples`` samples at ``pred.n`` devices."""
    steps = samples / (pred.n * step.samples_per_step)
    return startup_s + steps * pred.step_s


def billed_gpus(n: int, links: Links) -> int:
    """GPUs billed for ``n``: whole nodes where the cluster only gives whole nodes."""
    if links.whole_nodes and n > 0:
        return math.ceil(n / links.devices_per_node) * links.devices_per_node
    return n


def sizes_up_to(limit: int, *, include: tuple[int, ...] = ()) -> list[int]:
    """1, 2, 4, ... up to ``limit`` (powers of two), plus ``include``."""
    out, n = set(include), 1
    while n <= limit:
        out.add(n)
        n *= 2
    return sorted(x for x in out if x >= 1)


def recommend(preds: list[Prediction], *, threshold: float = DEFAULT_THRESHOLD) -> Prediction:
    """The largest size whose efficiency stays at least ``threshold`` at the low end of its range
    (1 device at worst): on the published tables the middle figure chose a larger size than the
    measurement in 7 cases of 48, the low end in none (docs/benchmarks.md)."""
    good = [p for p in preds if p.efficiency_low >= threshold]
    return max(good, key=lambda p: p.n) if good else min(preds, key=lambda p: p.n)
