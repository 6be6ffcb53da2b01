"""The ``titan`` row of benchmarks/llama.py: torchtitan's own trainer on the benchmark's model shape.

torchtitan is not a dependency. To have the row on a GPU machine without internet, carry its
wheel beside the tree and install it there (it needs the torch build it was made for)::

    pip download torchtitan==0.3.0 --no-deps -d wheels/      # where there is internet
    pip install --no-deps wheels/torchtitan-0.3.0-*.whl      # on the GPU machine

torchtitan also needs a tokenizer: ``TORCHTITAN_ASSETS`` names a folder with one
(``hf_assets_path``, e.g. what ``scripts/download_hf_assets.py --assets tokenizer`` of the
torchtitan repository fetched for Llama-3.1-8B), and ``TORCHTITAN_DATASET`` a dataset it knows
(default ``c4_test``, the small set of its repository's tests/assets; the tokens it reads do not
change the speed). Without the wheel, a GPU or a tokenizer the row says which is missing.

How it runs (torchtitan's TOML job config and ``python -m torchtitan.train``, the form of
``run_train.sh``): a job config with ``[model] name = "llama3"``, ``[training] local_batch_size,
seq_len, steps``, ``[compile] enable``, ``[activation_checkpoint] mode = "full"`` (or ``none``),
FSDP over the ranks (``data_parallel_shard_degree = -1``), bf16 parameters and fp32 reduction
(its defaults). The model shape is registered as a flavor named ``scaletrain_bench`` in
torchtitan's llama3 flavor table before its trainer starts, so the layers, heads and widths are
those of benchmarks/llama_model.py (the vocabulary is its tokenizer's: 128256 for Llama 3's, the
benchmark's). Its log lines (``tps: ...  mfu: ...%  memory: ...GiB``) give
the tokens/s: the median over the steps after ``warmup``, per GPU (torchtitan's tps is per rank).

Like with like: before its trainer starts, the worker builds torchtitan's model of that flavor on
the meta device (no memory) and compares its parameter count and the shapes of its parameters
with the benchmark's own model (:func:`expected`). A torchtitan that lacks a field (a rename), or
sizes a layer by another rule, would time a different model: the row is then refused with the
difference, never reported.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FLAVOR = "scaletrain_bench"
_TPS = re.compile(r"tps:\s*([\d,\.]+)")
_MEM = re.compile(r"memory:\s*([\d\.]+)\s*GiB")


def available() -> str | None:
    """None when torchtitan can run here, else why not (the row's text)."""
    import importlib.util

    import torch

    if importlib.util.find_spec("torchtitan") is None:
        return "torchtitan not installed (carry its wheel: docs/benchmarks.md)"
    if not torch.cuda.is_available():
        return "torchtitan needs a GPU"
    if not os.environ.get("TORCHTITAN_ASSETS"):
        return "TORCHTITAN_ASSETS (a tokenizer folder) not set"
    return None


def job_config(cfg: Any, seq: int, batch: int, *, compiled: bool, ac: bool, steps: int,
               dump: Path) -> str:
    """The TOML job config of one run (torchtitan's sections and names)."""
    dataset = os.environ.get("TORCHTITAN_DATASET", "c4_test")
    return "\n".join([
        "[job]", f'dump_folder = "{dump}"', "",
        "[metrics]", "log_freq = 1", "enable_tensorboard = false", "",
        "[model]", 'name = "llama3"', f'flavor = "{FLAVOR}"',
        f'hf_assets_path = "{os.environ.get("TORCHTITAN_ASSETS", "")}"', "",
        "[optimizer]", 'name = "AdamW"', "lr = 1e-4", "",
        "[lr_scheduler]", "warmup_steps = 1", "",
        "[training]", f"local_batch_size = {batch}", f"seq_len = {seq}", f"steps = {steps}",
        f'dataset = "{dataset}"', "",
        "[parallelism]", "data_parallel_shard_degree = -1", "",
        "[checkpoint]", "enable = false", "",
        "[compile]", f"enable = {'true' if compiled else 'false'}", 'components = ["model", "loss"]', "",
        "[activation_checkpoint]", f'mode = "{"full" if ac else "none"}"', "",
    ]) + "\n"


def model_args(cfg: Any) -> dict[str, Any]:
    """torchtitan's TransformerModelArgs for ``cfg``: its feed-forward width is
    ``multiple_of``-rounded ``ffn_dim_multiplier * 2/3 * 4 * dim`` (8192 at dim 2048 with 1.5, 256)."""
    return {"dim": cfg.dim, "n_layers": cfg.layers, "n_heads": cfg.heads,
            "n_kv_heads": cfg.kv_heads, "vocab_size": cfg.vocab, "rope_theta": cfg.rope_theta,
            "ffn_dim_multiplier": cfg.ffn / (2 * 4 * cfg.dim // 3), "multiple_of": 256,
            "norm_eps": cfg.norm_eps}


def expected(cfg: Any, seq: int) -> dict[str, Any]:
    """The benchmark's model (benchmarks/llama_model.py) as the worker compares it: its parameter
    count and the sorted shapes of its parameters, built on the meta device."""
    import llama_model

    model = llama_model.build(cfg, seq, device="meta")
    return _signature(model)


def _signature(model: Any) -> dict[str, Any]:
    shapes = sorted(tuple(p.shape) for p in model.parameters())
    return {"params": sum(p.numel() for p in model.parameters()), "shapes": shapes}


def difference(theirs: dict[str, Any], ours: dict[str, Any]) -> str | None:
    """Why torchtitan's model is not the benchmark's (parameter count, shapes), or None."""
    from collections import Counter

    if theirs == ours:
        return None
    only_theirs = Counter(map(tuple, theirs["shapes"])) - Counter(map(tuple, ours["shapes"]))
    only_ours = Counter(map(tuple, ours["shapes"])) - Counter(map(tuple, theirs["shapes"]))

    def listed(shapes: Counter[tuple[int, ...]]) -> str:
        return ", ".join(f"{list(s)} x{n}" for s, n in sorted(shapes.items())[:4]) or "none"

    return (f"torchtitan's model has {theirs['params']:,} parameters, the benchmark's {ours['params']:,}; "
            f"shapes only in torchtitan's: {listed(only_theirs)}; only in the benchmark's: {listed(only_ours)}")


def parse_log(text: str, *, warmup: int) -> dict[str, Any]:
    """tokens/s (median after ``warmup`` logged steps) and peak GiB from torchtitan's log."""
    tps = [float(m.replace(",", "")) for m in _TPS.findall(text)]
    mem = [float(m) for m in _MEM.findall(text)]
    if len(tps) <= warmup:
        return {}
    return {"tokens_s_per_rank": statistics.median(tps[warmup:]), "peak_gib": max(mem) if mem else None}


def run(cfg: Any, seq: int, batch: int, *, compiled: bool, ac: bool, steps: int, warmup: int,
        device: str, world: int = 1, timeout_s: float = 900.0) -> dict[str, Any]:
    """One torchtitan trial; the same keys as llama.trial, or ``skipped``/``error``."""
    why = available() if device.startswith("cuda") else "torchtitan needs a GPU"
    if why:
        return {"skipped": why}
    tmp = Path(tempfile.mkdtemp(prefix="titan-"))
    try:
        conf = tmp / "job.toml"
        conf.write_text(job_config(cfg, seq, batch, compiled=compiled, ac=ac,
                                   steps=steps + warmup, dump=tmp / "dump"))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={world}", str(Path(__file__).resolve()), "--worker",
               repr(model_args(cfg)), "--expect", repr(expected(cfg, seq)), "--job.config_file", str(conf)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        got = parse_log(proc.stdout + proc.stderr, warmup=warmup)
        if proc.returncode != 0 or not got:
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            return {"error": f"torchtitan: {(lines[-1] if lines else 'no output')[:160]}"}
        return {"tokens_s": got["tokens_s_per_rank"] * world, "peak_gib": got["peak_gib"],
                "batch": batch}
    except subprocess.TimeoutExpired:
        return {"error": f"torchtitan: no result within {timeout_s:.0f} s"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _worker(argv: list[str]) -> None:
    """Inside torchrun: add the flavor to torchtitan's llama3 table, then run its trainer."""
    import ast
    import runpy

    import torchtitan.models.llama3 as llama3

    fields = ast.literal_eval(argv[0])
    args_cls = getattr(llama3, "TransformerModelArgs")
    tables = [v for v in vars(llama3).values() if isinstance(v, dict) and v
              and all(isinstance(x, args_cls) for x in v.values())]
    if not tables:
        raise SystemExit("torchtitan: no llama3 flavor table found to add the benchmark's shape to")
    import dataclasses

    # a field this torchtitan does not have (a rename) is left to its default: the comparison of the
    # two models below refuses the run where that changes the model
    known = {f.name for f in dataclasses.fields(args_cls)} if dataclasses.is_dataclass(args_cls) \
        else set(fields)
    for table in tables:
        table[FLAVOR] = args_cls(**{k: v for k, v in fields.items() if k in known})
    if argv[1:2] == ["--expect"]:
        _check_same_model(llama3, tables[0][FLAVOR], ast.literal_eval(argv[2]))
        argv = [argv[0], *argv[3:]]
    else:   # run() always passes --expect; by hand, say what was not checked
        print("torchtitan: the model was not compared with the benchmark's (no --expect)", file=sys.stderr)
    sys.argv = ["torchtitan.train", *argv[1:]]
    runpy.run_module("torchtitan.train", run_name="__main__")


def _check_same_model(llama3: Any, args: Any, ours: dict[str, Any]) -> None:
    """SystemExit with the difference unless torchtitan's model of ``args`` is the benchmark's."""
    import torch

    model_cls = getattr(llama3, "Transformer", None)
    if model_cls is None:
        raise SystemExit("torchtitan: no llama3 Transformer to compare with the benchmark's model: refused")
    with torch.device("meta"):
        theirs = _signature(model_cls(args))
    why = difference(theirs, ours)
    if why:
        raise SystemExit(f"torchtitan: not the benchmark's model, refused: {why}")


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(sys.argv[2:])
