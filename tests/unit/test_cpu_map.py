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
    from scaletrain.launch import cpu_smoke
    cpu_smoke.patch_torch(torch)
    cpu_smoke.clip_affinity()
    out = {}
    seen = {}
    def helper():
        seen["thread"] = str(torch.ones(2, device="cuda").device)
        seen["thread_int"] = str(torch.zeros(1).to(1).device)
    t = threading.Thread(target=helper)
    t.start(); t.join()
    out.update(seen)
    out["device_int"] = str(torch.device(1))
    out["isinstance"] = isinstance(torch.device("cpu"), torch.device)
    m = torch.nn.Linear(2, 2).to(1)
    out["module_int"] = str(m.weight.device)
    out["module_cuda_rank"] = str(torch.nn.Linear(2, 2).cuda(1).weight.device)
    torch.cuda.set_device(1)
    out["current"] = torch.cuda.current_device()
    out["to_current"] = str(torch.ones(1).to(torch.cuda.current_device()).device)
    out["accelerator"] = str(torch.accelerator.current_accelerator())
    out["acc_index"] = torch.accelerator.current_device_index()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = torch.ones(3, device="cuda") * 2
    s.wait_stream(torch.cuda.current_stream()); s.synchronize()
    e1, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e1.record(); e2.record(); e2.synchronize()
    out["elapsed_ok"] = e1.elapsed_time(e2) >= 0
    out["stream_sum"] = float(y.sum())
    out["generator"] = str(torch.Generator("cuda").device)
    try:
        torch.cuda.CUDAGraph()
    except Exception as exc:
        out["graph"] = [type(exc).__name__, exc.message]
    os.sched_setaffinity(0, range(0, 4096))
    os.sched_setaffinity(0, range(0, 4096))
    out["cores"] = sorted(os.sched_getaffinity(0)) == list(range(os.cpu_count()))
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def probe():
    proc = subprocess.run([sys.executable, "-c", _PROBE], env=worker_env(), capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_threads_the_program_starts_are_mapped_too(probe):
    out, _ = probe
    assert out["thread"] == "cpu" and out["thread_int"] == "cpu"


def test_integer_devices(probe):
    out, _ = probe
    assert out["device_int"] == "cuda:1" and out["isinstance"] is True
    assert out["module_int"] == out["module_cuda_rank"] == out["to_current"] == "cpu"
    assert out["current"] == 1 and out["acc_index"] == 1


def test_streams_events_and_the_accelerator(probe):
    out, _ = probe
    assert out["accelerator"] == "cuda" and out["stream_sum"] == 6.0 and out["elapsed_ok"]
    assert out["generator"] == "cpu"


def test_cuda_graphs_are_refused_in_one_line(probe):
    out, _ = probe
    kind, message = out["graph"]
    assert kind == "UsageError"
    assert message == ("--cpu cannot run torch.cuda.CUDAGraph: CUDA graphs replay recorded GPU "
                       "kernels; the CPU has none to replay")


def test_a_core_list_this_machine_lacks_is_clipped_and_said_once(probe):
    out, err = probe
    assert out["cores"] is True
    lines = [ln for ln in err.splitlines() if "os.sched_setaffinity asked for cores 0-4095" in ln]
    assert len(lines) == 1 and "this machine has" in lines[0]
