"""CPU cost of the per-node GPU sampler (``--sample-gpus``), without a GPU.

    PYTHONPATH=src python3 benchmarks/node_sampler_cost.py [SECONDS]

Runs :func:`scaletrain.observe.nodesampler.sample_loop` for SECONDS (default 30) at 1 s and 10 s
intervals with a fake backend that reports 8 GPUs, and prints the process CPU time per wall second
(% of one core), plus the one-off start-up of ``python -m scaletrain.observe.nodesampler``. The
NVML/AMD SMI read itself is not in these figures (no GPU here): measure it on a GPU node.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scaletrain.observe.devices import Sample
from scaletrain.observe.nodesampler import sample_loop


class FakeEight:
    name = "fake"

    def read(self) -> dict[str, Sample]:
        return {str(i): Sample(util_pct=90.0 + i, mem_gb=40.0 + i, power_w=300.0) for i in range(8)}

    def close(self) -> None:
        pass


def cost(interval: float, seconds: float) -> float:
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    with tempfile.TemporaryDirectory() as tmp:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        timer.start()
        sample_loop(Path(tmp), interval, FakeEight(), vendor="fake", host="bench", stop=stop)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return 100 * cpu / wall


def main(seconds: float = 30.0) -> None:
    for interval in (1.0, 10.0):
        print(f"interval {interval:g} s: {cost(interval, seconds):.4f}% of one core over {seconds:g} s")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "scaletrain.observe.nodesampler", tmp, "--interval", "1"],
                       check=True, timeout=60)       # no GPU here: one line saying why, then exit
    print(f"start-up and exit of the sampler process: {time.perf_counter() - t0:.2f} s (once per node per run)")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 30.0)
