"""``scaletrain submit`` end to end on the local 2-node Slurm cluster (fake GPUs, CPU workers).

Two real jobs of 2 nodes x 2 "GPUs" (world 4) with a gloo all_reduce: the default launcher
(srun, one task per GPU, scaletrain.init reads Slurm) and torchrun mode (srun, one task per node
running ``scaletrain run --nnodes 2 --node-rank $SLURM_NODEID``). Every rank's line is checked,
and the sum 1+2+3+4 = 10. The generated scripts must pass ``scaletrain lint``. The arguments
include a space and ``$(id)``: they must arrive literally through sbatch, srun and bash -c.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import sigint_as_ctrl_c

pytestmark = pytest.mark.slurm

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent.parent / "examples" / "cifar10_cnn.py"
ALLREDUCE = HERE / "allreduce_job.py"
EXIT_JOB = HERE / "exit_job.py"
HOSTILE = ["a b", "$(id)"]
LINE = re.compile(r"RANK (\d+) WORLD (\d+) LOCAL (\d+)/(\d+) NODE (\d+)/(\d+) HOST (\S+) "
                  r"LAUNCHER (\S+) DEVICE (\S+) SUM (\S+) ARGS (.*)$")


def _clusters_env(profile: Path) -> dict[str, str]:
    return {"SCALETRAIN_CLUSTERS_DIR": str(profile.parent)}


def _submit(cluster, profile: Path, run_dir: Path, *args: str, timeout: float = 150):
    # no SCALETRAIN_CLUSTERS_DIR: the script itself must point the runtime at the --profile file
    return cluster.scaletrain("submit", "--profile", str(profile), "--run-dir", str(run_dir), *args,
                              timeout=timeout)


@pytest.fixture(scope="module")
def jobs(slurm_cluster, probed_profile, tmp_path_factory):
    """Both 4-rank jobs, submitted with --wait one after the other: {launcher: (proc, run_dir)}."""
    out = {}
    for launcher in ("scaletrain", "torchrun", "scaletrain-run"):
        run_dir = tmp_path_factory.mktemp("runs") / launcher
        t0 = time.monotonic()
        proc = _submit(slurm_cluster, probed_profile, run_dir, "--wait", "--nodes", "2",
                       "--gpus-per-node", "2", "--cpus-per-gpu", "1", "--device", "cpu",
                       "--launcher", launcher,
                       "--", str(ALLREDUCE), *HOSTILE)
        out[launcher] = (proc, run_dir, time.monotonic() - t0)
    return out


@pytest.fixture(scope="module")
def example_jobs(slurm_cluster, probed_profile, tmp_path_factory):
    """The CIFAR-10 example (1 short epoch), default mode; each rank saves its parameters.

    (torchrun mode is covered by the all_reduce job: one more torch job costs 10-30 s here.)
    """
    out = {}
    for launcher in ("scaletrain",):
        base = tmp_path_factory.mktemp("example")
        proc = _submit(slurm_cluster, probed_profile, base / "run", "--wait", "--nodes", "2",
                       "--gpus-per-node", "2", "--cpus-per-gpu", "1", "--device", "cpu",
                       "--launcher", launcher,
                       "--", str(EXAMPLE), "--epochs", "1", "--samples", "512",
                       "--batch-size", "32", "--save-params", str(base / "params"))
        out[launcher] = (proc, base / "params")
    return out


# Loads every rank's parameters and prints how far each is from rank 0's (DDP keeps them equal).
_COMPARE = """
import json, sys, torch
states = [torch.load(f"{sys.argv[1]}/params_rank{r}.pt") for r in range(4)]
diff = max((states[0][k] - s[k]).abs().max().item() for s in states[1:] for k in states[0])
print(json.dumps({"diff": diff, "keys": len(states[0])}))
"""


@pytest.mark.parametrize("launcher", ["scaletrain"])
def test_example_trains_on_every_rank_in_step(slurm_cluster, example_jobs, launcher):
    import json

    proc, params = example_jobs[launcher]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    via = "slurm" if launcher == "scaletrain" else "torchrun"
    assert f"rank 0/4 (local 0/2, node 0/2) cpu gloo via {via}" in proc.stdout
    assert re.search(r"epoch 1/1 loss \d+\.\d+ .*\(4 steps x 32 x 4 processes\)", proc.stdout)
    assert sorted(p.name for p in params.iterdir()) == [f"params_rank{r}.pt" for r in range(4)]
    check = slurm_cluster.run(sys.executable, "-c", _COMPARE, str(params), timeout=120)
    assert check.returncode == 0, check.stderr
    result = json.loads(check.stdout)
    assert result["keys"] == 10 and result["diff"] == 0.0   # gradients were all-reduced


@pytest.mark.parametrize("launcher", ["scaletrain", "torchrun", "scaletrain-run"])
def test_submit_wait_exit_code_and_run_folder(jobs, launcher):
    proc, run_dir, _ = jobs[launcher]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.splitlines()[0]
    assert job_id.isdigit()
    assert (run_dir / "job_id").read_text().strip() == job_id
    assert (run_dir / "job.sh").is_file()
    assert (run_dir / f"allreduce_job-{job_id}.out").is_file()  # relative --output: the run folder
    assert f"job {job_id} COMPLETED (exit code 0" in proc.stderr


@pytest.mark.parametrize("launcher,slurm_launcher", [("scaletrain", "slurm"), ("torchrun", "torchrun"),
                                                     ("scaletrain-run", "torchrun")])
def test_every_rank_reports_the_allreduce_sum(jobs, launcher, slurm_launcher):
    proc, _, _ = jobs[launcher]
    found = [m for m in map(LINE.search, proc.stdout.splitlines()) if m]
    ranks = sorted(int(m.group(1)) for m in found)
    assert ranks == [0, 1, 2, 3], proc.stdout + proc.stderr
    for m in found:
        rank = int(m.group(1))
        world, local, lworld, node, nnodes = (int(m.group(i)) for i in (2, 3, 4, 5, 6))
        assert (world, lworld, nnodes) == (4, 2, 2)
        assert (node, local) == (rank // 2, rank % 2)           # block distribution over nodes
        if launcher != "torchrun":                                # the Slurm node it ran on
            assert m.group(7) == f"n{1 + rank // 2}"
        assert m.group(8) == slurm_launcher
        assert m.group(9) == "cpu"                               # fake GPUs: --device cpu
        assert float(m.group(10)) == 10.0                        # 1 + 2 + 3 + 4
        assert m.group(11) == "a b $(id)"                        # arguments arrive literally
    # torchrun's c10d rendezvous numbers the nodes in the order they join: each node holds a
    # block of consecutive ranks, but which node is first is not fixed
    hosts = {m.group(7): sorted(int(x.group(1)) for x in found if x.group(7) == m.group(7)) for m in found}
    assert sorted(hosts) == ["n1", "n2"] and sorted(map(tuple, hosts.values())) == [(0, 1), (2, 3)]


def _launch_words(script: str) -> list[str]:
    """The words of the job script's one srun line after its ``# launch:`` comment."""
    body = script.split("# launch:", 1)[1].splitlines()[1:]
    lines = [line for line in body if line.startswith("srun ")]
    assert len(lines) == 1, body
    return shlex.split(lines[0])


