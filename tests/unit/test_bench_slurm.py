"""``bench scaling --nodes`` without a real Slurm: flag checks, and fake sbatch/scontrol/scancel on PATH.

The fake commands keep the queue in a JSON file: sbatch reads the script it is given (nodes and
tasks per node from its ``#SBATCH`` lines), plays the worker by writing the result where the
script's ``--out`` says, and prints a job id; scontrol reports each job's state; scancel marks
it cancelled. ``behaviour.json`` makes a size fail, be refused, stay pending, or interrupt.
The real thing runs in tests/slurm/test_slurm_bench.py.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ctrl_c_handler  # noqa: F401 - a fixture

import scaletrain.bench.scaling_slurm as scaling_slurm
import scaletrain.bench.slurm_jobs as slurm_jobs
from scaletrain.cli.main import main

ARGS = ["bench", "scaling", "--cluster", "roihu", "--account", "project_1", "--steps", "10"]

_SBATCH = r'''
import json, os, re, sys
state = os.path.dirname(os.path.abspath(__file__))
load = lambda name, default: json.load(open(os.path.join(state, name))) if os.path.exists(os.path.join(state, name)) else default
how, queue = load("behaviour.json", {}), load("queue.json", {})
script = open(sys.argv[-1]).read()
nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", script, re.M).group(1))
per_node = int(re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", script, re.M).group(1))
open(os.path.join(state, "calls.txt"), "a").write(f"sbatch {nodes} {os.getcwd()}\n")
if nodes in how.get("refuse", []):
    print("sbatch: error: Batch job submission failed: Requested node configuration is not available",
          file=sys.stderr)
    sys.exit(1)
job_id = str(100 + len(queue))
log = os.path.join(os.getcwd(), f"bench-scaling-{nodes}n-{job_id}.out")
if nodes in how.get("fail", []):
    open(log, "w").write("Traceback (most recent call last):\nRuntimeError: boom on rank 3\nsrun: error: task 3\n")
    final = "FAILED"
else:
    n = nodes * per_node
    step = 0.1 * (1 + 0.25 * (nodes - 1))      # each added node costs a quarter of a step
    out = re.findall(r"--out (\S+)", script)[-1]   # the launch line, after the header's command
    if nodes not in how.get("no_result", []):
        json.dump({"nproc": n, "nodes": nodes, "workload": "cnn", "strategy": "ddp", "mode": "weak",
                   "batch_per_device": 32, "steps": 10, "warmup": 3, "device": "cuda", "backend": "nccl",
                   "step_s": step, "samples_per_s": 32 * n / step, "samples_per_s_per_device": 32 / step,
                   "data_wait_frac": 0.0, "grad_bytes": 10 ** 6, "allreduce_busbw_gbs": 5.0,
                   "threads": 1}, open(out, "w"))
    final = "COMPLETED"
queue[job_id] = {"state": how.get("state", {}).get(str(nodes), final), "log": log, "nodes": nodes}
json.dump(queue, open(os.path.join(state, "queue.json"), "w"))
print(job_id)
'''

_SCONTROL = r'''
import json, os, signal, sys
state = os.path.dirname(os.path.abspath(__file__))
how = json.load(open(os.path.join(state, "behaviour.json"))) if os.path.exists(os.path.join(state, "behaviour.json")) else {}
queue = json.load(open(os.path.join(state, "queue.json")))
job_id = sys.argv[-1]
open(os.path.join(state, "calls.txt"), "a").write(f"scontrol {job_id}\n")
if how.get("interrupt"):
    os.kill(os.getppid(), getattr(signal, how["interrupt"]))   # Ctrl-C or a hang-up, while the collector polls
job = queue[job_id]
code = "1:0" if job["state"] == "FAILED" else "0:0"
reason = how.get("reason", {}).get(str(job["nodes"]), "Resources") if job["state"] == "PENDING" else "None"
print(f"JobId={job_id} JobName=bench JobState={job['state']} Reason={reason} ExitCode={code} "
      f"NodeList=g[01-02] StdOut={job['log']} StdErr={job['log']}")
'''

_SCANCEL = r'''
import json, os, sys
state = os.path.dirname(os.path.abspath(__file__))
queue = json.load(open(os.path.join(state, "queue.json")))
open(os.path.join(state, "calls.txt"), "a").write(f"scancel {sys.argv[-1]}\n")
queue[sys.argv[-1]]["state"] = "CANCELLED"
json.dump(queue, open(os.path.join(state, "queue.json"), "w"))
'''


@pytest.fixture
def fake_slurm(monkeypatch, tmp_path):
    """PATH with only the fake Slurm commands; no poll waits. Returns the folder (write
    ``behaviour.json`` there)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", _SBATCH), ("scontrol", _SCONTROL), ("scancel", _SCANCEL)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))       # /usr/bin may hold a real sbatch
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    monkeypatch.setattr(slurm_jobs, "POLL_S", 0.01)
    monkeypatch.setattr(scaling_slurm, "RESULT_WAIT_S", 0.0)
    return bin_dir


