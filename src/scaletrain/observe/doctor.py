"""Checks of a live allocation for ``scaletrain doctor`` (every rank runs them).

Run inside a job (``srun scaletrain doctor``, or ``scaletrain run --nproc-per-node N -m
scaletrain.doctor``), each rank in turn:

1. MASTER_ADDR resolves, and rank 0's rendezvous port is reachable (other ranks) or free
   (rank 0, when no launcher agent holds it);
2. joins the job (``scaletrain.init``) and shares host, device and CPU affinity; rank 0 prints
   one line per rank;
3. rank <-> device mapping: with NCCL no two ranks of one host on the same GPU;
4. a short all_reduce returns the right sum, and its bus bandwidth is compared with the
   cluster profile's expectation.

The first failure raises :class:`DoctorError` (exit 1) with a hint; checks that need every
rank end on every rank together, so nothing waits for a rank that already gave up.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from scaletrain.errors import ScaletrainError
from scaletrain.runtime.current import collective_device
from scaletrain.runtime.gloo import new_lazy_group


class DoctorError(ScaletrainError):
    """A doctor check failed."""

    exit_code = 1


@dataclass(frozen=True, kw_only=True)
class RankReport:
    """What one rank reports about itself."""

    rank: int
    local_rank: int
    host: str
    device: str
    physical_gpu: int | None
    backend: str
    affinity: str


def resolve_master(addr: str) -> str:
    """The IP address of ``addr``, or DoctorError saying it does not resolve."""
    try:
        return str(socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0])
    except (socket.gaierror, UnicodeError) as exc:
        raise DoctorError(f"MASTER_ADDR {addr!r} does not resolve on {socket.gethostname()}: {exc}",
                          "set MASTER_ADDR to a host name every node can resolve: the first node "
                          "of the job (scontrol show hostnames $SLURM_JOB_NODELIST | head -n1), "
                          "with the cluster's interconnect suffix where it has one") from None


def reach_master(addr: str, port: int, *, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """Connect to ``addr:port`` until it answers or ``timeout_s`` passes (rank 0 may start late)."""
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, min(5.0, left))):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            break
        sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    raise DoctorError(f"cannot reach MASTER_ADDR {addr}:{port} from {socket.gethostname()} within "
                      f"{timeout_s:g} s ({last})",
                      "check that rank 0 runs on that host, that MASTER_PORT is the same on every "
                      "rank and not blocked by a firewall, and that MASTER_ADDR names an "
                      "interface the other nodes can reach")


def check_mapping(infos: list[RankReport]) -> None:
    """Raise when two ranks on one host drive the same GPU with NCCL (NCCL refuses that)."""
    seen: dict[tuple[str, Any], int] = {}
    for info in sorted(infos, key=lambda i: i.rank):
        if not info.device.startswith("cuda"):
            continue
        key = (info.host, info.physical_gpu if info.physical_gpu is not None else info.device)
        if key in seen and info.backend == "nccl":
            raise DoctorError(
                f"ranks {seen[key]} and {info.rank} on {info.host} both use GPU {key[1]} with NCCL",
                "give each task its own GPU (srun --gpus-per-task=1, or one task per GPU with "
                "--ntasks-per-node equal to the GPUs per node); to share a GPU on purpose use "
                "'scaletrain run --procs-per-gpu K' (gloo)")
        seen.setdefault(key, info.rank)


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """all_reduce bus bandwidth in GB/s (nccl-tests: algbw x 2(n-1)/n)."""
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def expected_bandwidth(profile: Any, *, num_nodes: int) -> float | None:
    """The bus bandwidth in GB/s a profile promises (inter-node when several nodes), or None."""
    if profile is None:
        return None
    gbps = profile.inter_node_gbps if num_nodes > 1 else profile.intra_node_gbps
    return gbps / 8 if gbps else None


def judge_bandwidth(measured: float, expected: float | None) -> tuple[str, str | None]:
    """(status line, failure hint or None): below 10% of the profile's peak fails."""
    if expected is None:
        return f"all_reduce bus bandwidth {measured:.2f} GB/s (no expectation in the profile)", None
    ratio = measured / expected
    line = f"all_reduce bus bandwidth {measured:.2f} GB/s = {ratio * 100:.0f}% of the profile's {expected:.0f} GB/s"
    if ratio < 0.10:
        return line, ("NCCL is probably using TCP sockets on the wrong network: run with NCCL_DEBUG=INFO "
                      "and check NCCL_SOCKET_IFNAME / NCCL_IB_HCA against the interfaces above, and the "
                      "cluster's recommended NCCL/OFI plugin modules")
    return line, None