def test_modes_differ_in_tasks_per_node(jobs):
    default = (jobs["scaletrain"][1] / "job.sh").read_text()
    torchrun = (jobs["torchrun"][1] / "job.sh").read_text()
    agent = (jobs["scaletrain-run"][1] / "job.sh").read_text()
    assert "#SBATCH --ntasks-per-node=2" in default
    assert "#SBATCH --ntasks-per-node=1" in torchrun and "#SBATCH --ntasks-per-node=1" in agent
    assert "-m torch.distributed.run --nnodes=2 --nproc_per_node=2" in torchrun   # torch's own launcher
    # torch's own launcher starts the program: the launch command, word by word (the program's
    # absolute path may hold any word - a clone is a folder named scaletrain)
    launch = _launch_words(torchrun)
    start = launch.index("-m")
    assert launch[start + 1:start + 3] == ["torch.distributed.run", "--nnodes=2"], launch
    assert "--rdzv_backend=c10d" in launch and launch[-3:] == [str(ALLREDUCE), *HOSTILE], launch
    assert not [w for w in launch[:-3] if w == "scaletrain" or w.startswith("scaletrain.")], launch
    assert '--node-rank "$SLURM_NODEID"' in agent
    assert "export SCALETRAIN_DEVICE=cpu" in default and "export SCALETRAIN_DEVICE=cpu" in torchrun
    assert "#SBATCH --cpus-per-task=1" in default and "#SBATCH --cpus-per-task=2" in torchrun