def _behave(bin_dir: Path, **how: object) -> None:
    (bin_dir / "behaviour.json").write_text(json.dumps(how))


def _calls(bin_dir: Path) -> list[str]:
    return (bin_dir / "calls.txt").read_text().splitlines()


def test_sizes_are_submitted_together_and_reported(fake_slurm, tmp_path, capsys):
    out = tmp_path / "bench"
    assert main([*ARGS, "--nodes", "1,2", "--out", str(out)]) == 0
    stdout, err = capsys.readouterr()
    calls = _calls(fake_slurm)
    assert [c.split()[:2] for c in calls[:2]] == [["sbatch", "1"], ["sbatch", "2"]]   # before any poll
    assert all(not c.startswith("sbatch") for c in calls[2:])
    doc = json.loads((out / "scaling.json").read_text())
    assert doc["launch"] == "slurm" and doc["failed"] == []
    rows = doc["rows"]
    assert [(r["nodes"], r["nproc"], r["job_id"]) for r in rows] == [(1, 4, "100"), (2, 8, "101")]
    assert rows[1]["efficiency"] == pytest.approx(1 / 1.25)           # step 0.125 s against 0.1 s
    assert rows[1]["speedup"] == pytest.approx(2 / 1.25)
    # the profile's bandwidths feed the model; the 1-process run it starts from is missing here
    assert "roihu" in doc["model"]["source"] and "--gpus-per-node 1" in doc["model"]["note"]
    script = (out / "jobs").glob("*/nodes-2/job.sh").__next__().read_text()
    job_dir = calls[1].split()[2]
    assert "#SBATCH --nodes=2" in script and "#SBATCH --account=project_1" in script
    assert "#SBATCH --time=00:20:00" in script
    assert f"-m scaletrain.bench.scaling_worker --workload cnn --strategy ddp --mode weak --batch 32 " \
           f"--steps 10 --warmup 3 --out {job_dir}/result.json" in script
    assert "# command: scaletrain bench scaling --cluster roihu" in script
    assert (Path(job_dir) / "job_id").read_text() == "101\n"
    assert re.search(r"^nodes procs +ms/step.*\n +1 +4 +100\.0 .*\n +2 +8 +125\.0 .* +80%$", stdout, re.M), stdout
    assert "2 nodes (job 101) submitted (8 processes)" in err and "COMPLETED" in err


def test_failed_size_is_a_row_with_reason_and_log(fake_slurm, tmp_path, capsys):
    _behave(fake_slurm, fail=[2])
    out = tmp_path / "bench"
    assert main([*ARGS, "--nodes", "1,2", "--out", str(out)]) == 1
    stdout, err = capsys.readouterr()
    last = err.strip().splitlines()
    assert last[-2] == ("scaletrain: error: bench scaling: 1 of 2 sizes failed; 2 node(s): job 101 FAILED "
                        "(exit code 1): RuntimeError: boom on rank 3")
    assert last[-1].startswith("  HINT: the report has the sizes that ran; read the job's log: ")
    assert last[-1].endswith("bench-scaling-2n-101.out")
    doc = json.loads((out / "scaling.json").read_text())
    assert [r["nodes"] for r in doc["rows"]] == [1]
    assert doc["failed"][0]["nodes"] == 2 and doc["failed"][0]["log"].endswith("bench-scaling-2n-101.out")
    assert "    2     8  FAILED: job 101 FAILED" in stdout
    assert "failed: job 101 FAILED" in (out / "scaling.html").read_text()
    assert "scancel" not in " ".join(_calls(fake_slurm))        # ended jobs are not cancelled


