"""The Monitor's exchange and the stop agreement at N ranks, simulated in one process.

    PYTHONPATH=src python3 benchmarks/scale_steps.py [--n 64,256,1024] [--src OTHER/src] [--save]

**Monitor exchange.** A real ``scaletrain.Monitor`` of rank r of N runs its exchange
(``Monitor._exchange``: the code a training step calls every ``every`` steps) against a
stand-in for ``torch.distributed`` that plays the other N-1 ranks: their records are realistic
windows (4 ranks a node, the node's device sampler figures on each node's first rank), made
before the clock starts. What the stand-in does in place of the network (filling receive
buffers) is not counted; what a rank's own Python does with what it receives (unpickling N
records under ``all_gather_object``, decoding them, the straggler search) is. Bytes are those
each collective moves through this rank under torch's algorithms: ring all-gather, flat gather
to the root, a small all-reduce. ``--src`` measures another scaletrain (39e04f3's
``all_gather_object``) in a child process, for the before/after.

**Stop agreement.** N real ``StopAgreement`` objects (one per simulated rank, 100 ms steps, the
0.5 s sync period) poll in lock step against a stand-in all-reduce; one rank is "signalled" at
a random time and the step at which every rank agrees to stop is recorded, in sync periods
after the signal (budget: 2). The all-reduce moves 40 bytes whatever N; its latency on the
real network is not simulated (it must stay under one period).
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_common import done, emit, in_fresh_process  # noqa: E402

PER_NODE = 4
EVERY = 100              # the Monitor's default exchange cadence (steps)


def window(rank: int, *, slow: int | None = None) -> dict[str, Any]:
    """A realistic record of rank ``rank``: GH200 node ``rank // 4``, its sampler's figures on
    the node's first rank (four devices)."""
    node, local = divmod(rank, PER_NODE)
    rec: dict[str, Any] = {"rank": rank, "host": f"jpbo-{node // 48:03d}-{node % 48:02d}", "device": f"cuda:{local}",
                           "step_s": 1.0 + (rank % 17) * 1e-4 + (0.5 if rank == slow else 0.0),
                           "comm_wait_s": 0.12 + (rank % 13) * 1e-4, "data_wait_frac": 0.004,
                           "util_pct": None, "num_workers": 8, "node": node, "device_id": str(local),
                           "node_samples": None}
    if local == 0:
        rec["node_samples"] = {"available": True, "devices": {
            str(d): {"samples": 50, "util_pct": 91.5 + d, "mem_gb": 71.25, "power_w": 612.4} for d in range(PER_NODE)}}
    return rec


class FakeDist:
    """``torch.distributed`` as rank ``rank`` of ``world`` sees it; the other ranks are ``others``
    (their records). ``transport_s`` accumulates the time spent standing in for the network."""

    class ReduceOp:
        MAX, SUM = "max", "sum"

    def __init__(self, rank: int, world: int, others: list[dict[str, Any]]) -> None:
        import torch

        self.rank, self.world = rank, world
        self.transport_s = 0.0
        self.recv = self.sent = 0
        self.records = others
        self.pickled = [pickle.dumps(o) for o in others]
        self.encoded = [json.dumps(o, separators=(",", ":")).encode() for o in others]
        self.max_step = max(o["step_s"] for o in others)
        self.max_len = max(len(e) for e in self.encoded)
        self._torch = torch

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    # -- 39e04f3: every record to every rank ---------------------------------------------------
    def all_gather_object(self, out: list[Any], obj: Any, group: Any = None) -> None:
        mine = pickle.dumps(obj)        # torch pickles this rank's object: CPU, counted
        size = max(len(mine), max(len(p) for p in self.pickled))
        t0 = time.perf_counter()
        # ring all-gather, twice (the sizes, then the padded objects): (N-1) chunks each way
        self.recv += (self.world - 1) * (8 + size)
        self.sent += (self.world - 1) * (8 + size)
        self.transport_s += time.perf_counter() - t0
        for i in range(self.world):     # torch unpickles every rank's object: CPU, counted
            out[i] = pickle.loads(mine if i == self.rank else self.pickled[i])

    # -- this version: one reduction, a gather to rank 0 ------------------------------------------
    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        t0 = time.perf_counter()
        if op == self.ReduceOp.MAX and tensor.numel() == 2:     # [step_s, record length]
            tensor[0] = max(float(tensor[0]), self.max_step)
            tensor[1] = max(float(tensor[1]), self.max_len)
        self.recv += 2 * tensor.numel() * tensor.element_size()
        self.sent += 2 * tensor.numel() * tensor.element_size()
        self.transport_s += time.perf_counter() - t0
        return None

    def gather(self, tensor: Any, gather_list: Any = None, dst: int = 0, group: Any = None) -> None:
        t0 = time.perf_counter()
        size = tensor.numel()
        if gather_list is not None:
            for i, part in enumerate(gather_list):
                data = bytes(tensor.numpy()) if i == self.rank else self.encoded[i].ljust(size, b" ")
                part.copy_(self._torch.frombuffer(bytearray(data), dtype=self._torch.uint8))
            self.recv += (self.world - 1) * size
        else:
            self.sent += size
        self.transport_s += time.perf_counter() - t0


