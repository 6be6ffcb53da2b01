"""The --cpu mapping on an imported torch, checked in a fresh interpreter (it patches torch for
the life of the process): integer devices, every thread, streams, the accelerator API, what it
refuses, and the core-list clipping."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from workers import worker_env

_PROBE = textwrap.dedent("""
    import json, os, sys, threading
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    import torch
    from scaletrain.launch.inproc import cpu_smoke
    cpu_smoke.patch_torch(torch)
    out = {}

    def check(name, fn):  # each check alone: one missing piece fails only its own test
        try:
            out[name] = fn()
        except Exception as exc:
            out[name] = ["raised", type(exc).__name__, getattr(exc, "message", str(exc))]

    def in_thread():
        seen = {}
        def helper():
            seen["a"] = str(torch.ones(2, device="cuda").device)
            seen["b"] = str(torch.zeros(1).to(1).device)
        t = threading.Thread(target=helper)
        t.start(); t.join()
        return [seen.get("a"), seen.get("b")]

    def streams():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y = torch.ones(3, device="cuda") * 2
        s.wait_stream(torch.cuda.current_stream()); s.synchronize()
        e1, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e1.record(); e2.record(); e2.synchronize()
        return [float(y.sum()), e1.elapsed_time(e2) >= 0, s.is_capturing()]

    def cores():
        getattr(cpu_smoke, "clip_affinity", lambda: None)()
        os.sched_setaffinity(0, range(0, 4096))
        os.sched_setaffinity(0, range(0, 4096))
        return sorted(os.sched_getaffinity(0)) == list(range(os.cpu_count()))

    def set_current():
        torch.cuda.set_device(1)
        return [torch.cuda.current_device(), torch.accelerator.current_device_index(),
                str(torch.ones(1).to(torch.cuda.current_device()).device)]

    check("thread", in_thread)
    check("device_int", lambda: str(torch.device(1)))
    check("isinstance", lambda: isinstance(torch.device("cpu"), torch.device))
    check("module_int", lambda: str(torch.nn.Linear(2, 2).to(1).weight.device))
    check("module_cuda_rank", lambda: str(torch.nn.Linear(2, 2).cuda(1).weight.device))
    check("current", set_current)
    check("accelerator", lambda: str(torch.accelerator.current_accelerator()))
    check("streams", streams)
    check("generator", lambda: str(torch.Generator("cuda").device))
    check("graph", lambda: torch.cuda.CUDAGraph())
    check("cores", cores)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def probe():
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=worker_env(), capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_threads_the_program_starts_are_mapped_too(probe):
    assert probe[0]["thread"] == ["cpu", "cpu"]


def test_integer_devices(probe):
    out, _ = probe
    assert out["device_int"] == "cuda:1" and out["isinstance"] is True
    assert out["module_int"] == out["module_cuda_rank"] == "cpu"
    assert out["current"] == [1, 1, "cpu"]


def test_streams_events_and_the_accelerator(probe):
    out, _ = probe
    assert out["accelerator"] == "cuda" and out["streams"] == [6.0, True, False]
    assert out["generator"] == "cpu"


def test_cuda_graphs_are_refused_in_one_line(probe):
    assert probe[0]["graph"] == ["raised", "UsageError", (
        "--cpu cannot run torch.cuda.CUDAGraph: CUDA graphs replay recorded GPU kernels; the "
        "CPU has none to replay")]


def test_a_core_list_this_machine_lacks_is_clipped_and_said_once(probe):
    out, err = probe
    assert out["cores"] is True
    lines = [ln for ln in err.splitlines() if "os.sched_setaffinity asked for cores 0-4095" in ln]
    assert len(lines) == 1 and "this machine has" in lines[0]