@pytest.mark.parametrize("launcher", ["scaletrain", "torchrun", "scaletrain-run"])
def test_generated_script_passes_lint(slurm_cluster, probed_profile, jobs, launcher):
    script = jobs[launcher][1] / "job.sh"
    proc = slurm_cluster.scaletrain("lint", "--profile", str(probed_profile), str(script))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " error " not in proc.stdout


def test_dry_run_writes_and_does_not_submit(slurm_cluster, probed_profile, tmp_path):
    run_dir = tmp_path / "dry"
    proc = _submit(slurm_cluster, probed_profile, run_dir, "--dry-run", "--gpus", "2",
                   "--job-name", "st_dry_marker", "--", str(ALLREDUCE))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(run_dir / "job.sh")
    text = (run_dir / "job.sh").read_text()
    assert text.startswith("#!/bin/bash\n# Generated by scaletrain")
    assert "#SBATCH --job-name=st_dry_marker" in text
    assert not (run_dir / "job_id").exists()
    assert "dry run" in proc.stderr
    queue = slurm_cluster.run("scontrol", "show", "job", "-o")
    assert "st_dry_marker" not in queue.stdout


def test_rendered_cluster_name_resolves_in_the_job(slurm_cluster, probed_profile, tmp_path):
    """The script tells the runtime its cluster (SCALETRAIN_CLUSTER); with ``--profile FILE``
    that value must load without a user clusters directory, or every task fails in init()."""
    run_dir = tmp_path / "name"
    proc = slurm_cluster.scaletrain("submit", "--profile", str(probed_profile), "--run-dir",
                                    str(run_dir), "--dry-run", "--gpus", "2", "--", str(ALLREDUCE))
    assert proc.returncode == 0, proc.stderr
    value = re.search(r"^export SCALETRAIN_CLUSTER=(\S+)$", (run_dir / "job.sh").read_text(), re.M)
    assert value, "the script does not export SCALETRAIN_CLUSTER"
    check = slurm_cluster.run(sys.executable, "-c",
                              "import sys, shlex; from scaletrain.clusters.profile import load_profile; "
                              "print(load_profile(shlex.split(sys.argv[1])[0]).name)", value.group(1),
                              extra_env={"SCALETRAIN_CLUSTERS_DIR": str(tmp_path / "empty")})
    assert check.returncode == 0, check.stderr.strip().splitlines()[-1]


def test_failing_job_exit_code_is_returned(slurm_cluster, probed_profile, tmp_path):
    proc = _submit(slurm_cluster, probed_profile, tmp_path / "fail", "--wait", "--gpus", "1",
                   "--device", "cpu", "--", str(EXIT_JOB), "3")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "exit_job rank 0 exiting with 3" in proc.stdout
    assert re.search(r"job \d+ FAILED \(exit code 3", proc.stderr)


