"""Start-up at N ranks: the store traffic of a launch, replayed against a real TCPStore.

    PYTHONPATH=src python3 benchmarks/scale_startup.py [--n 256,1024] [--backends libuv,legacy]
        [--modes srun-nccl-eager,srun-nccl-lazy,run-nccl-lazy] [--save]

What each rank asks of the rendezvous store was recorded from a real 4-rank run
(``benchmarks/scale_record.py`` -> ``scale_data/recorded.json``). Here each rank's requests are
written as a template of N (:func:`rank_ops`), checked against the recording at N=4
(:func:`check_against_recording`), and replayed by N simulated clients - raw sockets speaking
torch's wire protocol (:mod:`scale_wire`), each waiting for its answers as torch's client does -
against a real ``torch.distributed.TCPStore`` server in its own process, with either of torch's
two server backends (libuv, the default since torch 2.4, and the legacy poll() loop).

Measured: the server process's CPU time (its ``utime + stime``: on a real job 24,000 clients are
24,000 processes and the server's one thread is the serial part), its peak memory beyond the
empty store, the wall time of the whole replay (an upper bound: the simulated clients are
Python on two cores), and the requests and bytes.

Modes (what a 24,000-GPU job does):

- ``srun-nccl-eager``: one task per GPU (``srun``/``scaletrain`` launchers): rank 0 hosts the
  store and waits for every rank (torch's ``waitForWorkers``, a poll of ``init/`` every 10 ms);
  the NCCL group exchanges its unique id(s) (modelled from torch's ``ProcessGroupNCCL``: one id
  up to ``TORCH_NCCL_RANKS_PER_ROOT``=128 ranks, then one per 128 ranks and every rank reads
  them all - NCCL cannot run on this machine, so this part is not recorded); the checkpoint's
  gloo group connects eagerly as recorded (every rank reads every rank's address: N^2 reads of
  values that grow with N - scaletrain at 39e04f3);
- ``srun-nccl-lazy``: the same, the checkpoint's gloo group made with ``TORCH_GLOO_LAZY_INIT``
  (now): each rank reads only the peers its collectives use (rank 0: everyone, for the
  gather; the others: rank 0, their ring neighbours and binomial-tree parent);
- ``run-nccl-lazy``: ``scaletrain run``, one agent per node of 4: the agents' static rendezvous
  as recorded (node 0's agent hosts the store and waits for every agent, reads every agent's
  role record and writes every rank assignment), the workers as ``srun-nccl-lazy``;
- ``srun-gloo-eager``: the recorded CPU job itself (default group and checkpoint group, both
  gloo, eager): only small N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_wire as w  # noqa: E402
from scale_common import done, emit  # noqa: E402
from scale_wire import Op  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "benchmarks" / "scale_data" / "recorded.json"
RANKS_PER_NODE = 4            # JUPITER: 4 GH200 per node
NCCL_RANKS_PER_ROOT = 128     # torch's TORCH_NCCL_RANKS_PER_ROOT default
NCCL_ID_BYTES = 128           # sizeof(ncclUniqueId)
POLL_S = 0.010                # TCPStore::waitForWorkers polls every 10 ms
MODES = ("srun-nccl-eager", "srun-nccl-lazy", "run-nccl-lazy", "srun-gloo-eager")
_AGENT = "/scaletrain/torchelastic"
DEFAULT_PG = "/default_pg/0//cpu//0/"
CKPT_PG = "/default_pg/0//1//cpu//0/"   # the second group made: the checkpoint's
NCCL_PG = "/default_pg/0//cuda//"


@dataclass(frozen=True)
class Poll:
    """torch's rank 0 waiting for its workers: WAIT + GET of ``key`` every 10 ms until >= target."""

    key: str
    target: int


Step = Op | Poll


# -- templates: what rank r of N sends ----------------------------------------------------------