def _env(rank: int, world: int) -> Any:
    node, local = divmod(rank, PER_NODE)
    return SimpleNamespace(rank=rank, world_size=world, device="cpu", node_rank=node, local_rank=local,
                           local_world_size=PER_NODE, num_nodes=(world + PER_NODE - 1) // PER_NODE)


class _Backend:
    """The node's four GPUs for the sampler of a rank that samples (a stand-in for NVML)."""

    name = "fake"

    def read(self) -> dict[str, Any]:
        from scaletrain.observe.devices import Sample

        return {str(d): Sample(util_pct=92.0, mem_gb=71.0, power_w=610.0) for d in range(PER_NODE)}

    def close(self) -> None:
        pass


def measure_exchange(n: int, rank: int, *, repeat: int = 3) -> dict[str, Any]:
    """One rank's cost of a Monitor exchange at ``n`` ranks: CPU seconds (transport excluded),
    bytes through the rank, and the findings rank 0 made (a slowed rank must be found)."""
    import scaletrain.observe.monitor as monitor_mod
    from scaletrain.observe.monitor import Monitor

    slow = n // 2 + 1
    others = [window(r, slow=slow) for r in range(n)]
    fake = FakeDist(rank, n, others)
    saved = monitor_mod.live_dist
    monitor_mod.live_dist = lambda: fake   # type: ignore[assignment]
    times, found = [], []
    try:
        mon = Monitor(None, env=_env(rank, n), every=EVERY, console=False, device_id=str(rank % PER_NODE),
                      device_sampler=_Backend() if rank % PER_NODE == 0 else None, num_workers=8)
        for _ in range(repeat):
            for _ in range(EVERY):
                mon.step(samples=8)
            fake.transport_s = 0.0
            fake.recv = fake.sent = 0
            t0 = time.perf_counter()
            mon._exchange()
            times.append(time.perf_counter() - t0 - fake.transport_s)
        found = [f.rank for f in mon._findings if f.kind == "straggler"]
        if mon.sampler is not None:
            mon.sampler.close()
    finally:
        monitor_mod.live_dist = saved   # type: ignore[assignment]
    return {"cpu_s": statistics.median(times), "recv_bytes": fake.recv, "sent_bytes": fake.sent,
            "stragglers": found, "slowed": slow}


_CHILD = """
import json, sys
sys.path.insert(0, {bench!r})
import scale_steps
print(json.dumps(scale_steps.measure_exchange({n}, {rank}, repeat={repeat})))
"""


def exchange_rows(sizes: list[int], *, src: Path | None, label: str, repeat: int = 3) -> list[dict[str, Any]]:
    """Rows for the Monitor's exchange at each size, rank 0 and rank 1 (a rank that is not 0)."""
    rows = []
    for n in sizes:
        for rank in (0, 1):
            code = _CHILD.format(bench=str(Path(__file__).resolve().parent), n=n, rank=rank, repeat=repeat)
            env = {"PYTHONPATH": f"{src}:{Path(__file__).resolve().parent}"} if src else None
            out = in_fresh_process(code, env=env)
            emit(rows, {"step": "monitor_exchange", "series": f"{label} rank {rank}", "n": n, "rank": rank,
                         "cpu_s": round(out["cpu_s"], 6), "recv_bytes": out["recv_bytes"],
                         "sent_bytes": out["sent_bytes"], "straggler_found": out["slowed"] in out["stragglers"]
                         if rank == 0 else None})
    return rows


# -- the stop agreement --------------------------------------------------------------------------

def agreement_delay(n: int, *, step_s: float = 0.1, seed: int = 0) -> dict[str, Any]:
    """N StopAgreements in lock step; one rank signalled at a random time. Sync periods from the
    signal until every rank returned the stop, and whether all ranks agreed at the same call."""
    import scaletrain.runtime.agreement as ag

    rng = random.Random(seed)
    clock = [0.0]
    current = [0]
    signalled = [None]          # (rank, time)
    pending: dict[int, list[Any]] = {}
    calls = [0] * n

    class Work:
        def wait(self) -> None:
            pass

    class Dist:
        class ReduceOp:
            MAX = "max"

        def all_reduce(self, buffer: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
            key = calls[current[0]]
            members = pending.setdefault(key, [])
            members.append(buffer)
            if len(members) == n:          # the last rank's contribution completes the reduction
                import torch

                top = torch.stack(members).max(dim=0).values
                for b in members:
                    b.copy_(top)
                del pending[key]
            return Work()

    saved = (ag.preempt, ag.timeouts, ag.group_rank_world, ag.collective_device, ag.time)
    code = 2   # a stop code as preempt numbers them (any non-zero)
    ag.preempt = SimpleNamespace(add_listener=lambda: None, remove_listener=lambda: None,  # type: ignore[assignment]
                                 request=lambda reason: None,
                                 stop_code=lambda: code if signalled[0] and signalled[0][0] == current[0]
                                 and clock[0] >= signalled[0][1] else 0,
                                 reason_of=lambda c: "preempted" if c else None)
    ag.timeouts = SimpleNamespace(training_started=lambda: None)   # type: ignore[assignment]
    ag.group_rank_world = lambda group=None: (current[0], n)  # type: ignore[assignment]
    ag.collective_device = lambda group=None: "cpu"  # type: ignore[assignment]
    ag.time = SimpleNamespace(monotonic=lambda: clock[0])  # type: ignore[assignment]
    import torch.distributed

    real_all_reduce = torch.distributed.all_reduce
    fake = Dist()
    torch.distributed.all_reduce = fake.all_reduce  # type: ignore[assignment]
    real_op = torch.distributed.ReduceOp
    try:
        agreements = [ag.StopAgreement(period_s=0.5) for _ in range(n)]
        t_signal = 2.0 + rng.random() * 2.0
        signalled[0] = (rng.randrange(n), t_signal)  # type: ignore[assignment]
        agreed_at: set[int] = set()
        step = 0
        while step < 200:
            step += 1
            clock[0] = step * step_s
            results = set()
            for r in range(n):
                current[0] = r
                calls[r] += 1
                reason, _ = agreements[r].poll()
                results.add(reason)
            if results == {"preempted"}:
                agreed_at.add(step)
                break
            if len(results) > 1:
                raise AssertionError(f"ranks disagree at step {step}: {results}")
        for a in agreements:
            a._closed = True
    finally:
        torch.distributed.all_reduce = real_all_reduce  # type: ignore[assignment]
        ag.preempt, ag.timeouts, ag.group_rank_world, ag.collective_device, ag.time = saved  # type: ignore[assignment]
        del real_op
    stop = min(agreed_at) * step_s if agreed_at else None
    return {"n": n, "signal_s": round(t_signal, 3), "agreed_s": stop,
            "periods": round((stop - t_signal) / 0.5, 3) if stop is not None else None,
            "bytes_per_rank": 2 * 10 * 4}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="64,256,1024")
    parser.add_argument("--src", type=Path, help="also measure the exchange of the scaletrain in this src folder")
    parser.add_argument("--src-label", default="before (39e04f3)")
    parser.add_argument("--agreement-n", default="64,256,1024")
    parser.add_argument("--save", action="store_true", help="add the rows to docs/img/scale.json (scale_report.py)")
    args = parser.parse_args()
    sizes = [int(x) for x in args.n.split(",")]
    rows = exchange_rows(sizes, src=None, label="now")
    if args.src:
        rows += exchange_rows(sizes, src=args.src.resolve(), label=args.src_label)
    for n in [int(x) for x in args.agreement_n.split(",")]:
        trials = [agreement_delay(n, seed=s) for s in range(3)]
        worst = max(t["periods"] for t in trials)
        emit(rows, {"step": "stop_agreement", "series": "periods from signal to agreement (worst of 3)",
                     "n": n, "periods": worst, "bytes_per_rank": trials[0]["bytes_per_rank"]})
    return done(rows, args.save)


if __name__ == "__main__":
    sys.exit(main())
