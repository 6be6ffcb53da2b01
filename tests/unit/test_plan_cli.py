"""``scaletrain plan`` on the command line: stdout/stderr split, --output, --json, --params,
the flags shared with submit, exit code 2 with one line + HINT, and no torch at start-up."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_cli

from scaletrain.cli.main import main
from scaletrain.cli.plan import add_plan_arguments, request_from_args


run = run_cli


def test_script_on_stdout_summary_on_stderr(capsys) -> None:
    rc, out, err = run(capsys, "plan", "--cluster", "roihu", "--gpus", "8", "--account", "project_1",
                       "--time", "02:00:00", "--", "train.py", "--lr", "0.1")
    assert rc == 0
    assert out.startswith("#!/bin/bash") and "#SBATCH" not in err
    assert "# command: scaletrain plan --cluster roihu --gpus 8 --account project_1 --time 02:00:00 " \
           "-- train.py --lr 0.1" in out
    assert "srun --kill-on-bad-exit=1 --cpu-bind=mask_cpu:0xffffffffffffffffff," in out   # one Grace CPU per GPU
    assert out.rstrip().endswith("python3 -u train.py --lr 0.1")
    assert "2 nodes x 4 GH200 = 8 GPUs, 8 processes" in err
    assert "per process: 1 GPU, 72 CPU cores; Slurm tasks: 4 per node x 72 CPUs" in err
    # 8 GPUs are more than gpumedium's 4 per job: gpularge, whose access condition the summary says
    assert "partition gpularge" in err and "16 GPU-hours" in err and "scalability test" in err
    # the summary names the unconfirmed facts this plan relied on
    assert "unconfirmed: gpu_cpu_map" in err and "scaletrain clusters check" in err


def test_output_file(capsys, tmp_path: Path) -> None:
    target = tmp_path / "jobs" / "job.sh"
    rc, out, err = run(capsys, "plan", "--cluster", "lumi", "--gpus", "4", "--account", "p",
                       "--output", str(target), "--", "t.py")
    assert rc == 0 and out == "" and f"wrote {target}" in err
    assert target.read_text().startswith("#!/bin/bash") and target.stat().st_mode & 0o111


def test_json(capsys) -> None:
    rc, out, _ = run(capsys, "plan", "--cluster", "roihu", "--gpus", "2", "--account", "p",
                     "--launcher", "accelerate", "--json", "--", "t.py", "x")
    data = json.loads(out)
    assert rc == 0 and data["partition"] == "gpumedium" and data["nodes"] == 1
    assert data["tasks_per_node"] == 1 and data["cpus_per_task"] == 144
    assert ["gres", "gpu:gh200:2"] in data["sbatch"] and data["script"].startswith("#!/bin/bash")
    # CSC's PyTorch page names Roihu's module ("7.4.2026 PyTorch is now available on Roihu-GPU"): not unconfirmed
    assert [u["fact"] for u in data["unconfirmed"]] == ["gpu_cpu_map"]
    assert data["unconfirmed"][0]["why"].startswith("cores 72*i .. 72*i+71 on the Grace CPU")
    assert data["launch"].startswith("srun --kill-on-bad-exit=1 accelerate launch")
    assert data["request"]["script_args"] == ["x"]


def test_params_memory_table(capsys) -> None:
    rc, out, err = run(capsys, "plan", "--cluster", "lumi", "--gpus", "16", "--account", "p",
                       "--params", "7e9", "--", "t.py")
    assert rc == 0
    lines = {ln.split()[0]: ln for ln in err.splitlines() if ln.startswith("  ") and ln.split()
             and ln.split()[0] in ("ddp", "zero1", "zero2", "zero3", "offload")}
    assert set(lines) == {"ddp", "zero1", "zero2", "zero3", "offload"}
    # 7e9 params x 16 bytes (Adam, mixed precision) = 104.3 GiB replicated; zero3 over 16 GPUs = 6.5 GiB
    assert "104.3 GiB" in lines["ddp"] and lines["ddp"].endswith("no")
    assert "6.5 GiB" in lines["zero3"] and lines["zero3"].endswith("yes")
    rc, out, _ = run(capsys, "plan", "--cluster", "lumi", "--gpus", "16", "--account", "p",
                     "--params", "7B", "--json", "--", "t.py")
    rows = {r["strategy"]: r for r in json.loads(out)["memory"]}
    assert rows["zero3"]["device_bytes"] < rows["zero2"]["device_bytes"] < rows["ddp"]["device_bytes"]
    assert rows["offload"]["device_bytes"] == 0 and rows["offload"]["host_bytes"] > 0


@pytest.mark.parametrize("argv,needle", [
    (["--cluster", "nowhere", "--gpus", "1", "--", "t.py"], "unknown cluster 'nowhere' (known: beluga"),
    (["--cluster", "roihu", "--gpus", "1", "--", "t.py"], "requires --account"),
    (["--cluster", "roihu", "--gpus", "1", "--nodes", "1", "--account", "p", "--", "t.py"], "not both"),
    (["--cluster", "roihu", "--account", "p", "--", "t.py"], "--gpus N or --nodes M"),
    (["--cluster", "roihu", "--gpus", "1", "--account", "p"], "no training script"),
    (["--gpus", "1", "--", "t.py"], "--cluster NAME is required"),
    (["--cluster", "roihu", "--gpus", "2", "--partition", "gpuinteractive", "--time", "1:00:00",
      "--account", "p", "--", "t.py"], "which allows at most 1"),
    (["--cluster", "puhti", "--gpus", "4", "--account", "p", "--", "t.py"],
     "puhti was retired on 2026-07-31 and runs no jobs; its successor is roihu"),
    (["--cluster", "roihu", "--gpus", "4", "--time", "9-00:00:00", "--account", "p", "--", "t.py"],
     "above every GPU partition's limit"),
    (["--cluster", "juwels-booster", "--gpus", "6", "--account", "p", "--", "t.py"], "not a multiple"),
    (["--cluster", "lumi", "--gpus", "8", "--partition", "big-g", "--account", "p", "--", "t.py"],
     "unknown partition 'big-g'"),
    (["--cluster", "roihu", "--gpus", "1", "--mem-per-gpu", "lots", "--account", "p", "--", "t.py"],
     "bad memory size"),
    (["--cluster", "roihu", "--gpus", "1", "--launcher", "magic", "--", "t.py"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line_and_hint(capsys, argv, needle) -> None:
    rc, out, err = run(capsys, "plan", *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("scaletrain: error: ") and lines[1].startswith("  HINT: ")
    assert needle in err and "Traceback" not in err


def test_account_from_environment(capsys, monkeypatch) -> None:
    monkeypatch.setenv("SBATCH_ACCOUNT", "project_env")
    rc, out, _ = run(capsys, "plan", "--cluster", "roihu", "--gpus", "1", "--", "t.py")
    assert rc == 0 and "#SBATCH --account=project_env" in out


def test_profile_file_flag(capsys, tmp_path: Path) -> None:
    from scaletrain.clusters.profile import _shipped_dir
    text = (_shipped_dir() / "roihu.toml").read_text().replace('name = "roihu"', 'name = "mysite"')
    f = tmp_path / "mysite.toml"
    f.write_text(text)
    rc, out, _ = run(capsys, "plan", "--profile", str(f), "--gpus", "2", "--account", "p", "--", "t.py")
    # the job's runtime must find this profile without a user clusters folder: by its path
    assert rc == 0 and f"export SCALETRAIN_CLUSTER={f}" in out and "for cluster mysite" in out


def test_stage_data_size_is_measured(capsys, tmp_path: Path) -> None:
    data = tmp_path / "d.tar"
    data.write_bytes(b"x" * 1024)
    rc, out, err = run(capsys, "plan", "--cluster", "roihu", "--gpus", "4", "--account", "p",
                       "--stage-data", str(data), "--", "t.py")
    assert rc == 0 and f"'{data}'" not in out and str(data) in out
    # the archive's own size decides: 200 GB (sparse) does not fit Roihu's 150 GiB of $TMPDIR
    with open(data, "r+b") as f:
        f.truncate(200 * 1024 ** 3)
    rc, out, err = run(capsys, "plan", "--cluster", "roihu", "--gpus", "4", "--account", "p",
                       "--stage-data", str(data), "--", "t.py")
    assert rc == 2 and "needs about 220 GB on each node, but $TMPDIR holds 150 GB on roihu" in err


def test_submit_gets_the_same_flags_and_request() -> None:
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    args = parser.parse_args(["--cluster", "lumi", "--nodes", "2", "--launcher", "torchrun",
                              "--mem-per-gpu", "32000M", "--params", "350M", "--requeue", "--account", "a",
                              "--", "train.py", "--", "--x"])
    req = request_from_args(args)
    assert (req.cluster, req.nodes, req.launcher, req.requeue, req.account) == ("lumi", 2, "torchrun", True, "a")
    assert req.mem_per_gpu_gb == 31.25 and req.params == 3.5e8
    assert req.script == "train.py" and req.script_args == ("--", "--x")


def test_flags_are_a_decision() -> None:
    parser = argparse.ArgumentParser()
    add_plan_arguments(parser)
    flags = sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--"))
    assert flags == sorted([
        "--help", "--cluster", "--profile", "--partition", "--account", "--gpus", "--nodes",
        "--gpus-per-node", "--time", "--cpus-per-gpu", "--mem-per-gpu", "--launcher", "--device",
        "--container", "--stage-data", "--requeue", "--job-name", "--params", "--output", "--json",
        # issue 8: sbatch options, software set-up, accelerate config, run-time expansion
        "--accelerate-config", "--expand-args",
        # issue 12: framework configs written from our names
        "--deepspeed-config", "--precision", "--micro-batch", "--mail-type", "--mail-user", "--array", "--constraint",
             "--dependency", "--reservation", "--qos", "--log", "--error", "--chdir", "--exclusive", "--sbatch",
             "--module", "--venv", "--conda", "--env", "--setup", "--gpus-per-proc", "--procs-per-gpu", "--cpus",
        "--sample-gpus",   # issue 18: a GPU sampler per node for the report
        "--mem"])   # --mem only refuses, pointing at --mem-per-gpu


def test_plan_and_clusters_run_without_torch() -> None:
    """plan and clusters never import torch (their start-up time is a benchmark's matter, not a
    test's: a timed bound here failed on a loaded machine and proved nothing on a quiet one)."""
    code = ("import sys; from scaletrain.cli.main import main; "
            "import io, contextlib; buf=io.StringIO(); e=io.StringIO()\n"
            "with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(e):\n"
            "    rc=main(['plan','--cluster','lumi','--gpus','16','--account','p','--params','7e9','--','t.py'])\n"
            "    rc2=main(['clusters'])\n"
            "print(rc, rc2, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0", "False"]


def test_rendered_scripts_pass_lint(capsys, tmp_path: Path) -> None:
    """Cross-check with 'scaletrain lint': no error on what plan writes (issue 3, point 7)."""
    pytest.importorskip("scaletrain.cli.lint")
    files = []
    for cluster, gpus in (("roihu", 8), ("roihu", 2), ("lumi", 16), ("narval", 4), ("juwels-booster", 8)):
        for launcher in ("scaletrain", "torchrun", "scaletrain-run", "srun", "accelerate", "deepspeed"):
            f = tmp_path / f"{cluster}-{launcher}.sh"
            requeue = ["--requeue"] if launcher in ("scaletrain", "scaletrain-run", "srun") else []
            assert main(["plan", "--cluster", cluster, "--gpus", str(gpus), "--launcher", launcher,
                         "--account", "p", *requeue, "--output", str(f), "--", "t.py", "$(id)"]) == 0
            files.append((cluster, f))
    capsys.readouterr()
    for cluster in {c for c, _ in files}:
        rc = main(["lint", "--cluster", cluster, *[str(f) for c, f in files if c == cluster]])
        out, err = capsys.readouterr()
        assert rc == 0, out + err
        assert " error " not in out


@pytest.mark.parametrize("flag,launcher,name", [("--deepspeed-config", "deepspeed", "ds_confg.json"),
                                                 ("--accelerate-config", "accelerate", "fsdp.yml")])
def test_a_config_file_that_is_not_there_is_refused_at_plan_time(capsys, tmp_path, monkeypatch, flag, launcher, name):
    """A typo in a config path surfaced only inside the job, after the queue wait."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "plan", "--cluster", "narval", "--gpus", "4", "--account", "def-x",
                       "--launcher", launcher, flag, name, "--", "train.py")
    assert rc == 2 and out == ""
    assert f"{flag} {name}: no such file ({tmp_path / name})" in err and "Traceback" not in err
    (tmp_path / name).write_text("{}\n")
    rc, out, err = run(capsys, "plan", "--cluster", "narval", "--gpus", "4", "--account", "def-x",
                       "--launcher", launcher, flag, name, "--", "train.py")
    assert rc == 0 and str(tmp_path / name) in out


def test_a_config_path_of_another_machine_is_left_for_the_job(capsys):
    rc, out, err = run(capsys, "plan", "--cluster", "narval", "--gpus", "4", "--account", "def-x",
                       "--launcher", "deepspeed", "--deepspeed-config", "/nonexistent-site/proj/ds.json",
                       "--", "train.py")
    assert rc == 0 and "/nonexistent-site/proj/ds.json" in out


def test_the_summary_speaks_of_memory_in_one_unit(capsys):
    """Narval's summary said '127488M memory' per process beside '--mem=498G'."""
    rc, out, err = run(capsys, "plan", "--cluster", "narval", "--gpus", "4", "--account", "def-x", "--", "t.py")
    assert rc == 0
    line = next(x for x in err.splitlines() if "per process:" in x)
    assert "124.5G memory" in line and "--mem=498G" in line and "M memory" not in line


def test_a_shipped_profiles_name_given_to_profile_names_the_flag_to_use(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no file of that name here
    code, out, err = run_cli(capsys, "plan", "--profile", "roihu", "--gpus", "4", "--account", "p", "--", "t.py")
    assert code == 2 and out == ""
    assert "--profile roihu: no such file" in err and "use --cluster roihu" in err
    (tmp_path / "roihu").write_text("not a profile")   # a file of that name is read as the file it is
    code, _, err = run_cli(capsys, "plan", "--profile", "roihu", "--gpus", "4", "--account", "p", "--", "t.py")
    assert code == 2 and "use --cluster roihu" not in err
