"""scaletrain.slurm.commands and ``clusters probe`` against the real local Slurm cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scaletrain.errors import SlurmError
from scaletrain.slurm import commands

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def finished_jobs(slurm_cluster, tmp_path_factory):
    """Submit three small jobs at once (ok, exit 3, cancelled) and wait for all of them."""
    env = slurm_cluster.env()
    work = tmp_path_factory.mktemp("jobs")
    (work / "ok.sh").write_text(
        "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --gres=gpu:2 --output=ok-%j.out\n"
        "srun bash -c 'echo task $SLURM_PROCID node $SLURM_NODEID gpus $CUDA_VISIBLE_DEVICES'\n")
    (work / "fail.sh").write_text("#!/bin/bash\n#SBATCH --output=fail-%j.out\necho failing; exit 3\n")
    (work / "sleep.sh").write_text("#!/bin/bash\n#SBATCH --output=/dev/null\nsleep 300\n")
    ids = {name: commands.sbatch_parsable(f"{name}.sh", cwd=work, env=env)
           for name in ("ok", "fail", "sleep")}
    commands.cancel(ids["sleep"], env=env)
    seen: list[str] = []
    infos = {name: commands.wait(job, timeout=60, poll=0.3, env=env,
                                 on_change=lambda info: seen.append(info.state))
             for name, job in ids.items()}
    return work, ids, infos, seen


def test_cluster_has_two_idle_gpu_nodes(slurm_cluster):
    nodes = commands.show_nodes(env=slurm_cluster.env())
    assert [n["NodeName"] for n in nodes] == ["n1", "n2"]
    assert all(n["Gres"] == "gpu:2" and n["CPUTot"] == "8" for n in nodes)
    rows = commands.sinfo("%P %D", env=slurm_cluster.env())
    assert ["debug*", "2"] in rows


def test_sbatch_wait_and_output(finished_jobs):
    work, ids, infos, seen = finished_jobs
    ok = infos["ok"]
    assert (ok.state, ok.returncode) == ("COMPLETED", 0)
    assert Path(ok.stdout) == work / f"ok-{ids['ok']}.out"       # relative --output: cwd of sbatch
    lines = sorted(Path(ok.stdout).read_text().split("\n"))[1:]
    assert lines == [f"task {r} node {r // 2} gpus 0,1" for r in range(4)]
    assert "COMPLETED" in seen


def test_failed_job_exit_code(finished_jobs):
    work, ids, infos, _ = finished_jobs
    fail = infos["fail"]
    assert (fail.state, fail.exit_code, fail.returncode) == ("FAILED", 3, 3)
    assert Path(fail.stdout).read_text() == "failing\n"


def test_cancelled_job(finished_jobs):
    _, _, infos, _ = finished_jobs
    assert infos["sleep"].state == "CANCELLED"
    assert infos["sleep"].returncode != 0


def test_sbatch_refusal_is_one_line(slurm_cluster, tmp_path):
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/bash\n#SBATCH --partition=nope\ntrue\n")
    with pytest.raises(SlurmError) as info:
        commands.sbatch_parsable(script, cwd=tmp_path, env=slurm_cluster.env())
    assert info.value.exit_code == 4
    assert "\n" not in info.value.message
    assert "Invalid partition name specified" in info.value.message


def test_unknown_job_id(slurm_cluster):
    with pytest.raises(SlurmError):
        commands.job_info("999999", env=slurm_cluster.env())


def test_wait_timeout_leaves_job_running(slurm_cluster, tmp_path):
    env = slurm_cluster.env()
    (tmp_path / "s.sh").write_text("#!/bin/bash\n#SBATCH --output=/dev/null\nsleep 300\n")
    job = commands.sbatch_parsable("s.sh", cwd=tmp_path, env=env)
    try:
        with pytest.raises(SlurmError) as info:
            commands.wait(job, timeout=0.5, poll=0.2, env=env)
        assert f"scancel {job}" in info.value.hint
        assert not commands.job_info(job, env=env).finished
    finally:
        commands.cancel(job, env=env)


def test_cluster_name(slurm_cluster):
    assert commands.cluster_name(env=slurm_cluster.env()) == "scaletrain-ci"


def test_probe_cli_writes_a_loadable_profile(slurm_cluster, tmp_path):
    from scaletrain.clusters.profile import load_profile

    out = tmp_path / "ci.toml"
    proc = slurm_cluster.scaletrain("clusters", "probe", "--output", str(out), "--name", "ci")
    assert proc.returncode == 0, proc.stderr
    assert "2 node(s) with 2 x gpu, 8 CPUs" in proc.stderr
    prof = load_profile(str(out))
    assert (prof.name, prof.site) == ("ci", "scaletrain-ci")
    assert (prof.gpus_per_node, prof.cores_per_node, prof.gpu_request) == (2, 8, "gres")
    assert prof.mem_per_node_gb == pytest.approx(4000 / 1024, abs=0.05)
    assert list(prof.partitions) == ["debug", "long"]
    assert prof.default_partition.name == "debug"
    assert prof.partitions["debug"].max_time == "02:00:00"
    assert prof.partitions["long"].whole_node and prof.partitions["long"].max_nodes == 2


def test_probe_cli_stdout_and_partition_filter(slurm_cluster):
    proc = slurm_cluster.scaletrain("clusters", "probe", "--partition", "long")
    assert proc.returncode == 0, proc.stderr
    data = tomllib.loads(proc.stdout)
    assert list(data["partitions"]) == ["long"]
    assert data["name"] == "scaletrain-ci"
    bad = slurm_cluster.scaletrain("clusters", "probe", "--partition", "nope")
    assert bad.returncode == 2
    assert "unknown partition nope" in bad.stderr and "HINT: partitions here: debug, long" in bad.stderr


def test_probe_without_slurm_is_exit_4(slurm_cluster):
    proc = slurm_cluster.scaletrain("clusters", "probe", extra_env={"PATH": str(Path(sys.executable).parent)})
    assert proc.returncode == 4
    assert "scontrol" in proc.stderr and "HINT:" in proc.stderr