def _info(env: Any) -> RankReport:
    from scaletrain.observe.envreport import collect
    from scaletrain.runtime.device import physical_gpu

    return RankReport(rank=env.rank, local_rank=env.local_rank, host=socket.gethostname(), device=env.device,
                    physical_gpu=physical_gpu(env.device, os.environ), backend=env.backend,
                    affinity=collect(with_torch=False)["cpu_affinity"])


def _agree(ok: bool, message: str, hint: str) -> None:
    """Every rank learns whether any rank failed; all raise together."""
    import torch
    import torch.distributed as dist

    from scaletrain.runtime import collectives

    flag = torch.tensor([0.0 if ok else 1.0])
    # a CPU flag: over a gloo group of its own unless the world's backend takes CPU tensors
    group = None if collective_device() == "cpu" else new_lazy_group(dist)
    collectives.all_reduce(flag, group=group)
    if flag.item() > 0:
        raise DoctorError(message or "another rank failed a check (see its output)", hint)


def run_checks(env_before: Any, *, timeout_s: float, size_mb: float, out: Callable[[str], None],
               environ: Mapping[str, str]) -> list[str]:
    """Run the checks in the module docstring; returns the PASS lines (rank 0 prints them)."""
    passed: list[str] = []
    addr = env_before.master_addr
    ip = resolve_master(addr)
    passed.append(f"MASTER_ADDR {addr} resolves to {ip}")
    agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    if env_before.rank == 0 and not agent_store:
        from scaletrain.launch.ports import port_is_free

        if not port_is_free(env_before.master_port):
            raise DoctorError(f"MASTER_PORT {env_before.master_port} is in use on {socket.gethostname()}",
                              "another job on this node holds it: pick another port (the port is "
                              "derived from the job id; export MASTER_PORT to override)")
        passed.append(f"MASTER_PORT {env_before.master_port} is free on rank 0's host")
    elif env_before.rank != 0 or agent_store:
        reach_master(addr, env_before.master_port, timeout_s=timeout_s)
        passed.append(f"MASTER_ADDR {addr}:{env_before.master_port} is reachable")

    import torch
    import torch.distributed as dist

    from scaletrain.runtime import collectives, settle
    from scaletrain.runtime.init import init

    env = init(timeout_s=timeout_s)
    passed.append(f"{env.world_size} ranks joined ({env.backend})")
    group = new_lazy_group(dist) if env.backend != "gloo" else None
    infos = collectives.all_gather_objects(asdict(_info(env)), group=group)
    ranks = [RankReport(**i) for i in infos]
    if env.rank == 0:
        out("rank  local  host                  device    gpu  cores")
        for r in ranks:
            out(f"{r.rank:<5} {r.local_rank:<6} {r.host[:21]:<21} {r.device:<9} "
                f"{'-' if r.physical_gpu is None else r.physical_gpu!s:<4} {r.affinity}")
    check_mapping(ranks)  # every rank holds the same list: all raise together or none
    passed.append("every rank has its own device" if env.device.startswith("cuda")
                  else "rank <-> device mapping consistent (CPU)")

    device = torch.device(env.device)
    numel = max(1, int(size_mb * 1024 ** 2 / 4))
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    for _ in range(2):
        collectives.all_reduce(buf)
    buf.fill_(float(env.rank + 1))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    collectives.all_reduce(buf)
    want = env.world_size * (env.world_size + 1) / 2
    got = float(buf[0].item())
    correct = got == want and float(buf[-1].item()) == want
    _agree(correct, f"all_reduce returned {got} where {want} was expected",
           "a wrong collective result points at a broken interconnect or NCCL install: run "
           "with NCCL_DEBUG=INFO and report it to the centre")
    iters = 5
    before = settle.holders([buf])
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - t0) / iters
    settle.let_go([buf], before)  # the timed loop's works, after the timing
    measured = bus_bandwidth(numel * 4, seconds, env.world_size)
    line, hint = judge_bandwidth(measured, expected_bandwidth(_profile(environ), num_nodes=env.num_nodes))
    _agree(hint is None, line, hint or "")
    passed.append(f"all_reduce of {numel * 4 / 1024 ** 2:.0f} MiB correct; {line}")
    return passed


def _profile(environ: Mapping[str, str]) -> Any:
    """The job's cluster profile (named by the generated script's SCALETRAIN_CLUSTER), or None.

    doctor is a CLI verb: it may read the profile itself; the training runtime never does.
    """
    from scaletrain.clusters.profile import load_profile
    from scaletrain.contract.environ import CLUSTER_VAR
    from scaletrain.errors import ScaletrainError

    name = environ.get(CLUSTER_VAR, "").strip()
    if not name:
        return None
    try:
        return load_profile(name)
    except ScaletrainError:
        return None
