"""torch's TCPStore wire protocol, read from a recorded run and spoken by simulated clients.

A client of ``torch.distributed.TCPStore`` sends each request as a query-type byte followed by
its arguments; strings are a little-endian uint64 length and the bytes, integers 8 bytes. Some
requests get no answer (SET, APPEND, MULTI_SET, VALIDATE), the others one of a fixed shape.
The layout below was read off the bytes torch 2.13's client writes (``strace -xx`` of every
call: ``benchmarks/scale_startup.py --check-wire`` repeats that check against the torch at hand)
and matches ``torch/csrc/distributed/c10d/TCPStoreBackend.hpp``'s ``QueryType``.

:func:`parse_requests` turns a client's byte stream into :class:`Op` records (what the
recording keeps); :func:`encode` writes one back; :func:`reply_size` says how many bytes of
answer to wait for, so that a simulated client can issue a recorded sequence exactly and wait
for each answer as torch's client does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, \
    MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN = range(17)
NAMES = {VALIDATE: "validate", SET: "set", COMPARE_SET: "compare_set", GET: "get", ADD: "add",
         CHECK: "check", WAIT: "wait", GETNUMKEYS: "num_keys", DELETE_KEY: "delete_key",
         APPEND: "append", MULTI_GET: "multi_get", MULTI_SET: "multi_set",
         CANCEL_WAIT: "cancel_wait", PING: "ping", QUEUE_PUSH: "queue_push",
         QUEUE_POP: "queue_pop", QUEUE_LEN: "queue_len"}
MAGIC = 0x3C85F7CE
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class Op:
    """One request: its type, its keys, the sizes of its values, and an integer argument."""

    kind: int
    keys: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()       # value bytes (SET, APPEND, COMPARE_SET: expected, desired)
    number: int = 0                   # ADD's increment, VALIDATE's magic, PING's nonce

    @property
    def name(self) -> str:
        return NAMES.get(self.kind, f"op{self.kind}")

    def request_bytes(self) -> int:
        """Bytes this request puts on the wire."""
        return len(encode(self))


class Truncated(ValueError):
    """The stream ends inside a request."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise Truncated(f"{n} bytes wanted at {self.at} of {len(self.data)}")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def string(self) -> bytes:
        return self.take(self.u64())


def _key(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def parse_requests(data: bytes) -> list[Op]:
    """Every request of one client connection's byte stream, in order."""
    r = _Reader(data)
    ops: list[Op] = []
    while r.at < len(data):
        kind = r.take(1)[0]
        if kind in (VALIDATE, PING):
            ops.append(Op(kind, number=int(_U32.unpack(r.take(4))[0])))
        elif kind in (SET, APPEND, QUEUE_PUSH):
            key = _key(r.string())
            ops.append(Op(kind, (key,), (len(r.string()),)))
        elif kind == COMPARE_SET:
            key = _key(r.string())
            ops.append(Op(kind, (key,), (len(r.string()), len(r.string()))))
        elif kind in (GET, DELETE_KEY, QUEUE_LEN):
            ops.append(Op(kind, (_key(r.string()),)))
        elif kind == QUEUE_POP:
            key = _key(r.string())
            ops.append(Op(kind, (key,), number=int(_I64.unpack(r.take(8))[0])))
        elif kind == ADD:
            key = _key(r.string())
            ops.append(Op(kind, (key,), number=int(_I64.unpack(r.take(8))[0])))
        elif kind in (CHECK, WAIT, MULTI_GET):
            n = r.u64()
            ops.append(Op(kind, tuple(_key(r.string()) for _ in range(n))))
        elif kind == MULTI_SET:
            n = r.u64()
            keys, sizes = [], []
            for _ in range(n):
                keys.append(_key(r.string()))
                sizes.append(len(r.string()))
            ops.append(Op(kind, tuple(keys), tuple(sizes)))
        elif kind in (GETNUMKEYS, CANCEL_WAIT):
            ops.append(Op(kind))
        else:
            raise ValueError(f"unknown TCPStore query type {kind} at byte {r.at - 1}")
    return ops


def _s(raw: bytes) -> bytes:
    return _U64.pack(len(raw)) + raw


def _value(size: int) -> bytes:
    return b"v" * size


def encode(op: Op) -> bytes:
    """The bytes torch's client writes for ``op`` (values filled with b'v')."""
    head = bytes([op.kind])
    keys = [k.encode("utf-8") for k in op.keys]
    if op.kind in (VALIDATE, PING):
        return head + _U32.pack(op.number)
    if op.kind in (SET, APPEND, QUEUE_PUSH):
        return head + _s(keys[0]) + _s(_value(op.sizes[0]))
    if op.kind == COMPARE_SET:
        return head + _s(keys[0]) + _s(_value(op.sizes[0])) + _s(_value(op.sizes[1]))
    if op.kind in (GET, DELETE_KEY, QUEUE_LEN):
        return head + _s(keys[0])
    if op.kind in (ADD, QUEUE_POP):
        return head + _s(keys[0]) + _I64.pack(op.number)
    if op.kind in (CHECK, WAIT, MULTI_GET):
        return head + _U64.pack(len(keys)) + b"".join(_s(k) for k in keys)
    if op.kind == MULTI_SET:
        return head + _U64.pack(len(keys)) + b"".join(_s(k) + _s(_value(n)) for k, n in zip(keys, op.sizes))
    return head


# Answers: a fixed number of bytes, or a sequence of length-prefixed strings.
FIXED_REPLY = {VALIDATE: 0, SET: 0, APPEND: 0, MULTI_SET: 0, QUEUE_PUSH: 0, PING: 4, ADD: 8,
               GETNUMKEYS: 8, DELETE_KEY: 8, QUEUE_LEN: 8, CHECK: 1, WAIT: 1, CANCEL_WAIT: 1}


def reply_strings(op: Op) -> int:
    """How many length-prefixed strings answer ``op`` (0 for a fixed-size answer)."""
    if op.kind in (GET, COMPARE_SET, QUEUE_POP):
        return 1
    if op.kind == MULTI_GET:
        return len(op.keys)
    return 0


def reply_size(op: Op) -> int:
    """Bytes of a fixed-size answer (0: none, or see :func:`reply_strings`)."""
    return FIXED_REPLY.get(op.kind, 0)