def test_ctrl_c_stops_following_but_keeps_the_job(slurm_cluster, probed_profile, tmp_path):
    cmd = [sys.executable, "-m", "scaletrain", "submit", "--profile", str(probed_profile),
           "--run-dir", str(tmp_path / "intr"), "--wait", "--gpus", "1", "--device", "cpu",
           "--", str(EXIT_JOB), "0", "120"]
    proc = subprocess.Popen(cmd, env=slurm_cluster.env(_clusters_env(probed_profile)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_ctrl_c)
    try:
        job_id = proc.stdout.readline().strip()
        assert job_id.isdigit()
        for _ in range(100):  # until the job runs (or 20 s)
            state = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
            if "JobState=RUNNING" in state:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert f"NOT cancelled (cancel it with: scancel {job_id})" in err
        state = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
        assert re.search(r"JobState=(RUNNING|PENDING)", state)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if "job_id" in locals() and job_id.isdigit():
            slurm_cluster.run("scancel", job_id)


def test_sbatch_missing_is_exit_4_with_hint(slurm_cluster, probed_profile, tmp_path):
    run_dir = tmp_path / "nosbatch"
    proc = slurm_cluster.scaletrain("submit", "--profile", str(probed_profile), "--run-dir",
                                    str(run_dir), "--gpus", "2", "--", str(ALLREDUCE),
                                    extra_env={"PATH": str(Path(sys.executable).parent)})
    assert proc.returncode == 4, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert "scaletrain: error: 'sbatch' not found" in err[-2]
    assert err[-1].startswith("  HINT: the script is written to") and "job.sh" in err[-1]
    assert (run_dir / "job.sh").is_file()


def test_sbatch_refusal_is_one_line_exit_4(slurm_cluster, probed_profile, tmp_path):
    ghost = tmp_path / "ghost.toml"   # a partition the profile has but Slurm does not
    ghost.write_text(probed_profile.read_text() + "\n[partitions.ghost]\ngpus = true\n")
    proc = slurm_cluster.scaletrain("submit", "--profile", str(ghost), "--run-dir",
                                    str(tmp_path / "g"), "--partition", "ghost", "--gpus", "2",
                                    "--", str(ALLREDUCE))
    assert proc.returncode == 4, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("scaletrain: error:")]
    assert len(errors) == 1
    assert "Invalid partition name specified" in errors[0]


@pytest.mark.parametrize("args,needle", [
    (["--partition", "debug", "--time", "03:00:00", "--gpus", "2"], "03:00:00"),
    (["--partition", "nope", "--gpus", "2"], "nope"),
    (["--gpus", "2", "--output", "x.sh"], "--output"),
])
def test_bad_input_is_exit_2_before_sbatch(slurm_cluster, probed_profile, tmp_path, args, needle):
    run_dir = tmp_path / "bad"
    proc = slurm_cluster.scaletrain("submit", "--profile", str(probed_profile), "--run-dir",
                                    str(run_dir), *args, "--", str(ALLREDUCE))
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "HINT:" in proc.stderr
    assert not (run_dir / "job_id").exists()


# Reads a data file by the relative path it was given and reports where it ran (issue 8, defect 5).
_RELATIVE_JOB = """
import os, sys
print("CWD", os.getcwd())
print("DATA", open(sys.argv[1]).read().strip())
print("NAME", os.environ.get("SLURM_JOB_NAME"))
"""


def test_submit_with_relative_script_and_data_path(slurm_cluster, probed_profile, tmp_path):
    """The job runs in the folder it was submitted from: a relative script and data path resolve.

    The same job carries sbatch options the local cluster supports (a job name with spaces, quotes
    and '#', --exclusive, --dependency singleton, --mail-type, a --sbatch pass-through): sbatch must
    read each as written.
    """
    work = tmp_path / "my work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "x.txt").write_text("forty-two\n")
    (work / "job.py").write_text(_RELATIVE_JOB)
    name = 'my "job" #1'
    proc = slurm_cluster.scaletrain(
        "submit", "--profile", str(probed_profile), "--run-dir", str(tmp_path / "run"), "--wait",
        "--gpus", "1", "--cpus-per-gpu", "1", "--device", "cpu", "--launcher", "srun",
        "--job-name", name, "--exclusive", "--dependency", "singleton", "--mail-type", "END",
        "--sbatch", "comment=a b #c", "--", "job.py", "data/x.txt", cwd=work, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"CWD {work}" in proc.stdout and "DATA forty-two" in proc.stdout
    assert f"NAME {name}" in proc.stdout
    job_id = proc.stdout.splitlines()[0]
    info = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    assert "Comment=a b #c" in info and "MailType=END" in info
