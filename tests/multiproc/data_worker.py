"""Worker for tests/multiproc/test_data_multiproc.py: one launch, several loader and metric
cases. Each rank writes ``rank<R>.json`` with what it saw; rank 0 also writes
``gathered.json`` with what ``gather_objects`` returned. The test asserts on the files.

The loaders are given no Env: they must find rank and world size themselves, from
``scaletrain.init()``'s Env.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import scaletrain

N = 20  # not divisible by 3 (nor by 4 batches of 3): exercises padding, drop and uneven shards


def ids(batch) -> list[int]:
    return batch[0].tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    env = scaletrain.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = TensorDataset(torch.arange(N))
    res: dict = {"rank": rank, "world": world, "launcher": env.launcher}

    # evaluation shard: each sample exactly once, ranks may differ in batches
    ev = scaletrain.loader(ds, batch_size=3, eval=True, num_workers=0)
    res["eval"] = [i for b in ev for i in ids(b)]
    res["eval_batches"] = len(ev)
    res["loader_env"] = [ev.env.rank, ev.env.world_size, ev.env == env]
    values = [float(i * i) for i in res["eval"]]  # squares: shard means differ unevenly
    local_mean = sum(values) / len(values) if values else 0.0
    # the exact dataset mean from uneven shards, reduced once after the loop
    res["eval_weighted_mean"] = scaletrain.all_reduce_mean(local_mean, weight=len(values))
    res["eval_plain_mean"] = scaletrain.all_reduce_mean(local_mean)

    # training shards: padded (drop_last=False), two epochs; dropped, one epoch
    pad = scaletrain.loader(ds, batch_size=3, drop_last=False, num_workers=0, seed=4)
    res["pad_epochs"] = [[i for b in pad for i in ids(b)] for _ in range(2)]
    res["pad_len"] = len(pad)
    drop = scaletrain.loader(ds, batch_size=2, num_workers=0, seed=4, base_world_size=None)
    res["drop_epoch"] = [i for b in drop for i in ids(b)]

    # metrics
    res["mean_rank"] = scaletrain.all_reduce_mean(rank)
    t = torch.tensor([float(rank), 2.0 * rank], dtype=torch.float32)
    m = scaletrain.all_reduce_mean(t)
    res["mean_tensor"] = m.tolist()
    res["mean_tensor_dtype"] = str(m.dtype)
    res["input_untouched"] = t.tolist() == [float(rank), 2.0 * rank]
    res["mean_int_tensor"] = scaletrain.all_reduce_mean(torch.tensor([rank])).tolist()
    res["weighted"] = scaletrain.all_reduce_mean(float(rank), weight=rank + 1)
    # a data-parallel subgroup: ranks {0, 1} share the data, rank {2} reads all of it
    groups = [dist.new_group([0, 1]), dist.new_group([2])]
    mine = groups[0] if rank < 2 else groups[1]
    sub = scaletrain.loader(ds, batch_size=4, eval=True, num_workers=0, group=mine)
    res["group_eval"] = [i for b in sub for i in ids(b)]
    res["group_mean"] = scaletrain.all_reduce_mean(float(rank), group=mine)
    res["group_gather"] = scaletrain.gather_objects(rank, group=mine)
    gathered = scaletrain.gather_objects({"rank": rank, "pid": os.getpid(), "eval": res["eval"]})

    # resume mid-epoch on every rank, with a DataLoader worker prefetching ahead
    kw = {"batch_size": 2, "num_workers": 1, "seed": 11, "drop_last": False}
    ref_loader = scaletrain.loader(ds, **kw)
    res["resume_ref"] = [[ids(b) for b in ref_loader] for _ in range(2)]
    ref_loader.close()
    first = scaletrain.loader(ds, **kw)
    it = iter(first)
    res["resume_first"] = [ids(next(it)) for _ in range(2)]
    torch.save(first.state_dict(), out / f"state{rank}.pt")
    del it
    first.close()
    resumed = scaletrain.loader(ds, **kw)
    resumed.load_state_dict(torch.load(out / f"state{rank}.pt"))
    res["resume_state"] = resumed.state_dict()
    res["resume_rest"] = [ids(b) for b in resumed]
    res["resume_next"] = [ids(b) for b in resumed]
    resumed.close()

    (out / f"rank{rank}.json").write_text(json.dumps(res))
    if rank == 0:
        (out / "gathered.json").write_text(json.dumps(gathered))
    scaletrain.shutdown()


if __name__ == "__main__":
    main()