def _hello(pid: int) -> list[Op]:
    return [Op(w.VALIDATE, number=w.MAGIC), Op(w.PING, number=pid & 0xFFFFFFFF)]


def _gloo_eager(prefix: str, r: int, n: int) -> list[Op]:
    """gloo's connectFullMesh: this rank's address list (154 + 8 bytes per rank), then every
    rank's, each after two waits (gloo's own, then the client's get)."""
    ops = [Op(w.SET, (f"{prefix}{r}",), (154 + 8 * n,))]
    for i in range(n):
        key = (f"{prefix}{i}",)
        ops += [Op(w.WAIT, key), Op(w.WAIT, key), Op(w.GET, key)]
    return ops


def lazy_peers(r: int, n: int) -> list[int]:
    """The peers a lazily connected gloo group of ``n`` makes rank ``r`` connect to for a
    checkpoint's collectives: gather/scatter to rank 0 (rank 0: everyone), the ring of
    allgather (the sizes of gather_object), the binomial tree of broadcast."""
    if n == 1:
        return []
    if r == 0:
        return list(range(1, n))
    peers = {0, (r - 1) % n, (r + 1) % n}
    peers.add(r - (1 << (r.bit_length() - 1)))                  # tree parent
    k = 1 << r.bit_length()
    while r + k < n:                                            # tree children
        peers.add(r + k)
        k <<= 1
    peers.discard(r)
    return sorted(peers)


def _gloo_lazy(prefix: str, r: int, n: int) -> list[Op]:
    ops = [Op(w.SET, (f"{prefix}{r}",), (154,))]
    for i in lazy_peers(r, n):
        key = (f"{prefix}{i}",)
        ops += [Op(w.WAIT, key), Op(w.WAIT, key), Op(w.GET, key)]
    return ops


