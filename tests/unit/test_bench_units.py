"""bench comm and bench scaling without processes: sizes, bandwidth factors, analysis, report files."""

from __future__ import annotations

import json

import pytest

from scaletrain.bench.comm import bus_factor, format_table, parse_ops, parse_sizes, result
from scaletrain.bench.report import format_table as scaling_table
from scaletrain.bench.report import render_html, write_report
from scaletrain.bench.scaling import analyse, local_links, parse_nproc
from scaletrain.cli.main import main
from scaletrain.errors import UsageError
from scaletrain.observe.overhead import GROWTH, NONE
from scaletrain.observe.scaling import StepProfile, predict


def test_sizes_and_ops():
    assert parse_sizes("1K..8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K..1M:32") == [1024, 32768, 1048576]
    assert parse_sizes("1M, 64M") == [2**20, 64 * 2**20]
    assert parse_sizes("1G") == [2**30]
    for bad in ("", "0K", "1X", "8K..1K", "1K..1M:1"):
        with pytest.raises(UsageError):
            if not parse_sizes(bad):
                raise UsageError("empty")
    assert parse_ops("all") == ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    with pytest.raises(UsageError):
        parse_ops("all_reduce,alltoall")


def test_nccl_tests_bandwidth_definitions():
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 8) == 1.0
    r = result("all_reduce", 10**9, 0.5, 4)
    assert (r.algbw_gbs, r.busbw_gbs) == (pytest.approx(2.0), pytest.approx(3.0))
    assert "all_reduce" in format_table([r]) and "3.000" in format_table([r])


def _row(n, step_s, busbw=None):
    return {"nproc": n, "nodes": 1, "workload": "cnn", "strategy": "ddp", "mode": "weak", "batch_per_device": 8,
            "steps": 20, "warmup": 3, "device": "cpu", "backend": "gloo", "step_s": step_s,
            "samples_per_s": 8 * n / step_s, "samples_per_s_per_device": 8 / step_s, "data_wait_frac": 0.0,
            "grad_bytes": 10**6, "allreduce_busbw_gbs": busbw, "threads": 1}


