"""``scaletrain lint``'s time against a script's length: 1,000 to 100,000 lines, and the fitted exponent.

    PYTHONPATH=src python3 benchmarks/lint_scaling.py [--max-lines N] [--rounds R] [--old SRC --old-max N]

Three script shapes, each grown line by line:

- ``srun-lines``: a JSC ``booster`` script (the partition of two profiles, so lint checks it
  against both and keeps the findings they agree on) with one ``srun`` line per line, each giving
  a finding (``$SLURM_NODEID`` expanded by the batch shell);
- ``bash-c-body``: one ``srun bash -c "..."`` whose double-quoted body has a command per line
  (a single word of the whole script's length);
- ``quoted-body``: the same body in single quotes, a ``$VAR`` on each line.

Each measurement runs in a fresh process and counts CPU seconds, the process's and its children's
(``bash -n``): the lint of text already read, imports not counted, the two profiles of
``srun-lines`` loaded inside (a few milliseconds). Sizes, shapes and, with ``--old``, the two
source trees are timed interleaved, in a shuffled order per round; the table gives the median of
the rounds, the time per line relative to the 1,000-line script of the same shape, and the
exponent ``k`` of ``time ~ lines^k`` fitted by least squares on the logarithms (1 is linear, 2
quadratic). ``--old SRC`` times a second source tree (an older commit's ``src``) up to
``--old-max`` lines. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
SIZES = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)
HEAD = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n" \
       "#SBATCH --partition={partition}\n#SBATCH --account=p\n#SBATCH --time=01:00:00\n"


def script(shape: str, lines: int) -> tuple[str, str]:
    """The text of a ``shape`` script of about ``lines`` lines, and its partition."""
    if shape == "srun-lines":
        body = "".join(f"srun python train.py --node $SLURM_NODEID --part {i}\n" for i in range(lines))
        return HEAD.format(partition="booster") + body, "booster"
    if shape == "bash-c-body":
        inner = "".join(f"python train.py --rank $SLURM_PROCID --part {i}\n" for i in range(lines))
        return HEAD.format(partition="gpumedium") + f'srun bash -c "\n{inner}"\n', "gpumedium"
    if shape == "quoted-body":
        inner = "".join(f"python train.py --rank $SLURM_PROCID --part {i}\n" for i in range(lines))
        return HEAD.format(partition="gpumedium") + f"srun bash -c '\n{inner}'\n", "gpumedium"
    raise SystemExit(f"unknown shape {shape}")


def one(shape: str, lines: int) -> float:
    """CPU seconds to lint one ``shape`` script of text already in memory, in this process: against
    the two profiles its partition matches (``lint_agreed``, as ``lint_file`` does) or Mahti's."""
    from scaletrain.clusters.profile import load_profile
    from scaletrain.lint import engine
    from scaletrain.lint.script import parse_script

    text, _ = script(shape, lines)
    names, how = engine.matching_profiles(parse_script(text))
    profile = load_profile("mahti")
    start = os.times()
    if len(names) > 1:
        result = engine.lint_agreed(text, path="bench.sh", names=names, cluster_source=how)
    else:
        result = engine.lint_text(text, path="bench.sh", profile=profile)
    end = os.times()
    assert result.findings is not None
    # CPU seconds, this process's and its children's (the bash -n of the bash-syntax rule): on a
    # shared machine the wall clock measures the other tenants as much as lint
    return sum(getattr(end, f) - getattr(start, f) for f in ("user", "system", "children_user", "children_system"))


def _measure(src: Path, shape: str, lines: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, __file__, "--one", shape, str(lines)], env=env,
                          capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def exponent(points: list[tuple[int, float]]) -> float:
    """The least-squares slope of log(time) on log(lines)."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-lines", type=int, default=SIZES[-1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", default="srun-lines,bash-c-body,quoted-body")
    parser.add_argument("--src", type=Path, default=SRC, help="the source tree to time (default: this one)")
    parser.add_argument("--old", type=Path, help="a second source tree to time (an older commit's src)")
    parser.add_argument("--old-max", type=int, default=5_000)
    parser.add_argument("--one", nargs=2, metavar=("SHAPE", "LINES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.one[0], int(args.one[1])))
        return
    trees = {"this tree": args.src}
    if args.old:
        trees["old tree"] = args.old
    shapes = args.shapes.split(",")
    work = [(tree, shape, n) for tree in trees for shape in shapes for n in SIZES
            if n <= (args.max_lines if tree == "this tree" else min(args.old_max, args.max_lines))]
    times: dict[tuple[str, str, int], list[float]] = {key: [] for key in work}
    rnd = random.Random(0)
    for r in range(args.rounds):
        rnd.shuffle(work)                      # interleaved: every size and tree in each round, order varied
        for key in work:
            times[key].append(_measure(trees[key[0]], key[1], key[2]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for tree in trees:
        for shape in shapes:
            points = sorted((n, statistics.median(t)) for (tr, sh, n), t in times.items() if tr == tree and sh == shape)
            if not points:
                continue
            base = points[0][1] / points[0][0]
            fitted = f"{exponent(points):.2f}" if len(points) > 1 else "n/a (one size)"
            print(f"\n{tree}, {shape}: exponent {fitted} (time ~ lines^k)")
            print("| lines | median CPU s | spread s | us per line | per line vs 1,000 lines |")
            print("|---|---|---|---|---|")
            for n, t in points:
                spread = max(times[(tree, shape, n)]) - min(times[(tree, shape, n)])
                print(f"| {n:,} | {t:.3f} | {spread:.3f} | {t / n * 1e6:.1f} | {t / n / base:.2f}x |")


if __name__ == "__main__":
    main()
