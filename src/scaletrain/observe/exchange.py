"""The Monitor's exchanges between ranks, sized for tens of thousands of them.

Every ``every`` steps each rank has one small record (its window: step time, waits, its node's
device figures, as :class:`scaletrain.observe.health.RankWindow` holds them) and rank 0 turns
the records into findings. Only rank 0 needs the records; every rank needs one aggregate, the
slowest window's step time, from which all derive the same step for the next exchange. So an
exchange is one ``all_reduce(MAX)`` of two numbers (that step time and the longest record's
length) and one ``gather`` of the records, each padded to that length, to rank 0: a rank other
than 0 sends a few hundred bytes and receives 16, whatever the world size, and rank 0 receives
N records. An ``all_gather_object`` of the records (what the Monitor did before) put all N
records on every rank - N^2 records over the job, unpickled N times each - and rank 0's
straggler search over them was itself quadratic (docs/scale.md has the curves).

Records travel as JSON (what the Monitor writes anyway), never as pickles. Every function here
is a collective: every rank of ``group`` calls it, in the same order. ``comm`` is what it calls:
:func:`comm_for` of the live ``torch.distributed`` (scaletrain's own collectives, each done when it
returns: :mod:`scaletrain.runtime.collectives`), or a stand-in with the same calls.
"""

from __future__ import annotations

from typing import Any

from scaletrain.fileio import json_text
from scaletrain.jsonfile import loads
from scaletrain.runtime.current import collective_device

_PAD = b" "   # JSON allows trailing whitespace: a padded record parses as it is


def comm_for(dist: Any) -> Any:
    """The collectives an exchange calls over ``dist``: scaletrain's (their tensors let go of by
    torch's threads when they return) where ``dist`` is torch.distributed; else ``dist`` itself."""
    import torch.distributed

    if dist is torch.distributed:
        from scaletrain.runtime import collectives

        return collectives
    return dist


def reduce(values: list[float], op: str, *, comm: Any, group: Any = None) -> list[float]:
    """``values`` reduced element-wise over the ranks of ``group`` (``op``: "max" or "sum")."""
    import torch

    tensor = torch.tensor(values, dtype=torch.float64, device=collective_device(group))
    comm.all_reduce(tensor, op=comm.ReduceOp.MAX if op == "max" else comm.ReduceOp.SUM, group=group)
    return [float(v) for v in tensor.tolist()]


def _encode(record: Any) -> bytes:
    # json_text: a NaN or inf in a window travels as null (valid JSON), not as NaN
    return json_text(record, separators=(",", ":"), default=str).encode("utf-8")


def gather_records(record: Any, step_s: float, *, rank: int, world: int, comm: Any,
                   group: Any = None) -> tuple[float, list[Any] | None]:
    """(the largest ``step_s`` of all ranks, every rank's ``record`` by rank on rank 0 / None
    elsewhere). ``record``: anything JSON can carry."""
    import torch

    data = _encode(record)
    slowest, longest = reduce([float(step_s), float(len(data))], "max", comm=comm, group=group)
    size = int(longest)
    device = collective_device(group)
    mine = torch.frombuffer(bytearray(data.ljust(size, _PAD)), dtype=torch.uint8).to(device)
    # rank 0: one buffer, a row per rank (N tensors of their own cost more than the records)
    rows = torch.empty((world, size), dtype=torch.uint8, device=device) if rank == 0 else None
    comm.gather(mine, gather_list=list(rows.unbind(0)) if rows is not None else None, dst=0, group=group)
    if rows is None:
        return slowest, None
    # one copy and one parse for all N records (a parse per record costs more than the record)
    buf = rows.cpu().numpy().tobytes()
    text = b"[" + b",".join(buf[i:i + size] for i in range(0, len(buf), size)) + b"]"
    return slowest, loads(text, max_bytes=len(text))


def scatter_records(records: list[Any] | None, *, rank: int, comm: Any, group: Any = None) -> Any:
    """Rank 0's ``records[r]`` on rank r (``records``: one per rank on rank 0, None elsewhere):
    the longest length is broadcast, then each rank receives its own record alone."""
    import torch

    device = collective_device(group)
    encoded = [_encode(r) for r in records] if rank == 0 and records is not None else []
    size = torch.tensor([max(map(len, encoded), default=0)], dtype=torch.int64, device=device)
    comm.broadcast(size, src=0, group=group)
    n = int(size.item())
    parts = ([torch.frombuffer(bytearray(e.ljust(n, _PAD)), dtype=torch.uint8).to(device) for e in encoded]
             if rank == 0 else None)
    mine = torch.empty(n, dtype=torch.uint8, device=device)
    comm.scatter(mine, scatter_list=parts, src=0, group=group)
    data = bytes(mine.cpu().numpy().tobytes())
    return loads(data, max_bytes=len(data))
