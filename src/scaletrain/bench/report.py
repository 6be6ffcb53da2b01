"""The scaling report: ``scaling.json``, a text table, a PNG plot and a self-contained HTML page.

The HTML page carries its chart as inline SVG (no scripts, no external files), so it opens
anywhere, including a cluster's login node over a file share; the PNG needs matplotlib (the
``report`` extra) and is skipped with a note when it is missing.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain import settings
from scaletrain.contract.files import SCALING_REPORT
from scaletrain.extras import install_hint
from scaletrain.fileio import atomic_write, json_text, read_json
from scaletrain.observe.scaling import UNSEEN, range_text
from scaletrain.settings import Check

SCALING_HTML = "scaling.html"    # beside contract.files.SCALING_REPORT: the page and the plot
SCALING_PNG = "scaling.png"
MAX_REPORT_BYTES = 64 * 2**20    # a report (or a Monitor summary read beside it) is far smaller


def format_table(doc: dict[str, Any]) -> str:
    """The seeds' kind of table: size, time per step, throughput, speed-up, efficiency, model."""
    predicted = any("predicted_step_s" in r for r in doc["rows"])
    nodes = _by_nodes(doc)
    head = (f"{'nodes':>5} " if nodes else "") + \
        f"{'procs':>5} {'ms/step':>9} {'samples/s':>10} {'per dev':>9} {'speed-up':>9} {'effic.':>7}"
    if predicted:
        head += f" {'model ms':>9} {'model eff':>15} {'error':>7}  limit"
    lines = [head]
    for r in doc["rows"]:
        line = (f"{r.get('nodes', 1):>5} " if nodes else "") + \
            (f"{r['nproc']:>5} {r['step_s'] * 1000:>9.1f} {r['samples_per_s']:>10.1f} "
             f"{r['samples_per_s_per_device']:>9.1f} {r['speedup']:>9.2f} {r['efficiency'] * 100:>6.0f}%")
        if "predicted_step_s" in r:
            line += (f" {r['predicted_step_s'] * 1000:>9.1f} {_model_efficiency(r):>15} "
                     f"{r['prediction_error'] * 100:>+6.0f}%  {r['predicted_limit']}")
        lines.append(line)
    for f in doc.get("failed", []):
        lines.append((f"{f['nodes']:>5} " if nodes else "") + f"{f['nproc']:>5}  FAILED: {f['reason']}")
    overhead = doc.get("model", {}).get("overhead")
    if predicted and overhead:
        lines.append(f"model: distributed overhead calibrated on this run, {overhead['at_two_s'] * 1000:.2f} ms "
                     f"per step at 2 processes, exposed all-reduce included ({overhead['source']})")
    elif predicted:
        lines.append("model: distributed overhead NOT calibrated (no multi-process run on one node): "
                     "the published default, a range")
    if predicted:
        lines.append(f"model: {UNSEEN}")
    return "\n".join(lines)


def _model_efficiency(row: dict[str, Any]) -> str:
    """The model's efficiency of a row with its range, as plan --explain prints it."""
    eff = row["predicted_efficiency"]
    return range_text(eff, row.get("predicted_efficiency_low", eff), row.get("predicted_efficiency_high", eff),
                      row["nproc"])


def _by_nodes(doc: dict[str, Any]) -> bool:
    """Sizes counted in nodes (``--nodes``, one Slurm job each), not local processes."""
    return doc.get("launch") == "slurm"