def nccl_roots(n: int, per_root: int = NCCL_RANKS_PER_ROOT) -> list[int]:
    """The ranks that create a unique id: rank 0 alone up to ``per_root`` ranks, else the first
    rank of each block of ``per_root`` (torch's scalable init, NCCL >= 2.23)."""
    if n <= per_root:
        return [0]
    roots = (n + per_root - 1) // per_root
    return [i * n // roots for i in range(roots)]


def _nccl(r: int, n: int) -> list[Op]:
    """NCCL's unique id(s) through the store (modelled from ProcessGroupNCCL, not recorded)."""
    roots = nccl_roots(n)
    keys = tuple(f"{NCCL_PG}{i}" for i in range(len(roots)))
    ops: list[Op] = []
    if r in roots:
        ops.append(Op(w.SET, (keys[roots.index(r)],), (NCCL_ID_BYTES,)))
    if len(roots) == 1:
        return ops if r == 0 else [Op(w.WAIT, keys), Op(w.GET, keys)]
    return ops + [Op(w.WAIT, keys), Op(w.MULTI_GET, keys)]


def _store_client(r: int, n: int, *, host: bool) -> list[Step]:
    """A TCPStore client with world_size given: ADD init/; the host's rank polls until all came."""
    ops: list[Step] = [*_hello(1000 + r), Op(w.ADD, ("init/",), number=1)]
    if host:
        ops.append(Poll("init/", n))
    return ops


def _agent(a: int, m: int) -> list[Step]:
    """Node ``a``'s elastic agent of ``m`` (static rendezvous, as recorded) up to the workers'
    start; the end-of-run barrier is left out (it runs after training)."""
    ops = _store_client(a, m, host=a == 0)
    ops.append(Op(w.SET, (f"{_AGENT}/role_info/{a}",), (53,)))
    if a == 0:
        infos = tuple(f"{_AGENT}/role_info/{i}" for i in range(m))
        ranks = tuple(f"{_AGENT}/assigned_ranks/{i}" for i in range(m))
        ops += [Op(w.WAIT, infos), Op(w.MULTI_GET, infos), Op(w.MULTI_SET, ranks, (12,) * m)]
    key = (f"{_AGENT}/assigned_ranks/{a}",)
    return ops + [Op(w.WAIT, key), Op(w.GET, key)]


def clients(mode: str, n: int, per_node: int = RANKS_PER_NODE) -> list[list[Step]]:
    """Every client connection's requests for ``mode`` at ``n`` ranks (agents first)."""
    out: list[list[Step]] = []
    run = mode.startswith("run")
    if run:
        m = (n + per_node - 1) // per_node
        out += [_agent(a, m) for a in range(m)]
    for r in range(n):
        # under an agent the workers are its store's clients: none of them hosts or waits
        ops: list[Step] = _store_client(r, n, host=r == 0 and not run)
        if mode == "srun-gloo-eager":
            ops += _gloo_eager(DEFAULT_PG, r, n) + _gloo_eager(CKPT_PG, r, n)
        else:
            ops += _nccl(r, n)
            ops += _gloo_lazy(CKPT_PG, r, n) if mode.endswith("lazy") else _gloo_eager(CKPT_PG, r, n)
        out.append(ops)
    return out


# -- the check against the recording ------------------------------------------------------------

def _shape(op: list[Any]) -> tuple[Any, ...]:
    """A recorded request without what differs between runs (PING's nonce, the pid)."""
    name, keys, sizes, number = op
    return (name, tuple(keys), tuple(sizes), number if name in ("add", "validate") else 0)


def _collapse(ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Polls of ``init/`` (their count depends on timing) folded into one entry."""
    out: list[tuple[Any, ...]] = []
    for op in ops:
        if op[1] == ("init/",) and op[0] in ("wait", "get"):
            if not out or out[-1] != ("poll", ("init/",)):
                out.append(("poll", ("init/",)))
            continue
        out.append(op)
    return out


def _template_shape(steps: list[Step]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for s in steps:
        if isinstance(s, Poll):
            out.append(("poll", (s.key,)))
        else:
            out.append((s.name, s.keys, s.sizes, s.number if s.name in ("add", "validate") else 0))
    return out


def _unordered_peers(ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The requests with each group's address reads sorted: a lazy group reads its peers in the
    order its collectives reach them (an eager one in rank order: sorting changes nothing)."""
    def read(op: tuple[Any, ...]) -> bool:
        return op[0] in ("wait", "get") and op[1][0].startswith("/default_pg")
    return [op for op in ops if not read(op)] + sorted(op for op in ops if read(op))


def check_against_recording(recorded: Path = RECORDED) -> list[str]:
    """Differences between the templates at N=4 (2 per node) and the recorded requests of every
    connection (matched by the key it sets first); [] when every one matches."""
    data = json.loads(recorded.read_text())
    problems: list[str] = []
    for mode, conns in data["modes"].items():
        if mode == "env-old":      # 39e04f3: the checkpoint's group eager too
            want = clients("srun-gloo-eager", 4)
        elif mode == "env":        # this version: the default group eager (gloo), the checkpoint's lazy
            want = [_store_client(r, 4, host=r == 0) + _gloo_eager(DEFAULT_PG, r, 4)  # type: ignore[operator]
                    + _gloo_lazy(CKPT_PG, r, 4) for r in range(4)]
        elif mode == "env-lazy":
            want = [(_store_client(r, 4, host=r == 0) + _gloo_lazy(DEFAULT_PG, r, 4)  # type: ignore[operator]
                     + _gloo_lazy(CKPT_PG, r, 4)) for r in range(4)]
        else:
            want = [_agent(a, 2) for a in range(2)]
            want += [_store_client(r, 4, host=False) + _gloo_eager(DEFAULT_PG, r, 4)  # type: ignore[operator]
                     + _gloo_lazy(CKPT_PG, r, 4) for r in range(4)]
        by_first_set = {}
        for steps in want:
            shape = _template_shape(steps)
            key = next(s[1][0] for s in shape if s[0] == "set")
            by_first_set[key] = shape
        for conn in conns:
            got = _collapse([_shape(op) for op in conn["ops"]])
            key = next((s[1][0] for s in got if s[0] == "set"), None)
            expect = by_first_set.pop(key, None) if key is not None else None
            if expect is None:
                problems.append(f"{mode}: a recorded connection (first set {key}) has no template")
                continue
            if mode == "run" and key.startswith(f"{_AGENT}/role_info/"):
                got = got[:len(expect)]   # the end-of-run barrier is not start-up
            # a lazy group reads its peers in the order its collectives reach them
            got, expect = _unordered_peers(got), _unordered_peers(expect)
            if got != expect:
                diff = next(i for i, (a, b) in enumerate(zip(got + [None] * 9, expect + [None] * 9)) if a != b)
                problems.append(f"{mode}: {key}: request {diff}: recorded {got[diff:diff + 2]} "
                                f"!= template {expect[diff:diff + 2]}")
        problems += [f"{mode}: template {k} was not recorded" for k in by_first_set]
    return problems


# -- the server ----------------------------------------------------------------------------------

_SERVER = r"""
import datetime, sys, torch.distributed as dist
store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, use_libuv=sys.argv[1] == "libuv",
                      timeout=datetime.timedelta(seconds=3600))
print(store.port, flush=True)
sys.stdin.read()
"""


# torch's store server asks for each client's name (getnameinfo: a reverse DNS lookup per
# connection, in its one thread). On this machine the resolver stalls 5 s every few dozen
# lookups, which would drown the store's own work: the server gets a getnameinfo that answers
# numerically (preloaded). On a cluster each connection costs one lookup at the site's resolver.
_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <sys/socket.h>
int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen,
                char *serv, socklen_t servlen, int flags) {
    static int (*real)(const struct sockaddr *, socklen_t, char *, socklen_t, char *, socklen_t, int);
    if (!real) real = dlsym(RTLD_NEXT, "getnameinfo");
    return real(sa, salen, host, hostlen, serv, servlen, flags | NI_NUMERICHOST | NI_NUMERICSERV);
}
"""


def numeric_names() -> dict[str, str]:
    """The server's environment: LD_PRELOAD of the numeric getnameinfo (built once with cc),
    or nothing where no C compiler is (the wall times then include the resolver's stalls)."""
    import shutil
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return {}
    lib = Path(tempfile.gettempdir()) / f"scaletrain-numeric-names-{os.getuid()}.so"
    if not lib.exists():
        src = lib.with_suffix(".c")
        src.write_text(_SHIM)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        if subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src), "-ldl"],
                          capture_output=True).returncode != 0:
            return {}
        os.replace(tmp, lib)
    return {"LD_PRELOAD": str(lib)}


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_mem(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            vals[line.split(":")[0]] = int(line.split()[1]) * 1024
    return vals["VmRSS"], vals["VmHWM"]


# -- the simulated clients -----------------------------------------------------------------------

_U64 = struct.Struct("<Q")


async def _answer(reader: asyncio.StreamReader, op: Op, counts: list[int]) -> bytes:
    size = w.reply_size(op)
    last = b""
    if size:
        last = await reader.readexactly(size)
        counts[1] += size
    for _ in range(w.reply_strings(op)):
        n = _U64.unpack(await reader.readexactly(8))[0]
        last = await reader.readexactly(n)
        counts[1] += 8 + n
    return last


async def _client(addr: str, port: int, steps: list[Step], ready: asyncio.Event, counts: list[int],
                  connected: list[int], gate: asyncio.Semaphore) -> None:
    async with gate:  # a bounded connect burst (a real job's ranks start over seconds too)
        reader, writer = await asyncio.open_connection(addr, port)
    connected[0] += 1
    await ready.wait()
    for step in steps:
        if isinstance(step, Poll):
            wait, get = Op(w.WAIT, (step.key,)), Op(w.GET, (step.key,))
            while True:
                for op in (wait, get):
                    data = w.encode(op)
                    writer.write(data)
                    counts[0] += len(data)
                    counts[2] += 1
                    value = await _answer(reader, op, counts)
                if int(value or b"0") >= step.target:
                    break
                await asyncio.sleep(POLL_S)
            continue
        data = w.encode(step)
        writer.write(data)
        counts[0] += len(data)
        counts[2] += 1
        await _answer(reader, step, counts)
    await writer.drain()
    connected[1] += 1
    # stay connected, as a rank's store client does, until every client is done
    await ready.wait()
    connected.append(writer)  # type: ignore[arg-type]


def _driver(port: int, chunks: list[tuple[int, list[Step]]], conn: Any, start: Any) -> None:
    """One process of simulated clients: connect all, report, wait for the start, run, report."""
    async def main() -> None:
        ready = asyncio.Event()
        counts = [0, 0, 0]          # request bytes, reply bytes, requests
        connected: list[Any] = [0, 0]
        gate = asyncio.Semaphore(256)
        tasks = [asyncio.create_task(_client(f"127.0.0.{1 + i % 8}", port, steps, ready, counts, connected, gate))
                 for i, steps in chunks]
        while connected[0] < len(chunks):
            await asyncio.sleep(0.01)
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()  # type: ignore[misc]
        conn.send("connected")
        await asyncio.get_running_loop().run_in_executor(None, start.wait)
        t0 = time.perf_counter()
        ready.set()
        while connected[1] < len(chunks):
            await asyncio.sleep(0.002)
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()  # type: ignore[misc]
        conn.send(("done", time.perf_counter() - t0, counts))
        conn.recv()  # close together
        for t in tasks:
            t.cancel()
        for wr in connected[2:]:
            wr.close()

    asyncio.run(main())


def _collect(pipes: list[Any], procs: list[Any], want: str | None) -> Any:
    """Each driver's next message (``want``: the one expected, checked); a string saying which
    driver failed instead, when one dies before it sent it (the others are stopped then: their
    clients would wait for keys the dead ones were to set)."""
    from multiprocessing.connection import wait

    got: dict[int, Any] = {}
    while len(got) < len(pipes):
        ready = wait([p for i, p in enumerate(pipes) if i not in got] +
                     [proc.sentinel for i, proc in enumerate(procs) if i not in got])
        for i, (pipe, proc) in enumerate(zip(pipes, procs)):
            if i in got:
                continue
            if pipe in ready or pipe.poll():
                try:
                    got[i] = pipe.recv()
                    continue
                except EOFError:
                    pass
            if proc.sentinel in ready and not pipe.poll():
                for other in procs:
                    if other.is_alive():
                        other.kill()
                return f"simulated clients {i} failed (exit {proc.exitcode}): the server reset their connections"
        if want is not None and any(m != want for m in got.values()):
            return f"a driver said {got}"
    return "" if want is not None else [got[i] for i in range(len(pipes))]


def _files_needed(n_clients: int, drivers: int) -> int:
    return max(n_clients // drivers + 64, n_clients + 64)


def replay(mode: str, n: int, backend: str, *, drivers: int = 2) -> dict[str, Any]:
    """Replay ``mode`` at ``n`` ranks against a fresh server; the measurements."""
    conns = clients(mode, n)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if _files_needed(len(conns), drivers) > limit:
        return {"step": "startup", "series": f"{mode}, {backend}", "mode": mode, "n": n, "backend": backend, "skipped":
                f"{len(conns)} connections: above this machine's open-file limit ({limit}) for one server"}
    server = subprocess.Popen([sys.executable, "-c", _SERVER, backend], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, **numeric_names()})
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        time.sleep(0.2)
        base_rss = _proc_mem(server.pid)[0]
        indexed = list(enumerate(conns))
        parts = [indexed[d::drivers] for d in range(drivers)]
        ctx = mp.get_context("fork")
        start = ctx.Event()
        pipes, procs = [], []
        for part in parts:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_driver, args=(port, part, theirs, start), daemon=True)
            proc.start()
            theirs.close()          # a driver that dies closes its end: recv() then sees EOF
            pipes.append(ours)
            procs.append(proc)
        failed = _collect(pipes, procs, "connected")
        cpu0 = _proc_cpu(server.pid)
        t0 = time.perf_counter()
        start.set()
        results = [] if failed else _collect(pipes, procs, None)
        wall = time.perf_counter() - t0
        cpu = _proc_cpu(server.pid) - cpu0
        rss, hwm = _proc_mem(server.pid)
        for p in pipes:
            try:
                p.send("close")
            except OSError:
                pass
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        if failed or isinstance(results, str):
            return {"step": "startup", "series": f"{mode}, {backend}", "mode": mode, "n": n, "backend": backend,
                    "connections": len(conns), "failed": failed or results, "server_cpu_s": round(cpu, 4),
                    "wall_s": round(wall, 3)}
        counts = [sum(r[2][i] for r in results) for i in range(3)]
        return {"step": "startup", "series": f"{mode}, {backend}", "mode": mode, "n": n, "backend": backend,
                "connections": len(conns),
                "server_cpu_s": round(cpu, 4), "wall_s": round(wall, 3),
                "server_mem_mb": round((hwm - base_rss) / 2**20, 2), "requests": counts[2],
                "request_mb": round(counts[0] / 2**20, 3), "reply_mb": round(counts[1] / 2**20, 3)}
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def model_counts(mode: str, n: int) -> dict[str, float]:
    """Requests and bytes of ``mode`` at ``n`` counted from the templates (no replay): what the
    eager modes would send at sizes too big to replay. Polls count as one WAIT + GET."""
    req = reply = 0.0
    count = 0
    for steps in clients(mode, n):
        for s in steps:
            ops = [Op(w.WAIT, (s.key,)), Op(w.GET, (s.key,))] if isinstance(s, Poll) else [s]
            for op in ops:
                count += 1
                req += op.request_bytes()
                reply += w.reply_size(op) + 8 * w.reply_strings(op)
                if op.kind in (w.GET, w.MULTI_GET):
                    reply += sum(_value_size(k, mode, n) for k in op.keys)
    return {"requests": count, "request_mb": req / 2**20, "reply_mb": reply / 2**20}


