"""render_script: valid bash for every cluster and launcher, hostile arguments stay literal,
per-node values are evaluated on each node, data staging and the requeue wiring work.

The scripts are executed with fake ``srun``/``scontrol``/``python3``/``accelerate``/... on
PATH: the fakes record the argv they get (NUL-separated), so the test sees exactly what
the training program would receive.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from scaletrain.clusters.profile import list_profiles, load_profile
from scaletrain.contract.environ import EXIT_STOPPED
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import launch_command, render_script
from scaletrain.plan.launchers import SPECS
from scaletrain.plan.request import LAUNCHERS, JobRequest

HOSTILE = ("'; rm -rf ~'", "$(id)", "`id`", "a b", "--x=$HOME", "*", "", "\"q\"", "\\", "-- x", "${HOME}",
           "#x", "é ✓")
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")


def render(cluster: str, **kw) -> str:
    kw.setdefault("account", "project_1")
    kw.setdefault("script", "train.py")
    return render_script(make_plan(JobRequest(cluster=cluster, **kw), load_profile(cluster)))


def bash_n(text: str, tmp_path: Path) -> None:
    f = tmp_path / "job.sh"
    f.write_text(text)
    r = subprocess.run([BASH, "-n", str(f)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr + text


FAKE_SRUN = r"""#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do shift; done
# what srun gives a task on the second node (the batch host itself has no SLURM_NODEID)
export SLURM_NODEID=1 SLURM_PROCID=5 SLURM_LOCALID=1 SLURM_NTASKS=8
if [ -n "${FAKE_SRUN_WAIT:-}" ]; then
  # like real tasks under scaletrain.init(): a stop signal -> save -> exit 75 (or FAKE_SRUN_RC)
  trap 'echo "srun got USR1" >> "$FAKE_LOG"; exit "${FAKE_SRUN_RC:-75}"' USR1
  trap 'echo "srun got TERM" >> "$FAKE_LOG"; exit "${FAKE_SRUN_RC:-75}"' TERM
  touch "$FAKE_SRUN_WAIT"; for _ in $(seq 300); do sleep 0.1; done; exit 9
