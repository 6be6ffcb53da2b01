"""Checkpoints of N ranks: the folder, its marker and everything that reads it, at N rank files.

    PYTHONPATH=src python3 benchmarks/scale_checkpoint.py [--n 64,256,1024] [--items 64] [--save]

A step folder in the real layout (``replicated.pt``, ``rank-NNNNN.pt`` per rank, DCP's
``sharded/__N_0.distcp`` per rank and ``sharded/.metadata``), the rank files of their real size
(17 KB) and the shards sparse (64 MiB holes: the data write is not what is measured, and a
checkpoint of real size is what ``choose`` sees), committed by rank 0's real commit
(``SaveJob._commit`` with N ranks' reports, as ``Comm.gather`` hands them over), twice (steps
100 and 200). Then, each timed: the marker's size; ``layout.choose`` as ``status`` calls it
(above its byte bound, as any checkpoint of thousands of ranks is: every listed file stat'ed, no
checksum read); ``status`` and ``report`` of a run folder holding it;
the resume's verification (rank 0's walk, one rank's share of the checksums, the marker every
rank receives); retention (keep=1 deletes one folder of 2N files).

DCP's metadata step (``--items``: write items per rank, e.g. FSDP2 parameters and optimizer
states): N ranks' local plans (one shard of each tensor) go through torch's own
``DefaultSavePlanner.create_global_plan`` on the coordinator, then ``FileSystemWriter.finish``
writes ``.metadata`` from N ranks' write results. Measured: the coordinator's time, the bytes
it gathers (the pickled plans and results) and the metadata file's size.

All on this machine's local disk: on a parallel file system (Lustre, GPFS) each file's stat is
a metadata-server round trip, not simulated here (docs/scale.md gives the arithmetic).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_common import done, emit, timed  # noqa: E402

RANK_FILE_BYTES = 17249     # a rank-NNNNN.pt of scale_rec_worker.py (RNG states, no per-rank objects)
SHARD_BYTES = 64 * 2**20    # a DCP shard: a hole of this size (sparse: no disk, no write time)
_ZERO_CRC: dict[int, tuple[str, str]] = {}


def _checksums(data_of: Any, size: int) -> tuple[str, str]:
    """(the whole file's checksum, its blocks') as the writer records them, of the bytes
    ``data_of(offset, length)`` gives (written through the writer's own checksum stream)."""
    import io

    from scaletrain.checkpoint import checksum

    stream = checksum.ChecksumWriter(io.BytesIO())
    piece = 4 * 2**20
    for offset in range(0, size, piece):
        stream.write(data_of(offset, min(piece, size - offset)))
        stream.raw.seek(0)
        stream.raw.truncate()        # the bytes are on disk already: keep none here
    stream.flush()
    return checksum.hex_crc(stream.crc), stream.block_hex()


def _write(path: Path, rank: int, size: int, *, sparse: bool = False) -> tuple[int, tuple[str, str]]:
    """A file of ``size`` bytes and its checksums as the writer records them; ``sparse``: a hole
    (its checksums, of zeros, computed once)."""
    if sparse:
        with open(path, "wb") as fh:
            fh.truncate(size)
        if size not in _ZERO_CRC:
            _ZERO_CRC[size] = _checksums(lambda _o, n: bytes(n), size)
        return size, _ZERO_CRC[size]
    data = (f"{rank:08d}".encode() * (size // 8 + 1))[:size]
    path.write_bytes(data)
    return size, _checksums(lambda o, n: data[o:o + n], size)


def commit(directory: Path, n: int, step: int) -> float:
    """Write a step folder of ``n`` ranks' tiny files and commit it as rank 0 does; seconds of
    the commit (the files' writing excluded)."""
    from scaletrain.checkpoint import stepfolder
    from scaletrain.checkpoint.writer import REPLICATED, SaveJob, rank_file

    folder = stepfolder.PartialFolder(directory, step)
    folder.create()
    (folder.path / "sharded").mkdir()
    reports = []
    for r in range(n):
        files: dict[str, int] = {}
        crcs: dict[str, tuple[str, str]] = {}
        names = [(rank_file(r), RANK_FILE_BYTES, False), (f"sharded/__{r}_0.distcp", SHARD_BYTES, True)]
        if r == 0:
            names += [(REPLICATED, 2277, False), ("sharded/.metadata", 4096, False)]
        for name, size, sparse in names:
            files[name], crcs[name] = _write(folder.path / name, r, size, sparse=sparse)
        # DCP reports its files through the checked file system (crcs only); the commit stats them
        reports.append((None, {k: v for k, v in files.items() if not k.startswith("sharded/")}, crcs))
    job = SaveJob(directory, step, [], SimpleNamespace(rank=0, world_size=n), keep=1, stager=None)
    job.folder, job.path = folder, folder.path
    t0 = time.perf_counter()
    outcome = job._commit(reports)
    took = time.perf_counter() - t0
    if outcome != "ok":
        raise RuntimeError(f"commit failed: {outcome}")
    return took


def measure(n: int, *, repeat: int = 3) -> dict[str, Any]:
    """Every checkpoint reader and writer step at ``n`` ranks (see the module docstring)."""
    from scaletrain.checkpoint import layout, reader, stepfolder, verified
    from scaletrain.checkpoint.marker import MARKER
    from scaletrain.jobs import report, status

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        ckpt = run / "checkpoints"
        ckpt.mkdir(parents=True)
        (run / "job_id").write_text("4242\n")
        commit(ckpt, n, 100)
        commit_s = commit(ckpt, n, 200)
        folder = ckpt / layout.step_dirname(200)
        marker_bytes = (folder / MARKER).stat().st_size
        choose_sizes, choice = timed(lambda: layout.choose(ckpt), repeat=repeat)
        assert choice.step == 200, choice
        env = {"PATH": "/nonexistent"}   # no Slurm here: status says so in a note, one lookup each
        status_s, rows = timed(lambda: status.collect([run], env=env), repeat=repeat)
        assert rows[0].checkpoint == 200, rows[0]
        report_s, rep = timed(lambda: report.build(run, use_sacct=False), repeat=repeat)
        assert rep.resume_step == 200
        # the resume: rank 0 walks and stats, every rank gets the marker and checks its share
        walk_s, offer = timed(lambda: reader._offer(layout.choose(ckpt, verify_bytes=0), False), repeat=repeat)
        broadcast_bytes = len(pickle.dumps(offer))
        # rank 1's share of the check: the blocks of its own files a load left unread (here all)
        share_s, problem = timed(lambda: verified.Tracker(folder, offer[3]).finish(
            reader._share(offer[3]["files"], 1, n)), repeat=repeat)
        assert problem is None, problem
        t0 = time.perf_counter()
        deleted = stepfolder.apply_retention(ckpt, 1, {200})
        retention_s = time.perf_counter() - t0
        assert deleted == [100], deleted
    return {"n": n, "files": 2 * n + 2, "commit_s": commit_s, "marker_bytes": marker_bytes,
            "choose_sizes_s": choose_sizes, "status_s": status_s,
            "report_s": report_s, "resume_walk_s": walk_s, "resume_share_s": share_s,
            "resume_broadcast_bytes": broadcast_bytes, "retention_s": retention_s}


def dcp_metadata(n: int, items: int) -> dict[str, Any]:
    """The coordinator's part of a DCP save at ``n`` ranks of ``items`` write items each."""
    import torch
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType
    from torch.distributed.checkpoint.storage import WriteResult

    rows, cols = 4, 1024
    props = TensorProperties(dtype=torch.bfloat16)

    def local_plan(r: int) -> SavePlan:
        out = []
        for t in range(items):
            offsets = torch.Size([r * rows, 0])
            out.append(WriteItem(index=MetadataIndex(f"model.layers.{t // 9}.w{t % 9}", offsets),
                                 type=WriteItemType.SHARD,
                                 tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=offsets,
                                                                                        sizes=torch.Size([rows, cols])),
                                                             properties=props, size=torch.Size([n * rows, cols]))))
        return SavePlan(out, planner_data={})

    plans = [local_plan(r) for r in range(n)]
    gathered = sum(len(pickle.dumps(p)) for p in plans)     # what gather_object brings rank 0
    planner = DefaultSavePlanner()
    planner.set_up_planner({}, None, True) if _takes_three(planner.set_up_planner) else None
    t0 = time.perf_counter()
    global_plan, metadata = planner.create_global_plan(plans)
    plan_s = time.perf_counter() - t0
    scattered = sum(len(pickle.dumps(p)) for p in global_plan)
    results = [[WriteResult(index=i.index, size_in_bytes=rows * cols * 2,
                            storage_data=_StorageInfo(f"__{r}_0.distcp", k * rows * cols * 2, rows * cols * 2))
                for k, i in enumerate(plan.items)] for r, plan in enumerate(global_plan)]
    results_bytes = sum(len(pickle.dumps(res)) for res in results)
    with tempfile.TemporaryDirectory() as tmp:
        writer = FileSystemWriter(tmp, sync_files=False)
        if hasattr(writer, "set_up_storage_writer"):
            try:
                writer.set_up_storage_writer(True)
            except TypeError:
                writer.set_up_storage_writer(True, 0)
        t0 = time.perf_counter()
        writer.finish(metadata, results)
        finish_s = time.perf_counter() - t0
        meta_bytes = os.path.getsize(os.path.join(tmp, ".metadata"))
    return {"n": n, "items_per_rank": items, "plan_s": plan_s, "finish_s": finish_s,
            "gathered_bytes": gathered + results_bytes, "scattered_bytes": scattered, "metadata_bytes": meta_bytes}


def _takes_three(fn: Any) -> bool:
    import inspect

    return len(inspect.signature(fn).parameters) >= 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="64,256,1024")
    parser.add_argument("--items", type=int, default=64, help="DCP write items per rank")
    parser.add_argument("--save", action="store_true", help="add the rows to docs/img/scale.json (scale_report.py)")
    args = parser.parse_args()
    rows = []
    for n in [int(x) for x in args.n.split(",")]:
        row = {"step": "checkpoint", "series": "now", **measure(n)}
        emit(rows, row)
        row = {"step": "dcp_metadata", "series": f"{args.items} items per rank", **dcp_metadata(n, args.items)}
        emit(rows, row)
    return done(rows, args.save)


if __name__ == "__main__":
    sys.exit(main())
