"""What is loaded is what was verified: the checksum covers the very bytes torch deserializes.

A rank file was checksummed on one read and ``torch.load`` read it again by name, so a file
replaced between the two reads (a second job writing the same folder, a file system serving a
stale page) loaded unverified. The stand-in here replaces the file on disk (a rename, as a second
writer would) the moment a checkpoint reader of scaletrain opens it, and holds any read of it by
name until then: whatever reads the file afterwards by name gets the forged copy. A load must
refuse it or load the bytes it checked, never the forged ones; for the replicated file and for a
DCP shard alike. Then the reader itself: reads at any offset hand out the file's bytes, a flipped
byte is found in the block that holds it, and a few bytes of a large file cost one block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scaletrain

SRC = Path(scaletrain.__file__).resolve().parents[1]   # the tree under test, for the child too

_CHILD = r'''
import json, os, pkgutil, importlib, sys, threading
from pathlib import Path
import torch, scaletrain
import scaletrain.checkpoint as package
from scaletrain import fileio
from scaletrain.checkpoint.errors import CheckpointError

mode, directory = sys.argv[1], Path(sys.argv[2])
sharded = mode == "sharded"
if sharded:
    scaletrain.init(device="cpu")
    from torch.distributed.fsdp import fully_shard

def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    if sharded:
        fully_shard(model)
    return model

def full(t):
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t

model = make()
ck = scaletrain.Checkpointer(directory, keep=3)
ck.save(20, {"model": model})
with torch.no_grad():
    model.weight.add_(1.0)
ck.save(30, {"model": model})
ck.close()
genuine = full(model.weight).clone()

# the forged copy: one float of the weight with another exponent, everything else as written
target = directory / "step-00000030" / ("sharded/__0_0.distcp" if sharded else "replicated.pt")
data = bytearray(target.read_bytes())
at = data.find(genuine.numpy().tobytes()[:64] if not sharded else
               model.weight.to_local().detach().numpy().tobytes()[:64])
assert at > 0, "the weight's bytes are not in the file"
data[at + 3] ^= 0x40
forged = directory.parent / "forged.bin"
forged.write_bytes(bytes(data))

swapped = threading.Event()
real_open = fileio.open_regular

def opened(path, *args, **kwargs):
    handle = real_open(path, *args, **kwargs)
    if Path(path) == target and not swapped.is_set():
        os.replace(forged, target)   # replaced by name; the reader's descriptor keeps its file
        swapped.set()
    return handle

for info in pkgutil.iter_modules(package.__path__):
    module = importlib.import_module(f"scaletrain.checkpoint.{info.name}")
    if hasattr(module, "open_regular"):
        module.open_regular = opened
fileio.open_regular = opened

real_load = torch.load

def load_by_name(f, *args, **kwargs):   # a read of the target by name comes after the swap
    if isinstance(f, (str, os.PathLike)) and Path(f) == target:
        swapped.wait(120)
    return real_load(f, *args, **kwargs)

torch.load = load_by_name
from torch.distributed.checkpoint.filesystem import FileSystem
real_stream = FileSystem.create_stream

def stream_by_name(self, path, mode):
    if "r" in mode and Path(path) == target:
        swapped.wait(120)
    return real_stream(self, path, mode)

FileSystem.create_stream = stream_by_name

fresh = make()
try:
    step = scaletrain.Checkpointer(directory, strict=True).load_latest({"model": fresh})
    out = {"step": step, "genuine": bool(torch.equal(full(fresh.weight), genuine)),
           "swapped": swapped.is_set()}
except CheckpointError as err:
    out = {"refused": err.message, "swapped": swapped.is_set()}
print("RESULT " + json.dumps(out))
if sharded:
    scaletrain.shutdown()
'''


@pytest.mark.parametrize("mode", ["replicated", "sharded"])
def test_a_file_replaced_between_check_and_load_is_never_loaded_unverified(tmp_path, mode):
    env = dict(os.environ, PYTHONPATH=str(SRC), CUDA_VISIBLE_DEVICES="")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, str(tmp_path / "ck")], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["swapped"], "the stand-in never saw the file opened"
    # refused, or loaded from the bytes that were checked: never the forged weight
    assert "refused" in out or (out["step"] == 30 and out["genuine"]), out


# -- the reader itself -----------------------------------------------------------------------

def _file(tmp_path: Path, size: int, block: int):
    from helpers import reference_blocks

    from scaletrain.checkpoint import checksum, verified

    data = os.urandom(size)
    (tmp_path / "f.bin").write_bytes(data)
    hexes = reference_blocks(checksum.ALGORITHM, data, block)
    expect = verified.Expected(size=size, algorithm=checksum.ALGORITHM, block=block,
                               crcs=tuple(int(hexes[i:i + 8], 16) for i in range(0, len(hexes), 8)))
    return data, expect


_READS = st.lists(st.tuples(st.integers(0, 70_000), st.integers(0, 20_000)), min_size=1, max_size=10)


@settings(max_examples=80, deadline=None)
@given(_READS)
def test_reads_in_any_order_hand_out_the_files_bytes(tmp_path_factory, reads):
    from scaletrain.checkpoint import verified

    tmp_path = tmp_path_factory.mktemp("vf")
    data, expect = _file(tmp_path, 65_537, 4096)
    with verified.VerifiedFile(tmp_path / "f.bin", expect, name="f.bin") as fh:
        for offset, length in reads:
            fh.seek(offset)
            buffer = bytearray(length)
            n = fh.readinto(buffer)
            assert bytes(buffer[:n]) == data[offset:offset + length]
    assert fh.problem is None
    assert fh.checked >= {o // 4096 for o, n in reads if n and o < len(data)}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12_500), st.integers(0, 5_000)), min_size=1, max_size=10),
       st.integers(0, 12_288), st.sets(st.integers(0, 10), max_size=2), st.sampled_from([256, 1 << 16]))
def test_bytes_changed_before_or_between_reads_are_never_handed_out_unnoticed(
        tmp_path_factory, reads, flip, when, small):
    """Whatever the order of the reads, and whenever a byte changes (before the first read, or
    between two: a second writer) and changes back (a stale page, then the right one), either
    every byte handed out is the one the marker's checksums describe, or the file's close at the
    latest raises Damaged."""
    from scaletrain.checkpoint import verified

    tmp_path = tmp_path_factory.mktemp("vf")
    data, expect = _file(tmp_path, 12_289, 4096)   # small: reads overlap, and the changed byte

    def change() -> None:   # the byte toggles: changed, then back
        with open(tmp_path / "f.bin", "r+b") as raw:
            raw.seek(flip)
            now = raw.read(1)[0]
            raw.seek(flip)
            raw.write(bytes([now ^ 0x10]))

    for _ in range(sum(1 for w in when if w >= len(reads))):
        change()
    got = []
    try:
        # pieces above `small` bytes are remembered by their checksum alone, below by their bytes
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(verified, "_SMALL_PIECE", small)
            with verified.VerifiedFile(tmp_path / "f.bin", expect, name="f.bin") as fh:
                for i, (offset, length) in enumerate(reads):
                    if i in when:
                        change()
                    fh.seek(offset)
                    got.append((offset, fh.read(length)))
    except verified.Damaged:
        return
    assert all(chunk == data[offset:offset + len(chunk)] for offset, chunk in got)


@pytest.mark.parametrize("flip", [0, 4095, 4096, 40_000, 65_536])
def test_a_flipped_byte_is_found_in_its_block_by_any_read_that_covers_it(tmp_path, flip):
    """Read whole, in order, backwards (a block kept), or not at all (the check of the rest)."""
    from scaletrain.checkpoint import verified

    data, expect = _file(tmp_path, 65_537, 4096)
    changed = bytearray(data)
    changed[flip] ^= 0x01
    (tmp_path / "f.bin").write_bytes(bytes(changed))
    for start, length in ((0, len(data)), (flip, 1), (max(0, flip - 5000), 9000), (flip, 0)):
        # at the read that ends the block, or at the latest when the file is closed: a load
        # is not done before its files are
        with pytest.raises(verified.Damaged, match=f"block {flip // 4096} "):
            with verified.VerifiedFile(tmp_path / "f.bin", expect, name="f.bin") as fh:
                fh.seek(start)
                fh.read(length)
                if length == 0:
                    fh.verify_rest()
        assert fh.problem is not None


def test_a_few_bytes_of_a_large_file_cost_one_block(tmp_path, monkeypatch):
    """A rank that needs a scalar from another rank's DCP shard reads the block that holds it,
    not the whole file (every rank reads from every shard: DCP spreads replicated entries)."""
    from scaletrain.checkpoint import verified

    data, expect = _file(tmp_path, 10 * 4096 + 17, 4096)
    read: list[int] = []
    real = os.preadv

    def counting(fd, buffers, offset):
        n = real(fd, buffers, offset)
        read.append(n)
        return n

    monkeypatch.setattr(verified.os, "preadv", counting)
    with verified.VerifiedFile(tmp_path / "f.bin", expect, name="f.bin") as fh:
        fh.seek(5 * 4096 + 100)
        assert fh.read(8) == data[5 * 4096 + 100:5 * 4096 + 108]
    assert sum(read) == 4096


def test_a_stale_page_handed_out_then_read_again_right_is_caught(tmp_path, monkeypatch):
    """A file system serves a stale page to the first read, the right one to a second read of
    the same bytes: the block then checks out, but what went out first did not."""
    from scaletrain.checkpoint import verified

    monkeypatch.setattr(verified, "_SMALL_PIECE", 256)   # a 2,000-byte read: its checksum kept
    data, expect = _file(tmp_path, 12_289, 4096)
    stale = bytearray(data)
    stale[1000] ^= 0x10
    (tmp_path / "f.bin").write_bytes(bytes(stale))
    with pytest.raises(verified.Damaged, match="changed while read"):
        with verified.VerifiedFile(tmp_path / "f.bin", expect, name="f.bin") as fh:
            assert fh.read(2000) == bytes(stale[:2000])
            (tmp_path / "f.bin").write_bytes(data)   # in place (same file): the right bytes now
            fh.seek(500)
            fh.read(1000)
