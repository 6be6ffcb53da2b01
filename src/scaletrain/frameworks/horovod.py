"""Horovod under ``scaletrain run --emulate mpi``: its Gloo rendezvous, as ``horovodrun`` gives it.

Under ``mpirun`` (or ``srun --mpi=pmix``) Horovod takes its ranks from MPI. The emulation has no
MPI runtime: each worker's ``MPI_Init`` would be a world of one. Horovod's other controller, Gloo,
finds its peers through a key-value store over HTTP and its ``HOROVOD_*`` variables; ``horovodrun
--gloo`` starts that store and sets the variables, and so does the emulation: the launcher serves
the store on loopback (:func:`rendezvous_store`) for the run, and each worker's shim sets the
variables of its emulated place (:func:`horovod_vars`). The program runs unchanged: ``hvd.init()``
meets the other workers, ``hvd.rank()``, ``hvd.local_rank()``, ``hvd.size()`` are the emulated ones.

The store speaks what Horovod's ``HTTPStore`` (horovod/common/gloo/http_store.cc, 0.28) asks:
``PUT /SCOPE/KEY`` stores the body, ``GET /SCOPE/KEY`` answers it or 404 (the client polls), and
``DELETE /SCOPE/RANK`` (a rank's goodbye) is acknowledged. Nothing here imports horovod.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator, Mapping

from scaletrain.contract.environ import HOROVOD_RENDEZVOUS_VAR

# launcher -> workers: "HOST:PORT" of the store (set only while one is served)
RENDEZVOUS_VAR = HOROVOD_RENDEZVOUS_VAR
_HOST = "127.0.0.1"


class _Store(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((_HOST, 0), _Handler)
        self.values: dict[str, bytes] = {}
        self.lock = threading.Lock()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Store
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        with self.server.lock:
            value = self.server.values.get(self.path)
        self._reply(404) if value is None else self._reply(200, value)

    def do_PUT(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.values[self.path] = body
        self._reply(200)

    def do_DELETE(self) -> None:  # noqa: N802
        self._reply(200)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass   # one line per request would bury the program's output


@contextlib.contextmanager
def rendezvous_store(active: bool = True) -> Iterator[dict[str, str]]:
    """Serve the store for the block; yields the workers' variables (``{}`` when not ``active``)."""
    if not active:
        yield {}
        return
    store = _Store()
    thread = threading.Thread(target=store.serve_forever, name="scaletrain-horovod-store", daemon=True)
    thread.start()
    try:
        yield {RENDEZVOUS_VAR: f"{_HOST}:{store.server_address[1]}"}
    finally:
        store.shutdown()
        store.server_close()
        thread.join()


def horovod_vars(environ: Mapping[str, str], *, rank: int, world: int, local_rank: int, local_size: int,
                 node: int, nodes: int, host: str) -> dict[str, str]:
    """What ``horovodrun --gloo`` gives the worker at this place; ``{}`` without a store."""
    where = environ.get(RENDEZVOUS_VAR, "")
    addr, _, port = where.rpartition(":")
    if not addr or not port.isdigit():
        return {}
    return {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(world),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(node), "HOROVOD_CROSS_SIZE": str(nodes),
            "HOROVOD_HOSTNAME": host, "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": port, "HOROVOD_GLOO_IFACE": "lo",
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
