"""Observability across real processes: straggler naming, doctor, bench comm, bench scaling.

Five launches in all (two cores): each module-scoped fixture runs one command and several
tests read its files.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from workers import REPO, run_workers, worker_env

pytestmark = pytest.mark.multiproc
HERE = Path(__file__).parent


def _cli(args: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scaletrain", *args], env=worker_env(env), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straggler")
    proc = run_workers(HERE / "observe_worker.py", nproc=2, args=["--run-dir", str(run_dir)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


def test_slowed_rank_is_named_straggler_with_host(straggler_run):
    summary = json.loads((straggler_run / "summary.json").read_text())
    stragglers = [f for f in summary["findings"] if f["kind"] == "straggler"]
    assert [f["rank"] for f in stragglers] == [1], summary["findings"]
    assert stragglers[0]["host"] and "busy time" in stragglers[0]["message"]
    events = [json.loads(line) for line in (straggler_run / "metrics.jsonl").read_text().splitlines()]
    assert any(e["type"] == "event" and e["kind"] == "straggler" for e in events)


def test_one_sampler_per_node_and_idle_device_of_local_rank_1_named(straggler_run):
    ranks = [json.loads((straggler_run / f"rank{r}.json").read_text()) for r in (0, 1)]
    # one node, two processes: only local rank 0 starts a sampler thread and reads the devices
    assert [r["sampler_threads"] for r in ranks] == [1, 0]
    assert ranks[0]["backend_reads"] >= 1 and ranks[1]["backend_reads"] == 0
    # each rank still learns its own device's figures, from local rank 0's sampler
    assert [r["device_util"]["util_pct"] for r in ranks] == [95.0, 10.0]
    assert [r["device_util"]["device"] for r in ranks] == ["0", "1"]
    summary = json.loads((straggler_run / "summary.json").read_text())
    idle = [f for f in summary["findings"] if f["kind"] == "idle"]
    assert [f["rank"] for f in idle] == [1], summary["findings"]
    assert idle[0]["host"] == socket.gethostname() and "GPU 1 of the node" in idle[0]["message"]
    assert "data loader" in idle[0]["message"] and "num_workers (now 1)" in idle[0]["hint"]
    assert "stage the data" in idle[0]["hint"]


def test_global_throughput_sums_both_ranks(straggler_run):
    summary = json.loads((straggler_run / "summary.json").read_text())
    assert summary["world_size"] == 2
    # 16 samples per rank per step, two ranks: global = 2 x per-device (equal step times)
    assert summary["samples_per_s"] == pytest.approx(2 * summary["samples_per_s_per_device"], rel=0.10)
    assert 16 / summary["step_s_median"] == pytest.approx(summary["samples_per_s_per_device"], rel=0.25)


def test_doctor_passes_on_healthy_two_rank_run():
    proc = subprocess.run([*[sys.executable, "-m", "scaletrain", "run", "--nproc-per-node", "2"],
                           "-m", "scaletrain.doctor", "--size-mb", "1"], env=worker_env(),
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "all checks passed on 2 ranks" in out
    assert out.count("PASS") >= 5 and "all_reduce of 1 MiB correct" in out
    table = [ln for ln in out.splitlines() if ln.split("] ", 1)[-1].startswith(("0 ", "1 "))]
    assert len(table) == 2  # one line per rank: host, device, cores


def test_bench_comm_json(tmp_path):
    proc = _cli(["bench", "comm", "--nproc", "2", "--ops", "all_reduce,all_gather,reduce_scatter,broadcast",
                 "--sizes", "1K..64K:8", "--iters", "3", "--warmup", "1", "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "comm.json").read_text())
    assert doc["world_size"] == 2
    rows = doc["results"]
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert sorted({r["bytes"] for r in rows}) == [1024, 8192, 65536]
    for r in rows:
        assert r["time_s"] > 0 and r["busbw_gbs"] > 0
        assert r["algbw_gbs"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(r["op"], 0.5)  # 2(n-1)/n, (n-1)/n at n=2
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * factor)
    assert "busbw GB/s" in proc.stdout


@pytest.fixture(scope="module")
def scaling_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    # the calibration it stores goes to a folder of the test's, not the user's ~/.config
    proc = _cli(["bench", "scaling", "--workload", "cnn", "--nproc", "1,2", "--steps", "20", "--batch", "8",
                 "--out", str(out)], timeout=900, env={"XDG_CONFIG_HOME": str(out / "config")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (out / "stderr.txt").write_text(proc.stderr)
    return out


def test_bench_scaling_json(scaling_report):
    doc = json.loads((scaling_report / "scaling.json").read_text())
    rows = doc["rows"]
    assert [r["nproc"] for r in rows] == [1, 2]
    for r in rows:
        assert r["efficiency"] > 0   # no upper bound: timings on a shared machine (see below)
        assert r["step_s"] > 0 and r["samples_per_s"] > 0
        assert r["samples_per_s_per_device"] == pytest.approx(r["samples_per_s"] / r["nproc"])
        assert 0 < r["predicted_efficiency"] <= 1.0 and r["predicted_step_s"] > 0
    assert rows[0]["efficiency"] == 1.0 and rows[1]["allreduce_busbw_gbs"] > 0
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["samples_per_s"] / rows[0]["samples_per_s"] / 2)
    assert (scaling_report / "scaling.png").stat().st_size > 1000


def test_two_process_run_calibrates_the_overhead_that_explain_uses(scaling_report):
    """The calibrated path, measured: the 2-process run's step beyond the model's own terms is the
    distributed overhead; it is stored for this machine, and a prediction from it meets the run."""
    from scaletrain.bench.scaling import local_links
    from scaletrain.bench.explain import explain
    from scaletrain.observe.overhead import load_calibration
    from scaletrain.observe.scaling import StepProfile, exposed_communication, modelled_without_overhead, predict

    doc = json.loads((scaling_report / "scaling.json").read_text())
    one, two = doc["rows"]
    links, _ = local_links(doc["rows"], background_load=doc.get("background_load", 0.0))
    step = StepProfile(compute_s=one["step_s"] * (1 - one["data_wait_frac"]),
                       data_wait_s=one["step_s"] * one["data_wait_frac"], grad_bytes=one["grad_bytes"],
                       samples_per_step=one["batch_per_device"])
    stored = load_calibration("local", path=scaling_report / "config" / "scaletrain" / "scaling-calibration.json")
    assert stored is not None and stored.calibrated and "bench scaling of cnn on 2 processes" in stored.source
    assert stored.at_two_s == pytest.approx(doc["calibration"]["at_two_s"])
    assert "distributed overhead" in (scaling_report / "stderr.txt").read_text()
    # what was stored is the measured step less the model's compute, the exposed all-reduce counted
    # in it once (and never below the all-reduce the model gives)
    plain = modelled_without_overhead(step, links, 2)
    exposed = exposed_communication(step, links, 2)
    assert stored.at_two_s == pytest.approx(exposed + max(0.0, two["step_s"] - plain), rel=1e-9, abs=1e-12)
    if two["step_s"] > plain:   # the usual case: the calibrated model meets the measured 2-process step
        assert predict(step, links, 2, overhead=stored).step_s == pytest.approx(two["step_s"], rel=1e-9)
    text = explain(step, links, requested=2, work_samples=1000, cluster="local", source="bench", overhead=stored)
    assert "calibrated" in text and "NOT calibrated" not in text and "compute-bound)  <- requested" not in text


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_html_report_renders_in_chromium(scaling_report):
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (scripts/test.sh installs Debian's chromium when run as root)")
    PIL = pytest.importorskip("PIL.Image", reason="Pillow (with matplotlib, the report extra) reads the screenshot")
    shot = scaling_report / "shot.png"
    with tempfile.TemporaryDirectory(prefix="scaletrain-chromium-") as profile:
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                               "--no-first-run", "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", f"--user-data-dir={profile}", "--window-size=900,800",
                               f"--screenshot={shot}", (scaling_report / "scaling.html").as_uri()],
                              capture_output=True, text=True, timeout=120)
    assert shot.is_file(), proc.stdout + proc.stderr
    img = PIL.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 20, "the screenshot is blank"
    # the measured line's blue is drawn: the chart rendered, not just text
    assert any(abs(r - 0x1f) < 40 and abs(g - 0x77) < 40 and abs(b - 0xb4) < 40 and n > 50
               for n, (r, g, b) in colours)
