"""The scaling model against measurements: this machine (2 and 4 CPU processes) and JSC's table.

    python benchmarks/scaling_model.py [--repeats 2] [--steps 30] [--skip-local]

Local: ``bench scaling`` of the CNN at 1, 2 and 4 processes (gloo on loopback, one thread
each); the model predicts the 2- and 4-process step times from the 1-process step, the CPU
core count and the all-reduce bus bandwidth the 2-process run measured at the gradient size.
Each repeat is a fresh set of runs; the table shows every repeat.

JSC: the ResNet-50 wall times of the JSC course "Parallelize Training" (1 GPU 342 min ... 128
GPUs 4 min 48 s, 10 ImageNet epochs, batch 256 per GPU) beside the model fed the 1-GPU step
(342.2 min / 50045 steps) and the juwels-booster profile's bandwidths (uncalibrated overhead).
Every published table, before and after the overhead term: benchmarks/published_scaling.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from scaletrain.clusters.profile import load_profile  # noqa: E402
from scaletrain.observe.scaling import StepProfile, links_from_profile, predict, time_to_solution  # noqa: E402

# (GPUs, wall minutes) from the JSC course slides, declared with the other published tables
from published_tables import JSC_MINUTES as JSC_TABLE  # noqa: E402
IMAGENET_STEPS_1GPU = 1_281_167 * 10 // 256     # 10 epochs, batch 256, drop_last
RESNET50_GRAD_BYTES = 25_557_032 * 4            # torchvision resnet50 parameters, fp32 gradients


def jsc_case() -> None:
    minutes_1 = JSC_TABLE[0][1]
    step = StepProfile(compute_s=minutes_1 * 60 / IMAGENET_STEPS_1GPU, grad_bytes=RESNET50_GRAD_BYTES,
                       samples_per_step=256)
    links = links_from_profile(load_profile("juwels-booster"))
    samples = IMAGENET_STEPS_1GPU * 256
    # One constant explains most of the rest: a per-job cost c (start-up, data set indexing,
    # NCCL set-up, ...) that is inside the 1-GPU figure too and does not shrink with N. Fit as
    # measured(N) = c + model(N) x (T1 - c) / T1 by least squares over the multi-GPU rows.
    rows = []
    for n, m in JSC_TABLE:
        rows.append((n, m, time_to_solution(predict(step, links, n), step, samples=samples) / 60))
    a = [(1 - p / minutes_1, m - p) for n, m, p in rows[1:]]
    c = sum(x * y for x, y in a) / sum(x * x for x, _ in a)
    print("| GPUs | nodes | measured | model | error | measured efficiency | model efficiency "
          f"| model with {c:.1f} min per job | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, m, p in rows:
        pred = predict(step, links, n)
        fixed = c + p * (minutes_1 - c) / minutes_1
        print(f"| {n} | {pred.nodes} | {m:.1f} min | {p:.1f} min | {(p - m) / m * 100:+.0f}% "
              f"| {minutes_1 / (n * m) * 100:.0f}% | {pred.efficiency * 100:.0f}% "
              f"| {fixed:.1f} min | {(fixed - m) / m * 100:+.0f}% |")
    p128 = predict(step, links, 128)
    print(f"\nmodel at 128 GPUs: step {p128.step_s * 1000:.1f} ms, all-reduce {p128.comm_s * 1000:.2f} ms "
          f"({p128.exposed_comm_s * 1000:.2f} ms not hidden), limit: {p128.limit}")


def local_case(repeats: int, steps: int) -> None:
    from scaletrain.bench.scaling import ScalingRequest, run_scaling

    print("| repeat | procs | measured ms/step | model ms/step | error | measured eff. | model eff. | limit |")
    print("|---|---|---|---|---|---|---|---|")
    for r in range(repeats):
        doc = run_scaling(ScalingRequest(workload="cnn", nproc=(1, 2, 4), steps=steps, warmup=5, batch=16),
                          log=lambda s: print(s, file=sys.stderr))
        for row in doc["rows"]:
            print(f"| {r + 1} | {row['nproc']} | {row['step_s'] * 1000:.1f} | {row['predicted_step_s'] * 1000:.1f} "
                  f"| {row['prediction_error'] * 100:+.0f}% | {row['efficiency'] * 100:.0f}% "
                  f"| {row['predicted_efficiency'] * 100:.0f}% | {row['predicted_limit']} |")
        print(f"\nrepeat {r + 1}: {doc['model']['source']}\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip-local", action="store_true")
    args = p.parse_args()
    jsc_case()
    if not args.skip_local:
        print()
        local_case(args.repeats, args.steps)


if __name__ == "__main__":
    main()
