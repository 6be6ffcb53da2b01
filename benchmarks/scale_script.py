"""The batch script at N nodes: ``plan``, the generated script, and what it runs before ``srun``.

    PYTHONPATH=src python3 benchmarks/scale_script.py [--nodes 16,256,6000] [--launchers ...]

For each launcher and node count on the ``jupiter`` profile (4 GH200 a node): ``scaletrain plan``
as a user runs it (a fresh process: seconds, peak memory), the script's size, ``bash -n``, and
``scaletrain lint`` of it. Then the script itself runs as the batch shell would, on this
machine: Slurm's own ``scontrol show hostnames`` expands a hostlist of N nodes (a minimal
``slurm.conf``; no controller is asked), and stand-ins for ``srun``, ``module`` and the
programs a task starts record what they are given. Checked: MASTER_ADDR is the allocation's
first node, MASTER_PORT the job-id formula, one ``srun`` line; each per-node task's program
(``bash -c '...'``) is then run once as the last node's task (the work every task does before
its program starts, e.g. TensorFlow's TF_CONFIG of every node, DeepSpeed's hostfile).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_common import REPO, done, emit, in_fresh_process  # noqa: E402

LAUNCHERS = ("scaletrain", "srun", "scaletrain-run", "torchrun", "deepspeed", "accelerate", "tensorflow")
_STUB = """#!/bin/bash
# stand-in for {name}: records how it was called
printf '%s\\0' {name} "$@" >> "$SCALE_CALLS"
printf '\\n' >> "$SCALE_CALLS"
[ -n "${{TF_CONFIG:-}}" ] && printf 'TF_CONFIG %s\\n' "${{#TF_CONFIG}}" >> "$SCALE_CALLS"
exit 0
"""


def hostlist(nodes: int) -> str:
    """JUPITER-like node names as one Slurm hostlist expression."""
    return f"jpbo-[0000-{nodes - 1:04d}]"


def plan(nodes: int, launcher: str, out: Path) -> dict[str, Any]:
    """``scaletrain plan`` in a fresh process; the script goes to ``out``."""
    extra = ["--container", "tf.sif"] if launcher == "tensorflow" else []
    args = ["plan", "--cluster", "jupiter", "--nodes", str(nodes), "--account", "p1", "--time", "12:00:00",
            "--launcher", launcher, *extra, "--output", str(out), "train.py", "--epochs", "2"]
    code = ("import json, sys, time, contextlib, io\nfrom scale_common import peak_mb\n"
            "from scaletrain.cli.main import main\n"
            "err = io.StringIO()\nt0 = time.perf_counter()\n"
            f"with contextlib.redirect_stderr(err):\n    rc = main({args!r})\n"
            "print(json.dumps({'rc': rc, 's': time.perf_counter() - t0, 'peak_mb': peak_mb(),"
            " 'err': err.getvalue()[-500:]}))")
    return in_fresh_process(code)


def lint(script: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "scaletrain", "lint", str(script)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=600)
    took = time.perf_counter() - t0
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    return {"lint_rc": proc.returncode, "lint_s": round(took, 3), "lint": last[0][:200]}


def run_script(script: Path, nodes: int, tmp: Path) -> dict[str, Any]:
    """Run the script as the batch shell with stand-ins; what it computed and called."""
    stubs = tmp / "bin"
    stubs.mkdir(exist_ok=True)
    for name in ("srun", "module", "python3", "python", "deepspeed", "accelerate", "torchrun", "apptainer",
                 "singularity"):
        (stubs / name).write_text(_STUB.format(name=name))
        (stubs / name).chmod(0o755)
    conf = tmp / "slurm.conf"
    conf.write_text(f"ClusterName=sim\nSlurmctldHost=localhost\nNodeName={hostlist(nodes)} CPUs=288 State=UNKNOWN\n"
                    f"PartitionName=booster Nodes={hostlist(nodes)}\n")
    calls = tmp / "calls"
    calls.write_text("")
    env = {"PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_CONF": str(conf), "SCALE_CALLS": str(calls),
           "SLURM_JOB_NODELIST": hostlist(nodes), "SLURM_JOB_ID": "4242", "SLURM_NNODES": str(nodes),
           "SLURM_CPUS_PER_TASK": "288", "HOME": str(tmp), "PWD": str(tmp)}
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    batch_s = time.perf_counter() - t0
    records = [r.split("\0")[:-1] for r in calls.read_text().split("\n") if "\0" in r]
    sruns = [r for r in records if r and r[0] == "srun"]
    out: dict[str, Any] = {"batch_rc": proc.returncode, "batch_s": round(batch_s, 3), "sruns": len(sruns),
                           "batch_err": proc.stderr.strip()[-300:]}
    if proc.returncode != 0 or not sruns:
        return out
    words = sruns[-1][1:]
    if "bash" in words and "-c" in words:      # a per-node program: run it once as the last node
        i = words.index("-c")
        calls.write_text("")
        task_env = {**env, "SLURM_NODEID": str(nodes - 1), "SLURM_PROCID": str(nodes - 1), "SLURM_LOCALID": "0",
                    "SLURM_NTASKS": str(nodes), "MASTER_ADDR": "jpbo-0000", "MASTER_PORT": "14242",
                    "DS_HOSTFILE": str(tmp / ".scaletrain" / "job-4242" / "hostfile")}
        t0 = time.perf_counter()
        task = subprocess.run(["bash", "-c", words[i + 1], *words[i + 2:]], cwd=tmp, env=task_env, capture_output=True,
                              text=True, timeout=600)
        out.update(task_rc=task.returncode, task_s=round(time.perf_counter() - t0, 3),
                   task_err=task.stderr.strip()[-300:],
                   task_calls=[r.split("\0")[0] for r in calls.read_text().split("\n") if "\0" in r],
                   tf_config=[int(x.split()[1]) for x in calls.read_text().split("\n") if x.startswith("TF_CONFIG")])
    hostfile = tmp / ".scaletrain" / "job-4242" / "hostfile"
    if hostfile.exists():
        out["hostfile_lines"] = len(hostfile.read_text().splitlines())
    text = script.read_text()
    out["master_ok"] = 'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p' in text
    return out


def measure(nodes: int, launcher: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        script = tmp / "job.sh"
        planned = plan(nodes, launcher, script)
        row: dict[str, Any] = {"step": "script", "series": launcher, "n": nodes * 4, "nodes": nodes,
                               "plan_s": round(planned["s"], 3), "plan_peak_mb": round(planned["peak_mb"], 1),
                               "plan_rc": planned["rc"]}
        if planned["rc"] != 0 or not script.exists():
            row["plan_err"] = planned["err"]
            return row
        text = script.read_text()
        row.update(script_bytes=len(text), script_lines=text.count("\n"),
                   bash_n=subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0)
        row.update(lint(script))
        if shutil.which("scontrol"):
            row.update(run_script(script, nodes, tmp))
        return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="16,256,6000")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--save", action="store_true", help="add the rows to docs/img/scale.json (scale_report.py)")
    args = parser.parse_args()
    rows = []
    for launcher in args.launchers.split(","):
        for nodes in [int(x) for x in args.nodes.split(",")]:
            emit(rows, measure(nodes, launcher))
    return done(rows, args.save)


if __name__ == "__main__":
    sys.exit(main())
