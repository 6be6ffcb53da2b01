"""What the ``scale_*`` benchmarks share: the growth fit, one measurement in a fresh process, the
results file and the plots of docs/scale.md.

A step is measured at several sizes N; :func:`exponent` fits ``cost = a * N^k`` by least squares
on the logarithms and returns k (1: grows with the job; 2: with its square). :func:`project`
carries the fit to a size not measured (JUPITER's 24,000 ranks / 6,000 nodes), from the two
largest sizes measured, so a curve that bends upwards is not projected from its flat start.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "img" / "scale.json"
QUICK = (64, 256, 1024)               # the default sizes: minutes on two cores
FULL = (256, 1024, 4096, 24000)       # --full: the sizes of docs/scale.md
JUPITER_RANKS = 24_000                # ~6,000 nodes of 4 GH200 (JUPITER Booster)
JUPITER_NODES = 6_000


def exponent(sizes: Sequence[float], costs: Sequence[float]) -> float | None:
    """The fitted growth exponent k of ``cost ~ N^k`` (None with fewer than 2 usable points)."""
    pts = [(math.log(n), math.log(c)) for n, c in zip(sizes, costs) if n > 0 and c and c > 0]
    if len(pts) < 2 or len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def project(sizes: Sequence[float], costs: Sequence[float], at: float) -> float | None:
    """``cost`` at size ``at``, from the local exponent of the two largest sizes measured (or the
    largest measured value itself when ``at`` was measured)."""
    pairs = sorted((n, c) for n, c in zip(sizes, costs) if c is not None and c > 0)
    for n, c in pairs:
        if n == at:
            return c
    if len(pairs) < 2:
        return None
    (n1, c1), (n2, c2) = pairs[-2], pairs[-1]
    k = math.log(c2 / c1) / math.log(n2 / n1) if n2 != n1 else 0.0
    return c2 * (at / n2) ** max(k, 0.0)


def timed(fn: Callable[[], Any], *, repeat: int = 3) -> tuple[float, Any]:
    """The median wall time of ``repeat`` calls of ``fn`` and the last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], out


def in_fresh_process(code: str, *, env: dict[str, str] | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run ``code`` (Python that prints one JSON object last; :func:`peak_mb` gives its memory) in
    a new interpreter with the repo's ``src`` first on the path; its JSON plus ``wall_s``."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "benchmarks"),
                                                         os.environ.get("PYTHONPATH", "")])}
    full.update(env or {})
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = round(wall, 3)
    return out


def peak_mb() -> float:
    """This process's peak resident memory in MB (``VmHWM``: unlike ``ru_maxrss``, not inherited
    from the parent across ``exec``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def save(rows: list[dict[str, Any]], path: Path = RESULTS) -> None:
    """Add ``rows`` to the results file, replacing earlier rows of the same (step, series, n)."""
    old: list[dict[str, Any]] = []
    if path.exists():
        old = json.loads(path.read_text())
    keys = {(r["step"], r.get("series"), r["n"]) for r in rows}
    kept = [r for r in old if (r["step"], r.get("series"), r["n"]) not in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(kept + rows, key=lambda r: (r["step"], str(r.get("series")), r["n"])),
                              indent=1) + "\n")
    os.replace(tmp, path)


def emit(rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    """Keep ``row`` and print it as a JSON line (a harness's progress)."""
    rows.append(row)
    print(json.dumps(row, default=str), flush=True)


def done(rows: list[dict[str, Any]], keep: bool) -> int:
    """A harness's end: its rows into the results file when asked (``--save``); exit status 0."""
    if keep:
        save(rows)
    return 0


def fits(rows: list[dict[str, Any]], value: str, *, at: float) -> dict[str, dict[str, Any]]:
    """Per series of ``rows``: the sizes, the values of field ``value``, the exponent and the
    projection at ``at``."""
    out: dict[str, dict[str, Any]] = {}
    for series in sorted({str(r.get("series")) for r in rows}):
        mine = sorted((r for r in rows if str(r.get("series")) == series and r.get(value) is not None),
                      key=lambda r: r["n"])
        ns, vs = [r["n"] for r in mine], [r[value] for r in mine]
        out[series] = {"n": ns, "values": vs, "exponent": exponent(ns, vs), "projected": project(ns, vs, at)}
    return out


def plot(title: str, rows: list[dict[str, Any]], value: str, unit: str, out: Path, *,
         at: float = JUPITER_RANKS, xlabel: str = "simulated ranks N", budget: float | None = None) -> None:
    """One log-log chart: a line per series (label with its fitted exponent), the projection to
    ``at`` dotted, an optional budget line. Needs matplotlib (the ``report`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for series, fit in fits(rows, value, at=at).items():
        if not fit["n"]:
            continue
        k = fit["exponent"]
        line, = ax.plot(fit["n"], fit["values"], marker="o", label=f"{series} (k={k:.2f})" if k is not None else series)
        if fit["projected"] is not None and fit["n"][-1] < at:
            ax.plot([fit["n"][-1], at], [fit["values"][-1], fit["projected"]], linestyle=":", color=line.get_color())
    if budget is not None:
        ax.axhline(budget, color="red", linewidth=0.8, linestyle="--", label=f"budget {budget:g} {unit}")
    ax.axvline(at, color="grey", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", linewidth=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