def test_analysis_speedup_efficiency_and_model(tmp_path):
    rows = [_row(1, 0.1), _row(2, 0.125, busbw=0.1), _row(4, 0.2, busbw=0.1)]
    links, source = local_links(rows, background_load=0.0)
    assert links.intra_gbs == 0.1 and "0.100 GB/s" in source
    doc = analyse(rows, links, source)
    got = {r["nproc"]: r for r in doc["rows"]}
    assert got[2]["speedup"] == pytest.approx(1.6) and got[2]["efficiency"] == pytest.approx(0.8)
    # model at 2: 0.1 s compute + 2*1/2*1e6/0.1e9 = 0.01 s all-reduce, no overlap on the CPU; the
    # 2-process run calibrates the distributed overhead, the exposed all-reduce counted in it once:
    # 0.125 - 0.1 = 0.025 s, so the model meets it there
    assert doc["model"]["overhead"]["at_two_s"] == pytest.approx(0.025)
    assert got[2]["predicted_step_s"] == pytest.approx(0.125) and got[2]["prediction_error"] == pytest.approx(0)
    # at 4 the calibrated overhead grows by one doubling, 0.025 * (1 + GROWTH) = 32 ms, and holds the
    # 2*3/4*1e6/0.1e9 = 15 ms all-reduce inside it (the compute as the machine's cores share it)
    plain = predict(StepProfile(compute_s=0.1, grad_bytes=10**6, samples_per_step=8), links, 4, overhead=NONE)
    assert plain.exposed_comm_s == pytest.approx(0.015)
    assert got[4]["predicted_step_s"] == pytest.approx(plain.step_s - plain.exposed_comm_s + 0.025 * (1 + GROWTH))
    doc.update(kind="scaling", workload="cnn", strategy="ddp", mode="weak", steps=20, warmup=3, batch=8, host="h")
    text = scaling_table(doc)
    assert "80%" in text and "model ms" in text and "calibrated on this run, 25.00 ms" in text
    assert "leave out start-up, per-epoch pauses" in text
    notes = write_report(doc, tmp_path)
    assert json.loads((tmp_path / "scaling.json").read_text())["rows"][1]["efficiency"] == pytest.approx(0.8)
    page = (tmp_path / "scaling.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script" not in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # self-contained
    assert notes == [] or "matplotlib" in notes[0]


def test_html_escapes_names():
    doc = {"rows": [dict(_row(1, 0.1), speedup=1.0, efficiency=1.0)], "model": {"source": "<b>x</b>"},
           "workload": "<script>", "strategy": "ddp", "mode": "weak", "steps": 1, "warmup": 0, "batch": 1}
    page = render_html(doc)
    assert "<script>" not in page and "&lt;b&gt;" in page


@pytest.mark.parametrize("argv,needle", [
    (["bench", "scaling", "--workload", "bert"], "unknown workload"),
    (["bench", "scaling", "--nproc", "0,2"], "at least 1"),
    (["bench", "scaling", "--nproc", "a"], "numbers separated by commas"),
    (["bench", "scaling", "--steps", "3", "--warmup", "3"], "leaves no measured steps"),
    (["bench", "scaling", "--cluster", "nowhere"], "unknown cluster"),
    (["bench", "comm", "--sizes", "1K..2X"], "bad message size"),
    (["bench", "comm", "--iters", "0"], "--iters must be at least 1"),
    # issue 22 items 4, 5, 7: bounded sizes, an empty list, process counts, a file as --out
    (["bench", "comm", "--sizes", "1K..99999999999999999999999G"], "more than 16G"),
    (["bench", "comm", "--sizes", "1K..1G:" + "9" * 5000], "bad size range factor"),
    (["bench", "comm", "--sizes", "9" * 5000], "more than 16G"),
    (["bench", "comm", "--sizes", ",,,"], "names no message size"),
    (["bench", "comm", "--sizes", "1..1G:2,"], "bad size range factor"),
    (["bench", "comm", "--sizes", "\u0661K"], "bad message size"),
    (["bench", "comm", "--nproc", "99999999999999999999"], "at most 1024"),
    (["bench", "scaling", "--nproc", "99999999999999999999"], "more than 1024"),
    (["bench", "scaling", "--nproc", "1,2,2000"], "more than 1024"),
    (["bench", "scaling", "--nproc", "\u0662"], "numbers separated by commas"),
    (["bench", "comm", "--sizes", "1K", "--out", "__FILE__"], "is a file, not a folder"),
    (["bench", "comm", "--sizes", "1K", "--out", "/proc/scaletrain-no/x"], "cannot write there"),
    (["doctor", "--timeout", "nan"], "must be positive"),
])
def test_bad_values_are_one_line_usage_errors(argv, needle, capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    argv = [str(a_file) if a == "__FILE__" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_bench_subcommand_flags_are_a_decision():
    import argparse

    from scaletrain.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    bench = sub.choices["bench"]
    kinds = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction)).choices

    def flags(p):
        return sorted(o for a in p._actions for o in a.option_strings if o.startswith("--"))

    assert flags(kinds["scaling"]) == sorted(["--help", "--workload", "--nproc", "--strategy", "--mode", "--steps",
                                              "--warmup", "--batch", "--cluster", "--timeout", "--out",
                                              # one Slurm job per size (scaletrain.bench.scaling_slurm)
                                              "--nodes", "--gpus-per-node", "--account", "--partition",
                                              "--time", "--device"])
    assert flags(kinds["comm"]) == sorted(["--help", "--nproc", "--timeout", "--ops", "--sizes", "--iters",
                                           "--warmup", "--out"])


def test_strong_scaling_speedup_follows_the_step_time_shown_and_the_model_splits_the_batch():
    """The contradiction users saw: ms/step 89.7 -> 111.9 while the speed-up read 1.02 (a mean-based
    rate) and the model claimed 74% (it assumed each device kept the whole batch)."""
    base = _row(1, 0.0897) | {"mode": "strong", "batch_per_device": 32, "samples_per_s": 356.7}
    two = _row(2, 0.1119, busbw=0.5) | {"mode": "strong", "batch_per_device": 16, "samples_per_s": 364.0}
    links, source = local_links([base, two], background_load=0.0)
    got = {r["nproc"]: r for r in analyse([base, two], links, source)["rows"]}
    assert got[2]["speedup"] == pytest.approx(0.0897 / 0.1119)           # same global batch: step ratio
    assert got[2]["efficiency"] == pytest.approx(0.0897 / 0.1119 / 2)    # about 40%, not 51%
    assert got[2]["samples_per_s"] == pytest.approx(32 / 0.1119)         # from the median step shown
    assert got[2]["samples_per_s_mean"] == 364.0
    # model: half the compute per device, plus the all-reduce of 1e6 bytes at 0.5 GB/s on 2 processes;
    # what the run took beyond the compute is the distributed overhead it calibrates (the exposed
    # all-reduce counted in it once), and it belongs to the half-batch step each process ran
    doc = analyse([base, two], links, source)
    assert doc["model"]["overhead"]["at_two_s"] == pytest.approx(0.1119 - 0.0897 / 2)
    assert doc["model"]["overhead"]["at_step_s"] == pytest.approx(0.0897 / 2)
    assert got[2]["predicted_efficiency"] == pytest.approx(0.5 * 0.0897 / 0.1119)


def _gpu_row(n, step_s, batch, nodes=1):
    return _row(n, step_s) | {"mode": "strong", "batch_per_device": batch, "device": "cuda:0", "backend": "nccl",
                              "grad_bytes": 10**8, "nodes": nodes}


def test_bench_scaling_strong_on_a_cluster_prints_the_corrected_figures():
    """bench scaling --mode strong on JUWELS Booster: one batch of 64 split 8 ways over 2 nodes. The
    overhead rides on each GPU's 25 ms step, not on the 200 ms 1-GPU step (39e04f3: 54%)."""
    from scaletrain.bench.scaling import profile_links
    from scaletrain.observe.overhead import DEFAULT_FRACTION, FRACTION_RANGE, GROWTH_RANGE

    links, source = profile_links("juwels-booster")
    rows = [_gpu_row(1, 0.2, 64), _gpu_row(8, 0.04, 8, nodes=2)]     # no multi-GPU run on one node: default
    doc = analyse(rows, links, source)
    eight = doc["rows"][1]
    # the 100 MB all-reduce (2*7/8*1e8/80e9 + 14 x 10 us = 2.33 ms) hides behind the 25 ms step's backward;
    # the overhead: 14.6% of 100 ms x (25/100)**0.5 x (1 + 0.28 x 2) = 11.4 ms
    per_gpu = 0.2 / 8

    def overhead(fraction, growth):     # the default is stated for a 100 ms step, carried as step ** 0.5
        return fraction * 0.1 * (per_gpu / 0.1) ** 0.5 * (1 + growth * 2)

    assert eight["predicted_step_s"] == pytest.approx(per_gpu + overhead(DEFAULT_FRACTION, GROWTH))
    assert eight["predicted_efficiency"] == pytest.approx(per_gpu / (per_gpu + 0.011388), abs=1e-4)
    assert eight["predicted_efficiency_low"] == pytest.approx(
        per_gpu / (per_gpu + overhead(FRACTION_RANGE[1], GROWTH_RANGE[1])))
    doc.update(kind="scaling", workload="cnn", strategy="ddp", mode="strong", steps=20, warmup=3, batch=64, host="h")
    line = scaling_table(doc).splitlines()[2]
    assert "69% (57-97%)" in line, line


def test_html_report_says_when_with_what_and_how_it_was_measured(tmp_path):
    from scaletrain.bench.scaling import ScalingRequest, build_document

    rows = [_row(1, 0.1) | {"torch": "2.13.0+cpu"}, _row(2, 0.125, busbw=0.1)]
    links, source = local_links(rows, background_load=0.0)
    doc = build_document(ScalingRequest(nproc=(1, 2)), rows, links, source)
    doc["command"] = "scaletrain bench scaling --nproc 1,2 --out b/"
    assert doc["torch_version"] == "2.13.0+cpu" and doc["scaletrain_version"]
    assert len(doc["date"]) == len("2026-11-25 03:04 UTC")
    page = render_html(doc)
    assert f"on {doc['date']}" in page and f"scaletrain {doc['scaletrain_version']}" in page
    assert "torch 2.13.0+cpu" in page and "<code>scaletrain bench scaling --nproc 1,2 --out b/</code>" in page
    assert 'transform="rotate(-90' in page and ">parallel efficiency</text>" in page   # the y-axis title
    assert page.count('<td class="limit">') == 2                                       # prose column wraps


def test_bench_out_names_the_files_it_wrote_and_warns_before_replacing_a_report(capsys, tmp_path, monkeypatch):
    import scaletrain.bench.scaling as scaling
    from scaletrain.cli.main import main

    rows = [_row(1, 0.1), _row(2, 0.125, busbw=0.1)]
    monkeypatch.setattr(scaling, "run_size", lambda req, n, workdir: rows[n - 1])
    out = tmp_path / "bench"
    assert main(["bench", "scaling", "--nproc", "1,2", "--out", f"{out}/"]) == 0
    err = capsys.readouterr().err
    assert f"wrote {out / 'scaling.json'}, {out / 'scaling.html'}" in err and "//" not in err
    assert "will be replaced" not in err
    assert main(["bench", "scaling", "--nproc", "1,2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{out / 'scaling.json'} (from " in err and "will be replaced" in err
    (tmp_path / "file").write_text("x")
    assert main(["bench", "scaling", "--nproc", "1,2", "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["scaling", "comm"])
def test_each_bench_kind_has_examples_in_its_help(capsys, kind):
    from scaletrain.cli.main import main

    with pytest.raises(SystemExit):
        main(["bench", kind, "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and f"scaletrain bench {kind} " in out.split("examples:")[1]
