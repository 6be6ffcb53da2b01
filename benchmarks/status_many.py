"""``scaletrain status`` over 200 run folders with fake squeue/sacct: wall time and Slurm calls.

    PYTHONPATH=src python3 benchmarks/status_many.py [N]

Each folder has a job id and a Monitor metrics.jsonl of 2,000 steps; half the jobs are in the
(fake) queue, half only in the (fake) accounting. Prints the median of 5 runs of
``status.collect`` and how many times each command ran (must be 1 squeue + 1 sacct per run).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / d) for d in ("unit", "")]
from test_jobs_after_submit import SACCT, SQUEUE, acct_row, queue_row  # noqa: E402

from scaletrain.contract.files import METRICS_FILE  # noqa: E402
from scaletrain.jobs import status  # noqa: E402
from scaletrain.observe.records import encode  # noqa: E402  (the Monitor's own line writer)


def main(n: int = 200) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for name, body in (("squeue", SQUEUE), ("sacct", SACCT)):
            (bin_dir / name).write_text(body)
            (bin_dir / name).chmod(0o755)
        queue, acct, runs = [], [], []
        for i in range(n):
            job = str(1000 + i)
            run = root / "runs" / f"run-{i:03d}"
            (run / "monitor").mkdir(parents=True)
            (run / "job_id").write_text(job + "\n")
            (run / "job.sh").write_text("#!/bin/bash\n")
            lines = [encode({"type": "start", "time": 0.0, "total_steps": 4000, "start_step": 0})]
            lines += [encode({"type": "step", "step": s, "t": s * 0.1, "step_s": 0.1, "samples": 8,
                                  "loss": 1.0 / s, "samples_per_s": 80.0}) for s in range(1, 2001)]
            (run / "monitor" / METRICS_FILE).write_text("\n".join(lines) + "\n")
            (queue if i % 2 else acct).append(queue_row(job, "RUNNING") if i % 2 else acct_row(job, "COMPLETED"))
            runs.append(run)
        (root / "queue").write_text("\n".join(queue) + "\n")
        (root / "acct").write_text("\n".join(acct) + "\n")
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_DIR": str(root)}
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            rows = status.collect(runs, env=env)
            times.append(time.perf_counter() - t0)
        calls = (root / "calls").read_text().split("\n")
        per_run = {c: sum(line.startswith(c) for line in calls) / 5 for c in ("squeue", "sacct")}
        assert all(r.step == 2000 for r in rows)
        print(f"status over {n} run folders: median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}); Slurm calls per status: {per_run}; "
              f"cpus {os.cpu_count()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