def _value_size(key: str, mode: str, n: int) -> int:
    if key.startswith(NCCL_PG):
        return NCCL_ID_BYTES
    if key.startswith("/default_pg"):
        return 154 + 8 * n if ("eager" in mode) else 154
    if "assigned_ranks" in key:
        return 12
    if "role_info" in key:
        return 53
    return len(str(n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="256,1024")
    parser.add_argument("--eager-n", default="64,128,256", help="N for the eager (quadratic) modes")
    parser.add_argument("--backends", default="libuv,legacy")
    parser.add_argument("--modes", default="srun-nccl-eager,srun-nccl-lazy,run-nccl-lazy")
    parser.add_argument("--save", action="store_true", help="add the rows to docs/img/scale.json (scale_report.py)")
    args = parser.parse_args()
    problems = check_against_recording()
    if problems:
        print("templates differ from the recording:\n  " + "\n  ".join(problems))
        return 1
    print("templates match the recorded 4-rank runs (" + ", ".join(json.loads(RECORDED.read_text())["modes"]) + ")")
    rows = []
    for mode in args.modes.split(","):
        sizes = args.eager_n if "eager" in mode else args.n
        for n in [int(x) for x in sizes.split(",")]:
            for backend in args.backends.split(","):
                row = replay(mode, n, backend)
                emit(rows, row)
    return done(rows, args.save)


if __name__ == "__main__":
    sys.exit(main())
