"""Record what every rank asks of the rendezvous store, from a real 4-rank run (``strace``).

    PYTHONPATH=src python3 benchmarks/scale_record.py [--out benchmarks/scale_data/recorded.json]

Two launches of ``benchmarks/scale_rec_worker.py`` (init, DDP, a Monitor, a Checkpointer and
its first save, on the CPU with gloo), each under ``strace -f``, which sees every byte a
process writes to the store's port - torch's C++ clients included (gloo's rendezvous, the
elastic agent's):

- ``env``: four tasks as ``srun`` starts them under the ``srun``/``scaletrain`` launchers
  (RANK, WORLD_SIZE, MASTER_ADDR/PORT; rank 0 hosts the store);
- ``run``: two ``scaletrain run`` agents ("nodes") of two workers each, as the generated
  script's ``scaletrain-run`` line starts them (static rendezvous; node 0's agent hosts the
  store, the workers are its clients);
- ``env-lazy``: ``env`` again with torch's ``TORCH_GLOO_LAZY_INIT=1`` for every group;
- ``env-old`` (``--old-src``): ``env`` with another scaletrain (39e04f3 made its checkpoint
  group eagerly).

Each connection's byte stream is cut into requests (:mod:`scale_wire`); the JSON keeps, per
connection, its operations (kind, keys, value sizes). ``benchmarks/scale_startup.py`` checks
its per-rank templates against this file at N=4 before it replays them at N ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_wire import Op, parse_requests  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "benchmarks" / "scale_rec_worker.py"
OUT = REPO / "benchmarks" / "scale_data" / "recorded.json"
_LINE = re.compile(r"^(\d+) (.*)$")
_STRING = re.compile(r'"((?:\\x[0-9a-f]{2})*)"')
_RET = re.compile(r"\) += (-?\d+)")
TRACED = "connect,sendto,sendmsg,write,writev,close,clone,clone3"


def _unhex(text: str) -> bytes:
    return bytes.fromhex(text.replace("\\x", ""))


def streams(trace: Path, port: int) -> list[tuple[int, bytes]]:
    """(process id, bytes written) of every connection to ``port`` in an ``strace -f -xx``
    log, in the order they were opened. Threads are mapped to their process (a client may be
    used from any of its threads); a partial write keeps only the bytes the kernel took."""
    pending: dict[int, str] = {}
    process: dict[int, int] = {}
    live: dict[tuple[int, int], int] = {}
    conns: list[tuple[int, bytearray]] = []
    for raw in trace.read_text(errors="replace").splitlines():
        m = _LINE.match(raw)
        if not m:
            continue
        tid, rest = int(m.group(1)), m.group(2)
        if rest.endswith("<unfinished ...>"):
            pending[tid] = rest[:-len("<unfinished ...>")]
            continue
        resumed = re.match(r"<\.\.\. (\w+) resumed>(.*)$", rest)
        if resumed:
            rest = pending.pop(tid, resumed.group(1) + "(") + resumed.group(2)
        pid = process.setdefault(tid, tid)
        call = rest.split("(", 1)[0]
        ret = _RET.search(rest)
        if call in ("clone", "clone3") and ret and int(ret.group(1)) > 0:
            child = int(ret.group(1))
            process[child] = pid if "CLONE_THREAD" in rest else child
            continue
        if "(" not in rest:
            continue
        fd_text = rest.split("(", 1)[1].split(",")[0].split(")")[0]
        if not fd_text.isdigit():
            continue
        fd = int(fd_text)
        if call == "connect" and f"htons({port})" in rest:
            live[(pid, fd)] = len(conns)
            conns.append((pid, bytearray()))
        elif call == "close":
            live.pop((pid, fd), None)
        elif call in ("write", "sendto", "sendmsg", "writev") and (pid, fd) in live:
            if not ret or int(ret.group(1)) <= 0:
                continue
            data = b"".join(_unhex(s) for s in _STRING.findall(rest.rsplit(") =", 1)[0]))
            conns[live[(pid, fd)]][1].extend(data[:int(ret.group(1))])
    return [(pid, bytes(data)) for pid, data in conns]


def _op_json(op: Op) -> list[object]:
    return [op.name, list(op.keys), list(op.sizes), op.number]


def _strace(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> None:
    proc = subprocess.run(["strace", "-f", "-qq", "-xx", "-s", "1000000", "-e", f"trace={TRACED}",
                           "-o", str(log), *cmd], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"recorded run failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}"
                 f"\n{proc.stderr[-4000:]}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(mode: str, tmp: Path, *, src: Path = REPO / "src", timeout: float = 600) -> list[dict[str, object]]:
    """The connections (with at least one request) of one recorded launch of scaletrain from ``src``."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    env.update(PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    if mode == "env-lazy":
        env["TORCH_GLOO_LAZY_INIT"] = "1"
    ckpt = tmp / f"ckpt-{mode}"
    py = sys.executable
    if mode.startswith("env"):
        script = (f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} WORLD_SIZE=4 LOCAL_WORLD_SIZE=2\n"
                  f"for r in 0 1 2 3; do RANK=$r LOCAL_RANK=$((r % 2)) {py} {WORKER} {ckpt} & done\nwait\n")
    else:
        script = (f"for n in 0 1; do {py} -m scaletrain run --nnodes 2 --node-rank $n --master-addr 127.0.0.1 "
                  f"--master-port {port} --nproc-per-node 2 {WORKER} {ckpt} & done\nwait\n")
    log = tmp / f"{mode}.strace"
    _strace(["bash", "-c", script], env, log, timeout)
    out = []
    for pid, data in streams(log, port):
        ops = parse_requests(data)
        if ops:
            out.append({"pid": pid, "ops": [_op_json(op) for op in ops]})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--modes", default="env,run,env-lazy")
    parser.add_argument("--old-src", type=Path,
                        help="also record 'env' with scaletrain from this src folder (e.g. a worktree of "
                             "39e04f3), as mode env-old")
    args = parser.parse_args()
    import torch

    result: dict[str, object] = {"torch": torch.__version__, "modes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(mode, mode, REPO / "src") for mode in args.modes.split(",")]
        if args.old_src:
            runs.append(("env-old", "env", args.old_src.resolve()))
        for name, mode, src in runs:
            result["modes"][name] = record(mode, Path(tmp), src=src)  # type: ignore[index]
            print(f"{name}: {len(result['modes'][name])} connections")  # type: ignore[index]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