fi
exec "$@"
"""
FAKE_RECORD = r"""#!/bin/bash
{ printf '%s\0' "$(basename "$0")" "$@"; printf 'ENV\0%s\0%s\0%s\0' "${RANK:-}" "${MASTER_ADDR:-}" "${MASTER_PORT:-}"; } > "$FAKE_ARGS"
"""
FAKE_SCONTROL = r"""#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
if [ "$1 $2" = "show hostnames" ]; then printf 'nodeA\nnodeB\n'; fi
"""
FAKE_VIRTUALENV = r"""#!/bin/bash
# virtualenv --no-download DIR: an activate script and a pip that does nothing
mkdir -p "$2/bin" && echo 'export VIRTUAL_ENV=1' > "$2/bin/activate"
printf '#!/bin/bash\nexit 0\n' > "$2/bin/pip" && chmod +x "$2/bin/pip"
"""
FAKE_APPTAINER = r"""#!/bin/bash
# apptainer exec [--nv|--rocm] [-B DIR]... IMAGE CMD...: run CMD here
shift
while [[ "$1" == -* ]]; do [ "$1" = -B ] && shift; shift; done
shift
exec "$@"
"""
FAKE_WRAPPER = r"""#!/bin/bash
shift  # "exec"
exec "$@"
"""


@pytest.fixture
def fakebin(tmp_path: Path):
    """A PATH with fake Slurm commands and launchers; returns a function that runs a script."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "nvme").mkdir()   # node-local disk ($LOCAL_SCRATCH, $TMPDIR)
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("python3", FAKE_RECORD),
                       ("python", FAKE_RECORD), ("accelerate", FAKE_RECORD), ("deepspeed", FAKE_RECORD),
                       ("apptainer_wrapper", FAKE_WRAPPER), ("module", "#!/bin/bash\nexit 0\n"),
                       ("virtualenv", FAKE_VIRTUALENV), ("apptainer", FAKE_APPTAINER),
                       ("singularity", FAKE_APPTAINER)):
        f = bin_dir / name
        f.write_text(body)
        f.chmod(0o755)

    def env(**extra: str) -> dict[str, str]:
        e = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_LOG": str(tmp_path / "log"),
             "FAKE_ARGS": str(tmp_path / "args"), "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "node[A-B]",
             "SLURM_CPUS_PER_TASK": "10", "SLURM_JOB_NUM_NODES": "2", "LOCAL_SCRATCH": str(tmp_path / "nvme"),
             "SLURM_TMPDIR": str(tmp_path / "tmpdir"), "TMPDIR": str(tmp_path / "nvme")}
        e.update(extra)
        return e

    def run(text: str, **extra: str) -> tuple[list[str], str]:
        script = tmp_path / "job.sh"
        script.write_text(text)
        r = subprocess.run([BASH, str(script)], env=env(**extra), capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        argv = (tmp_path / "args").read_bytes().decode().split("\0")[:-1]
        log = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
        return argv, log

    run.env = env  # type: ignore[attr-defined]
    run.tmp = tmp_path  # type: ignore[attr-defined]
    return run


# --------------------------------------------------------------------------- syntax everywhere

@pytest.mark.parametrize("cluster", [c for c in list_profiles() if c != "local" and not load_profile(c).retired])
def test_every_cluster_and_launcher_renders_valid_bash(cluster: str, tmp_path: Path) -> None:
    per = load_profile(cluster).gpus_per_node
    for launcher in [x for x in LAUNCHERS if x not in load_profile(cluster).missing_launchers]:
        for gpus in (1, per, 2 * per):
            text = render(cluster, gpus=gpus, launcher=launcher, script_args=HOSTILE,
                          requeue=gpus == per and SPECS[launcher].requeue_ok,
                          stage_data="/data/set.tar.gz" if load_profile(cluster).scratch_var else None)
            bash_n(text, tmp_path)
            assert text.startswith("#!/bin/bash\n# Generated by scaletrain ")
            assert "srun --kill-on-bad-exit=1" in text and "set -eo pipefail" in text and "set -u" in text
            assert f"export SCALETRAIN_CLUSTER={cluster}" in text


def test_sbatch_lines_come_before_any_command() -> None:
    lines = render("lumi", gpus=16, requeue=True).splitlines()
    last_sbatch = max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    first_cmd = min(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert last_sbatch < first_cmd


def test_provenance_header_has_version_and_exact_command() -> None:
    cmd = ("scaletrain", "plan", "--cluster", "roihu", "--gpus", "4", "--", "train.py", "a b", "x\ny")
    text = render("roihu", gpus=4, command=cmd)
    from scaletrain import __version__
    assert f"# Generated by scaletrain {__version__} for cluster roihu (partition gpumedium)" in text
    assert "# command: scaletrain plan --cluster roihu --gpus 4 -- train.py 'a b' 'x\\ny'" in text


# --------------------------------------------------------------------------- hostile arguments

@pytest.mark.parametrize("launcher,cluster,gpus", [
    ("scaletrain", "roihu", 8), ("mpi", "roihu", 4), ("lightning", "lumi", 8), ("srun", "roihu", 8),
    ("torchrun", "roihu", 4), ("torchrun", "lumi", 16), ("scaletrain-run", "roihu", 4),
    ("scaletrain-run", "lumi", 16), ("accelerate", "roihu", 4),
    ("accelerate", "roihu", 8), ("deepspeed", "roihu", 4), ("deepspeed", "roihu", 8),
])
def test_hostile_arguments_reach_the_program_literally(fakebin, launcher, cluster, gpus) -> None:
    text = render(cluster, gpus=gpus, launcher=launcher, script="my train.py", script_args=HOSTILE)
    argv, log = fakebin(text)
    # the program and every argument arrive unchanged, in order, at the end of argv
    assert argv[argv.index("ENV") - len(HOSTILE) - 1: argv.index("ENV")] == ["my train.py", *HOSTILE]
    assert "srun --kill-on-bad-exit=1" in log
    assert not (fakebin.tmp / "rm").exists()


def test_per_node_values_are_evaluated_on_each_node(fakebin) -> None:
    # SLURM_NODEID is unset in the batch shell; only the fake srun sets it (to 1) for its task
    argv, _ = fakebin(render("roihu", gpus=8, launcher="scaletrain-run"))
    assert argv[:4] == ["python3", "-m", "scaletrain", "run"]
    joined = " ".join(argv)
    assert "--nnodes 2 --node-rank 1 --master-addr nodeA --master-port 13456 --nproc-per-node 4 train.py" in joined
    argv, _ = fakebin(render("roihu", gpus=8, launcher="accelerate"))
    assert "--machine_rank=1" in argv and "--main_process_ip=nodeA" in argv and "--num_processes=8" in argv
    argv, _ = fakebin(render("roihu", gpus=8, launcher="deepspeed"))
    assert "--node_rank=1" in argv and "--no_ssh" in argv and argv[0] == "deepspeed"
    # in the job's own folder, not loose in the working directory
    hostfile = next((fakebin.tmp).glob(".scaletrain/job-*/hostfile")).read_text()
    assert hostfile == "nodeA slots=4\nnodeB slots=4\n"


def test_srun_mode_sets_torch_env_from_slurm(fakebin) -> None:
    argv, _ = fakebin(render("roihu", gpus=8, launcher="srun"))
    env = argv[argv.index("ENV") + 1:]
    assert env == ["5", "nodeA", "13456"]            # RANK from SLURM_PROCID, master, port


def test_master_address_suffix_and_port_formula(fakebin) -> None:
    argv, _ = fakebin(render("juwels-booster", gpus=8))
    assert argv[argv.index("ENV") + 2:] == ["nodeAi", "13456"]   # 10000 + 123456 % 20000
    from scaletrain.contract.environ import port_from_job_id
    assert port_from_job_id("123456") == 13456


def test_lumi_binding_and_network_env_in_script() -> None:
    text = render("lumi", gpus=8)
    assert "--cpu-bind=mask_cpu:0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00," \
           "0xfe00000000,0xfe0000000000" in text
    assert "export NCCL_SOCKET_IFNAME=hsn" in text


def test_container_wraps_the_program(fakebin) -> None:
    plan = make_plan(JobRequest(cluster="lumi", gpus=8, account="p", script="t.py", container="/img/pt.sif"),
                     load_profile("lumi"))
    assert "singularity exec /img/pt.sif python3 -u t.py" in launch_command(plan)   # LUMI: Singularity
    plan = make_plan(JobRequest(cluster="narval", gpus=1, account="p", script="t.py", container="a b.sif"),
                     load_profile("narval"))
    assert "apptainer exec --nv -B /project -B /scratch 'a b.sif' python -u t.py" in launch_command(plan)


def test_device_cpu_is_exported() -> None:
    assert "export SCALETRAIN_DEVICE=cpu" in render("roihu", gpus=4, device="cpu")


# --------------------------------------------------------------------------- data staging

@pytest.mark.parametrize("kind", ["dir", "tar", "tar.gz", "zip"])
def test_stage_data_extracts_once_per_node(fakebin, kind: str) -> None:
    if kind == "zip" and shutil.which("unzip", path="/usr/bin:/bin") is None:
        # without unzip the script extracts with the profile's python, which fakebin fakes
        pytest.skip("needs unzip in /usr/bin or /bin (apt-get install unzip)")
    tmp = fakebin.tmp
    src_dir = tmp / "ds"
    (src_dir / "sub").mkdir(parents=True)
    (src_dir / "sub" / "x.txt").write_text("hello")
    if kind == "dir":
        src = src_dir
    elif kind == "zip":
        src = tmp / "my ds.zip"
        with zipfile.ZipFile(src, "w") as z:
            z.write(src_dir / "sub" / "x.txt", "sub/x.txt")
    else:
        src = tmp / f"my ds.{kind}"
        with tarfile.open(src, "w:gz" if kind == "tar.gz" else "w") as t:
            t.add(src_dir / "sub", arcname="sub")
    text = render("roihu", gpus=4, stage_data=str(src), stage_data_gb=0.001)
    _, log = fakebin(text)
    dest = tmp / "nvme" / ("ds" if kind == "dir" else "my_ds")
    assert (dest / "sub" / "x.txt").read_text() == "hello"
    sruns = [ln for ln in log.splitlines() if ln.startswith("srun ")]
    assert len(sruns) == 2 and "--ntasks-per-node=1" in sruns[0]    # staging step, then training
    assert "#SBATCH --gres=gpu:gh200:4\n" in text      # Roihu's $TMPDIR needs no request


# --------------------------------------------------------------------------- requeue

def _run_until_srun_waits(fakebin, text: str, signum: int = signal.SIGUSR1,
                          **extra: str) -> tuple[int, str]:
    tmp = fakebin.tmp
    script = tmp / "job.sh"
    script.write_text(text)
    ready = tmp / "srun-started"
    proc = subprocess.Popen([BASH, str(script)], env=fakebin.env(FAKE_SRUN_WAIT=str(ready), **extra),
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "fake srun never started"
        time.sleep(0.2)                      # let bash reach 'wait'
        os.kill(proc.pid, signum)            # what Slurm does: --signal=B:USR1@..., or preemption
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, (tmp / "log").read_text() + out


def test_requeue_forwards_usr1_and_requeues_once_the_tasks_saved(fakebin) -> None:
    text = render("roihu", gpus=4, requeue=True, time="02:00:00")
    assert "#SBATCH --signal=B:USR1@300\n#SBATCH --requeue\n" in text
    rc, log = _run_until_srun_waits(fakebin, text, SLURM_RESTART_COUNT="1")
    assert rc == 0 and "srun got USR1" in log and "scontrol requeue 123456" in log
    assert "got SIGUSR1" in log and "restart 2 of 5" in log


def test_requeue_after_sigterm_preemption(fakebin) -> None:
    rc, log = _run_until_srun_waits(fakebin, render("roihu", gpus=4, requeue=True),
                                    signum=signal.SIGTERM)
    assert rc == 0 and "srun got TERM" in log and "scontrol requeue 123456" in log


def test_no_requeue_when_the_tasks_did_not_save(fakebin) -> None:
    # srun's exit code is not EXIT_STOPPED (a crash, or tasks without a handler): no requeue
    rc, log = _run_until_srun_waits(fakebin, render("roihu", gpus=4, requeue=True), FAKE_SRUN_RC="1")
    assert rc == 1 and "srun got USR1" in log and "scontrol requeue" not in log


def test_requeue_stops_after_the_bound(fakebin) -> None:
    text = render("roihu", gpus=4, requeue=True)
    rc, log = _run_until_srun_waits(fakebin, text, SLURM_RESTART_COUNT="5")
    assert "srun got USR1" in log and "scontrol requeue" not in log
    assert "requeued 5 times already" in log
    assert rc == EXIT_STOPPED   # saved, not requeued: the job ends with the tasks' code


# --------------------------------------------------------------------------- local profile

def test_local_script_runs_scaletrain_run_without_slurm(fakebin) -> None:
    cores = load_profile("local").cores_per_node
    text = render("local", gpus=min(2, cores), account=None, script_args=("$(id)",))
    assert "#SBATCH" not in text and "srun" not in text
    argv, _ = fakebin(text)
    assert argv[:6] == ["python3", "-m", "scaletrain", "run", "--nproc-per-node", str(min(2, cores))]
    assert argv[6:8] == ["train.py", "$(id)"]


def test_the_hostile_argument_check_can_fail(fakebin, monkeypatch) -> None:
    """Without shlex.quote the same harness sees the arguments change (or the script break)."""
    import scaletrain.plan.render as render_mod

    monkeypatch.setattr(render_mod, "q", lambda s: s)
    text = render("roihu", gpus=4, script_args=("$(echo injected)", "a b"))
    try:
        argv, _ = fakebin(text)
    except AssertionError:
        return  # the unquoted script did not even run cleanly
    assert argv[argv.index("ENV") - 2: argv.index("ENV")] != ["$(echo injected)", "a b"]


@pytest.mark.parametrize("cluster", [c for c in list_profiles() if c != "local" and not load_profile(c).retired])
def test_every_script_runs_as_written_under_stub_commands(fakebin, cluster: str) -> None:
    """Every profile x launcher, on two nodes, with and without a container: the script runs to the
    program with fake srun/module/virtualenv/apptainer, and the program gets its arguments."""
    per = load_profile(cluster).gpus_per_node
    for launcher in LAUNCHERS:
        for container in (None, "/img/x.sif"):
            if container is None and launcher in load_profile(cluster).missing_launchers:
                continue   # refused, saying why (tests/unit/test_live_profiles.py)
            text = render(cluster, gpus=2 * per, launcher=launcher, container=container,
                          script_args=("a b", "$(id)"))
            argv, _ = fakebin(text)
            assert argv[argv.index("ENV") - 3: argv.index("ENV")] == ["train.py", "a b", "$(id)"], \
                (cluster, launcher, container)