def test_refused_size_and_all_refused(fake_slurm, tmp_path, capsys):
    _behave(fake_slurm, refuse=[2])
    assert main([*ARGS, "--nodes", "1,2", "--out", str(tmp_path / "a")]) == 1
    doc = json.loads((tmp_path / "a" / "scaling.json").read_text())
    assert "sbatch refused it: sbatch failed: sbatch: error: Batch job submission failed: Requested node" \
           in doc["failed"][0]["reason"]
    capsys.readouterr()
    _behave(fake_slurm, refuse=[1, 2])
    assert main([*ARGS, "--nodes", "1,2", "--out", str(tmp_path / "b")]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("scaletrain: error: bench scaling: no size was submitted (sbatch refused it")
    assert not (tmp_path / "b" / "scaling.json").exists()


def test_timeout_cancels_the_jobs_left_and_names_them(fake_slurm, tmp_path, capsys):
    _behave(fake_slurm, state={"1": "PENDING", "2": "PENDING"})
    out = tmp_path / "bench"
    assert main([*ARGS, "--nodes", "1,2", "--out", str(out), "--timeout", "0.05"]) == 1
    err = capsys.readouterr().err
    assert sorted(c for c in _calls(fake_slurm) if c.startswith("scancel")) == ["scancel 100", "scancel 101"]
    assert "1 node: job 100 still PENDING (Resources) after 0.05 s; cancelled\n" in err, err
    last = err.strip().splitlines()
    assert last[-2].startswith("scaletrain: error: bench scaling: no size finished; 1 node(s): job 100 still PENDING")
    assert last[-1] == ("  HINT: it waited in the queue: give a longer --timeout (queue time counts), "
                        "or a partition that starts sooner")
    assert "Traceback" not in err


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_ctrl_c_while_waiting_cancels_every_job(fake_slurm, tmp_path, capsys, ctrl_c_handler, sig):
    """Ctrl-C, or the login session ending (SIGHUP, SIGTERM): nothing is left in the queue."""
    _behave(fake_slurm, interrupt=sig, state={"1": "RUNNING", "2": "PENDING"})
    assert main([*ARGS, "--nodes", "1,2", "--out", str(tmp_path / "bench")]) == 130
    err = capsys.readouterr().err
    assert "interrupted; cancelled jobs 100, 101" in err
    assert [c for c in _calls(fake_slurm) if c.startswith("scancel")] == ["scancel 100", "scancel 101"]


def test_the_ctrl_c_case_passes_when_the_suite_inherits_sigint_ignored():
    """A suite started in the background from a script inherits SIGINT ignored: the Ctrl-C case
    must not depend on it (it waited out the benchmark's --timeout)."""
    here = Path(__file__).resolve()
    test = f"{here.relative_to(here.parents[2])}::test_ctrl_c_while_waiting_cancels_every_job[SIGINT]"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          cwd=here.parents[2], capture_output=True, text=True, timeout=90,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr


def test_a_size_slurm_will_never_start_is_cancelled_at_once(fake_slurm, tmp_path, capsys):
    """Slurm keeps a job over a partition limit pending for ever: no waiting out --timeout for it."""
    _behave(fake_slurm, state={"4": "PENDING"}, reason={"4": "PartitionNodeLimit"})
    out = tmp_path / "bench"
    assert main([*ARGS, "--nodes", "1,4", "--out", str(out), "--timeout", "600"]) == 1
    err = capsys.readouterr().err
    assert [c for c in _calls(fake_slurm) if c.startswith("scancel")] == ["scancel 101"]
    doc = json.loads((out / "scaling.json").read_text())
    assert [r["nodes"] for r in doc["rows"]] == [1]
    assert doc["failed"][0]["reason"] == ("job 101 cannot start: Slurm says PartitionNodeLimit (the size is over a "
                                          "limit of the partition, account or QOS); cancelled")
    assert err.strip().splitlines()[-1] == ("  HINT: the report has the sizes that ran; ask for fewer --nodes, "
                                            "another --partition or a shorter --time")


@pytest.mark.parametrize("reason,never", [
    ("PartitionNodeLimit", True), ("PartitionTimeLimit", True), ("QOSMaxNodePerJobLimit", True),
    ("AssocMaxWallDurationPerJobLimit", True), ("InvalidAccount", True),
    ("Resources", False), ("Priority", False), ("AssocGrpGRES", False), ("QOSMaxJobsPerUserLimit", False),
    ("AssocMaxJobsLimit", False), ("ReqNodeNotAvail", False), ("Dependency", False),
])
def test_which_pending_reasons_never_resolve(reason, never):
    assert slurm_jobs.never_starts(reason) is never


def test_completed_job_without_a_result_is_a_failed_size(fake_slurm, tmp_path, capsys):
    _behave(fake_slurm, no_result=[2])
    assert main([*ARGS, "--nodes", "1,2", "--out", str(tmp_path / "bench")]) == 1
    err = capsys.readouterr().err
    assert "job 101 COMPLETED but left no readable result.json" in err


def test_sbatch_missing_is_exit_4_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "bench"
    assert main([*ARGS, "--nodes", "1,2", "--out", str(out)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["scaletrain: error: 'sbatch' not found: Slurm's commands are not on PATH",
                   "  HINT: run --nodes on the cluster's login node; on this machine use --nproc 1,2,4"]
    assert not out.exists()


@pytest.mark.parametrize("argv,needle", [
    (["--nodes", "1,2", "--nproc", "1,2", "--cluster", "roihu"], "--nodes and --nproc exclude each other"),
    (["--nodes", "1,2", "--out", "x"], "--nodes needs --cluster NAME"),
    (["--nodes", "1,2", "--cluster", "roihu"], "--nodes needs --out DIR"),
    (["--nodes", "1,2", "--cluster", "local", "--out", "x"], "cluster 'local' has no Slurm"),
    (["--nodes", "0,2", "--cluster", "roihu", "--out", "x"], "--nodes sizes must be at least 1"),
    (["--nodes", "two", "--cluster", "roihu", "--out", "x"], "--nodes must be numbers"),
    (["--nodes", "1", "--cluster", "roihu", "--out", "x"], "requires --account"),
    (["--nodes", "1", "--cluster", "roihu", "--account", "p", "--gpus-per-node", "8", "--out", "x"],
     "a roihu node has 4 GPUs, not 8"),
    (["--gpus-per-node", "2"], "--gpus-per-node goes with --nodes"),
    (["--nproc", "1,2", "--account", "p"], "--account goes with --nodes"),
    (["--time", "00:10:00"], "--time goes with --nodes"),
])
def test_flag_checks_are_one_line_exit_2(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    monkeypatch.delenv("SLURM_ACCOUNT", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))   # nothing may reach sbatch
    assert main(["bench", "scaling", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and needle in err[0] and err[1].startswith("  HINT: "), err
    assert not (tmp_path / "x").exists()


_NO_TORCH = r"""
import json, sys
from scaletrain.cli.main import main
code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
"""


def test_the_nodes_path_does_not_import_torch(fake_slurm, tmp_path):
    """The whole --nodes flow (plan, submit, wait, collect, report) in a fresh interpreter."""
    import os

    argv = [*ARGS, "--nodes", "1,2", "--out", str(tmp_path / "bench")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, json.dumps(argv)], capture_output=True, text=True,
                          timeout=120, env=env)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "torch": []}, proc.stderr


def test_every_nodes_example_runs(fake_slurm, tmp_path, monkeypatch, capsys):
    """The --nodes examples of the help, the README and docs/observability.md plan and submit
    (to the fake Slurm) as written; the test-cluster one (a probed ci.toml) is the Slurm test's."""
    import shlex

    from scaletrain.cli.bench import EPILOG

    repo = Path(__file__).resolve().parents[2]
    texts = [EPILOG, (repo / "README.md").read_text(), (repo / "docs" / "observability.md").read_text()]
    examples = [shlex.split(line.split("  #", 1)[0].strip())[1:] for text in texts for line in text.splitlines()
                if line.strip().startswith("scaletrain bench scaling") and "--nodes" in line]
    monkeypatch.chdir(tmp_path)
    ran = 0
    for argv in examples:
        if "ci.toml" in argv:
            continue
        assert main(argv) == 0, f"scaletrain {shlex.join(argv)}\n{capsys.readouterr().err}"
        ran += 1
    assert ran >= 3
