"""scaletrain doctor: the report, and each check failing with a hint on a contrived fault."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from helpers import NO_GPUS
from workers import REPO, worker_env

from scaletrain.clusters.profile import load_profile
from scaletrain.observe import envreport
from scaletrain.observe.doctor import (DoctorError, RankReport, bus_bandwidth, check_mapping,
                                       expected_bandwidth, judge_bandwidth, reach_master, resolve_master)


def _info(rank, host, device, gpu, backend="nccl"):
    return RankReport(rank=rank, local_rank=rank, host=host, device=device, physical_gpu=gpu,
                    backend=backend, affinity="0-7")


def test_two_ranks_on_one_gpu_with_nccl_fail_with_hint():
    bad = [_info(0, "n1", "cuda:0", 0), _info(1, "n1", "cuda:0", 0)]
    with pytest.raises(DoctorError) as err:
        check_mapping(bad)
    assert "ranks 0 and 1 on n1 both use GPU 0" in err.value.message
    assert "--gpus-per-task" in err.value.hint
    # the same physical GPU index on two hosts, or shared on purpose with gloo, is fine
    check_mapping([_info(0, "n1", "cuda:0", 0), _info(1, "n2", "cuda:0", 0)])
    check_mapping([_info(0, "n1", "cuda:0", 0, "gloo"), _info(1, "n1", "cuda:0", 0, "gloo")])
    # CUDA_VISIBLE_DEVICES=0 and =1 per task: cuda:0 twice but physical 0 and 1
    check_mapping([_info(0, "n1", "cuda:0", 0), _info(1, "n1", "cuda:0", 1)])


def test_unresolvable_master_addr():
    with pytest.raises(DoctorError) as err:
        resolve_master("no-such-host.invalid")
    assert "does not resolve" in err.value.message and "MASTER_ADDR" in err.value.hint
    assert resolve_master("localhost") in ("127.0.0.1", "::1")


def test_unreachable_master_port_fails_within_timeout():
    with socket.socket() as s:  # a port nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(DoctorError) as err:
            reach_master("127.0.0.1", port, timeout_s=0.5)
    assert f"cannot reach MASTER_ADDR 127.0.0.1:{port}" in err.value.message
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        reach_master("127.0.0.1", srv.getsockname()[1], timeout_s=2)


def test_bandwidth_against_profile():
    assert bus_bandwidth(10**9, 1.0, 2) == pytest.approx(1.0)
    assert bus_bandwidth(10**9, 1.0, 4) == pytest.approx(1.5)
    juwels = load_profile("juwels-booster")
    assert expected_bandwidth(juwels, num_nodes=1) == pytest.approx(600.0)
    assert expected_bandwidth(juwels, num_nodes=2) == pytest.approx(100.0)
    assert expected_bandwidth(load_profile("local"), num_nodes=1) is None
    line, hint = judge_bandwidth(5.0, 100.0)
    assert "5% of the profile's 100 GB/s" in line and "NCCL_SOCKET_IFNAME" in hint
    assert judge_bandwidth(60.0, 100.0)[1] is None


def test_report_names_what_a_bug_report_needs(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    text = envreport.render(envreport.collect())
    for word in ("python:", "torch:", "nccl:", "cpu_affinity:", "interfaces:", "lo 127.0.0.1",
                 "SLURM_JOB_ID=42", "NCCL_DEBUG=INFO"):
        assert word in text


def test_doctor_cli_fails_with_hint_on_unresolvable_master():
    # 2 local ranks of a CPU-only machine (on a 1-GPU node the GPU count would fail them first)
    env = worker_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                      "MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29999", **NO_GPUS})
    proc = subprocess.run([sys.executable, "-m", "scaletrain.doctor", "--timeout", "2"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "does not resolve" in proc.stderr and "HINT:" in proc.stderr
    assert "Traceback" not in proc.stderr