def _svg(doc: dict[str, Any], width: int = 560, height: int = 320) -> str:
    """Efficiency against size: measured points and line, model dashed."""
    rows = doc["rows"]
    sizes = [r["nproc"] for r in rows]
    left, right, top, bottom = 60, 20, 20, 50
    w, h = width - left - right, height - top - bottom
    n_max = max(sizes) if sizes else 1
    y_max = max([1.2] + [r["efficiency"] for r in rows] + [r.get("predicted_efficiency", 0) for r in rows])

    def x(n: float) -> float:
        return left + (w * (n - 1) / (n_max - 1) if n_max > 1 else w / 2)

    def y(e: float) -> float:
        return top + h - h * e / y_max

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="parallel efficiency">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#333"/>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" y1="{y(tick):.1f}" x2="{left + w}" y2="{y(tick):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" font-size="12" text-anchor="end">'
                     f'{tick * 100:.0f}%</text>')
    for n in sizes:
        parts.append(f'<text x="{x(n):.1f}" y="{top + h + 18}" font-size="12" text-anchor="middle">{n}</text>')
    parts.append(f'<text x="{left + w / 2}" y="{height - 8}" font-size="13" text-anchor="middle">'
                 'processes (devices)</text>')
    parts.append(f'<text x="14" y="{top + h / 2:.1f}" font-size="13" text-anchor="middle" '
                 f'transform="rotate(-90 14 {top + h / 2:.1f})">parallel efficiency</text>')
    measured = " ".join(f"{x(r['nproc']):.1f},{y(r['efficiency']):.1f}" for r in rows)
    parts.append(f'<polyline points="{measured}" fill="none" stroke="#1f77b4" stroke-width="3"/>')
    for r in rows:
        parts.append(f'<circle cx="{x(r["nproc"]):.1f}" cy="{y(r["efficiency"]):.1f}" r="6" fill="#1f77b4"/>')
    if any("predicted_efficiency" in r for r in rows):
        model = " ".join(f"{x(r['nproc']):.1f},{y(r['predicted_efficiency']):.1f}" for r in rows
                         if "predicted_efficiency" in r)
        parts.append(f'<polyline points="{model}" fill="none" stroke="#d62728" stroke-width="3" '
                     'stroke-dasharray="8 5"/>')
    parts.append(f'<text x="{left + 10}" y="{top + 14}" font-size="13" fill="#1f77b4">measured</text>')
    parts.append(f'<text x="{left + 90}" y="{top + 14}" font-size="13" fill="#d62728">model</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained HTML page: title, what ran, chart, table, model notes."""
    esc = html.escape
    rows = doc["rows"]
    nodes = _by_nodes(doc)
    head = (["nodes"] if nodes else []) + ["procs", "ms/step", "samples/s", "per device", "speed-up", "efficiency"]
    pred = any("predicted_step_s" in r for r in rows)
    if pred:
        head += ["model ms/step", "model efficiency", "model error", "limit"]
    body = []
    for r in rows:
        cells = ([str(r.get("nodes", 1))] if nodes else []) + [
            str(r["nproc"]), f"{r['step_s'] * 1000:.1f}", f"{r['samples_per_s']:.1f}",
            f"{r['samples_per_s_per_device']:.1f}", f"{r['speedup']:.2f}", f"{r['efficiency'] * 100:.0f}%"]
        if pred:
            cells += ([f"{r['predicted_step_s'] * 1000:.1f}", _model_efficiency(r),
                       f"{r['prediction_error'] * 100:+.0f}%", esc(r["predicted_limit"])]
                      if "predicted_step_s" in r else ["-"] * 4)
        # the model's "limit" is prose: it wraps, so the table fits a laptop screen
        plain, limit = (cells[:-1], cells[-1]) if pred else (cells, None)
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in plain)
                    + (f'<td class="limit">{limit}</td>' if limit is not None else "") + "</tr>")
    for f in doc.get("failed", []):
        lead = ([str(f["nodes"])] if nodes else []) + [str(f["nproc"])]
        body.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in lead)
                    + f'<td colspan="{len(head) - len(lead)}" style="text-align:left">failed: '
                    f"{esc(str(f['reason']))}</td></tr>")
    model = doc.get("model", {})
    made = ", ".join(f"{k} {esc(str(doc[key]))}" for k, key in
                     (("on", "date"), ("scaletrain", "scaletrain_version"), ("torch", "torch_version"))
                     if doc.get(key))
    command = (f"<br>Command: <code>{esc(str(doc['command']))}</code>" if doc.get("command") else "")
    where = (f"one Slurm job per size on {esc(str(doc.get('cluster', '')))}" if nodes
             else f"host {esc(str(doc.get('host', '')))}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>scaletrain scaling report: {esc(doc['workload'])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; background: #fff; }}
table {{ border-collapse: collapse; margin-top: 1em; }}
td, th {{ border: 1px solid #999; padding: 4px 8px; text-align: right; white-space: nowrap; }}
th {{ background: #e8eef7; white-space: normal; }}
td.limit {{ white-space: normal; text-align: left; min-width: 8em; }}
.made {{ color: #555; font-size: 90%; }}
.note {{ color: #555; max-width: 50em; }}
</style></head>
<body>
<h1>Scaling report: {esc(doc['workload'])}, {esc(doc['strategy'])}, {esc(doc['mode'])} scaling</h1>
<p class="made">Measured {made}.{command}</p>
<p>{doc['steps']} steps per size ({doc['warmup']} warm-up steps left out), batch {doc['batch']}
{'per device' if doc['mode'] == 'weak' else 'global'}, {where}.</p>
{_svg(doc)}
<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>
{''.join(body)}
</table>
<p class="note">Efficiency = speed-up / size ratio against the smallest size. Model: ring all-reduce
of the gradients with DDP's overlap, from the 1-process step; bandwidth: {esc(str(model.get('source', '')))};
{esc(UNSEEN)}. {esc(str(model.get('note', '')))}</p>
</body></html>
"""


def write_png(doc: dict[str, Any], path: Path) -> str | None:
    """Write the efficiency plot as PNG; returns a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no PNG plot: matplotlib is not installed ({install_hint('report')})"
    rows = doc["rows"]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot([r["nproc"] for r in rows], [r["efficiency"] for r in rows], "o-", label="measured")
    if any("predicted_efficiency" in r for r in rows):
        pr = [r for r in rows if "predicted_efficiency" in r]
        ax.plot([r["nproc"] for r in pr], [r["predicted_efficiency"] for r in pr], "--", label="model")
    ax.set_xticks([r["nproc"] for r in rows])
    ax.set_xlabel("processes (devices)")
    ax.set_ylabel("parallel efficiency")
    ax.set_ylim(0, max(1.2, *[r["efficiency"] for r in rows]))
    ax.set_title(f"{doc['workload']} ({doc['strategy']}, {doc['mode']} scaling)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    atomic_write(path, tmp.read_bytes())
    tmp.unlink()
    return None


def write_report(doc: dict[str, Any], out_dir: str | Path) -> list[str]:
    """Write scaling.json, scaling.html and (with matplotlib) scaling.png; returns notes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / SCALING_REPORT, json_text(doc, indent=2) + "\n")
    atomic_write(out / SCALING_HTML, render_html(doc))
    note = write_png(doc, out / SCALING_PNG)
    return [note] if note else []


# ---- reading scaling.json back (plan --explain) -------------------------------------------------

class ReportError(ValueError):
    """A report that is not what :func:`write_report` writes: the message says what is wrong."""


@dataclass(frozen=True, kw_only=True)
class OneProcessRow:
    """The 1-process row of a scaling report: the step ``plan --explain`` models from."""

    step_s: float
    data_wait_frac: float
    grad_bytes: int | None
    batch_per_device: int
    steps: int
    workload: str
    device: str | None


@dataclass(frozen=True, kw_only=True)
class ScalingReport:
    """What a ``scaling.json`` says, checked."""

    one_process: OneProcessRow | None          # None: no run on 1 process
    calibration: dict[str, Any] | None         # the stored calibration record (observe.overhead.to_record)


def read_document(path: Path) -> Any:
    """A report file parsed as JSON, at most MAX_REPORT_BYTES (the bound holds if it grows while read).
    Raises OSError or ValueError (not JSON, nested too deep, a number out of range)."""
    return read_json(path, limit=MAX_REPORT_BYTES)


def is_scaling_report(doc: Any) -> bool:
    """Whether a parsed document is a scaling report (else, for plan --explain, a Monitor summary)."""
    return isinstance(doc, dict) and doc.get("kind") == "scaling"


def scaling_report(doc: Any) -> ScalingReport:
    """The checked content of a parsed ``scaling.json``; ReportError names the first thing that is
    not as :func:`write_report` writes it (a missing key, a row that is not an object, ...)."""
    if not is_scaling_report(doc):
        raise ReportError('it is not a scaling report (no "kind": "scaling")')
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise ReportError('"rows" is not a list')
    one = None
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ReportError(f"row {i} is not an object")
        if row.get("nproc") == 1 and one is None:
            one = _one_process(row, i)
    cal = doc.get("calibration")
    return ScalingReport(one_process=one, calibration=cal if isinstance(cal, dict) else None)


# the one-process row's fields as write_report writes them, checked by the settings vocabulary
_ROW_CHECKS: dict[str, Check] = {
    "step_s": settings.number(low=1e-9, high=1e6), "data_wait_frac": settings.number(low=0.0, high=1.0),
    "batch_per_device": settings.count(1, 10**9), "steps": settings.count(1, 10**12),
    "grad_bytes": settings.count(0, 2**50),
}


def _one_process(row: dict[str, Any], i: int) -> OneProcessRow:
    def field(key: str) -> Any:
        try:
            return _ROW_CHECKS[key](row.get(key))
        except settings.Bad as bad:
            what = "is not a byte count" if key == "grad_bytes" else "is missing or not a number"
            raise ReportError(f"row {i} (1 process): {key!r} {what} ({bad})") from None

    workload = row.get("workload")
    device = row.get("device")
    return OneProcessRow(step_s=field("step_s"), data_wait_frac=field("data_wait_frac"),
                         grad_bytes=field("grad_bytes") if row.get("grad_bytes") is not None else None,
                         batch_per_device=field("batch_per_device"), steps=field("steps"),
                         workload=str(workload) if isinstance(workload, str) else "?",
                         device=device if isinstance(device, str) else None)
