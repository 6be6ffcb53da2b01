"""Framework configs from our names, written by the job: --accelerate-config NAME,
--deepspeed-config NAME, --launcher tensorflow.

The block of the script that writes a config is run here with bash (as the job would run it),
and what it wrote is read back by the framework's own reader where it installs (Accelerate's
config loader, DeepSpeed's config class), else parsed and checked field by field.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import deepspeed_attr, plan_for, render_for
from scaletrain.clusters.profile import load_profile
from scaletrain.errors import PlanError, UsageError
from scaletrain.lint import lint_text
from scaletrain.plan.render import exports, program_line, render_script
from scaletrain.plan.summary import notes

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")


plan, render = plan_for, render_for


def write_block(text: str) -> str:
    """The lines of the script that write the framework configs."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# framework configs"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("mv -f") and
               not any(ln.startswith("cat >") for ln in lines[i + 1:]))
    return "\n".join(lines[start:end + 1]) + "\n"


def run_block(text: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """Run the config-writing block as the job's batch shell would (strict mode, no nounset gaps)."""
    full = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", **env}
    return subprocess.run([BASH, "-c", "set -euo pipefail\n" + write_block(text)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=30)


def no_lint_findings(text: str, cluster: str) -> None:
    found = [f for f in lint_text(text, profile=load_profile(cluster)).findings if f.severity in ("error", "warning")]
    assert not found, [f"{f.rule}: {f.message}" for f in found]


# --------------------------------------------------------------------------- Accelerate

@pytest.mark.parametrize("name,kind,sharding,offload", [
    ("ddp", "MULTI_GPU", None, None), ("zero2", "FSDP", "SHARD_GRAD_OP", False),
    ("zero3", "FSDP", "FULL_SHARD", False), ("offload", "FSDP", "FULL_SHARD", True),
    ("hsdp", "FSDP", "HYBRID_SHARD", False)])
def test_accelerate_config_written_by_the_job_is_read_by_accelerate(tmp_path, name, kind, sharding, offload):
    text = render("roihu", nodes=2, launcher="accelerate", accelerate_config=name, precision="bf16")
    assert 'accelerate launch --config_file="$SCALETRAIN_ACCELERATE_CONFIG" --num_processes=8' in text
    assert "--multi_gpu" not in text
    r = run_block(text, tmp_path)
    assert r.returncode == 0, r.stderr
    path = tmp_path / ".scaletrain" / "job-77" / "accelerate.yaml"
    assert not list(path.parent.glob("*.tmp"))        # written whole, then renamed
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load(path.read_text())
    assert (data["distributed_type"], data["num_processes"], data["num_machines"]) == (kind, 8, 2)
    assert data["mixed_precision"] == "bf16"
    assert data.get("fsdp_config", {}).get("fsdp_sharding_strategy") == sharding
    assert data.get("fsdp_config", {}).get("fsdp_offload_params") == offload
    config_mod = pytest.importorskip("accelerate.commands.config.config_args")
    loaded = config_mod.load_config_from_file(str(path))
    assert str(loaded.distributed_type).endswith(kind) and loaded.num_processes == 8
    no_lint_findings(text, "roihu")


def test_accelerate_config_on_cpu_workers_starts_them_all(tmp_path):
    # MULTI_CPU would make accelerate launch start one process per machine: MULTI_GPU and
    # ACCELERATE_USE_CPU start them all on the CPU (the real 2-node run is in tests/slurm)
    p = plan("roihu", nodes=2, launcher="accelerate", accelerate_config="ddp", device="cpu")
    assert ("ACCELERATE_USE_CPU", "true") in exports(p)
    r = run_block(render_script(p), tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / ".scaletrain" / "job-77" / "accelerate.yaml").read_text()
    assert "distributed_type: 'MULTI_GPU'" in text and "use_cpu: true" in text
    with pytest.raises(UsageError, match="GPUs only"):
        plan("roihu", nodes=2, launcher="accelerate", accelerate_config="zero3", device="cpu")


def test_accelerate_user_file_is_passed_quoted_and_nothing_is_written():
    text = render("roihu", gpus=4, launcher="accelerate", accelerate_config="/p/my fsdp.yaml")
    assert "--config_file='/p/my fsdp.yaml'" in text and "# framework configs" not in text


@pytest.mark.parametrize("kw,match", [
    (dict(launcher="torchrun", accelerate_config="ddp"), "--launcher accelerate"),
    (dict(launcher="accelerate", accelerate_config="zero1"), "no equivalent of strategy 'zero1'"),
    (dict(launcher="accelerate", accelerate_config="ddp", precision="fp8"), "precision"),
    (dict(launcher="accelerate", deepspeed_config="zero3"), "Accelerate takes DeepSpeed settings"),
    (dict(launcher="deepspeed", micro_batch=8), "goes with --deepspeed-config"),
    (dict(launcher="deepspeed", deepspeed_config="zero4"), "no equivalent of strategy 'zero4'"),
])
def test_config_flags_refused_with_a_hint(kw, match):
    with pytest.raises(UsageError, match=match) as exc:
        plan("roihu", gpus=4, **kw)
    assert exc.value.hint


def test_accelerate_config_refused_on_the_local_profile():
    # the local profile runs the workers with scaletrain run, which never reads the config
    with pytest.raises(UsageError, match="needs a Slurm cluster"):
        plan("local", gpus=2, launcher="accelerate", accelerate_config="ddp", account=None)


# --------------------------------------------------------------------------- DeepSpeed

@pytest.mark.parametrize("name,stage,device", [
    ("zero1", 1, None), ("zero2", 2, None), ("zero3", 3, None), ("offload", 3, "cpu"), ("nvme", 3, "nvme")])
@pytest.mark.parametrize("launcher", ["deepspeed", "srun"])
def test_deepspeed_config_written_by_the_job(tmp_path, name, stage, device, launcher):
    text = render("roihu", nodes=2, launcher=launcher, deepspeed_config=name, micro_batch=16, precision="bf16",
                  script_args=("--lr", "0.1"))
    # the guides' form: the program gets --deepspeed --deepspeed_config FILE after its own arguments
    assert "train.py --lr 0.1 --deepspeed --deepspeed_config \"$SCALETRAIN_DEEPSPEED_CONFIG\"" in text
    scratch = tmp_path / "nvme disk"
    r = run_block(text, tmp_path, LOCAL_SCRATCH=str(scratch), TMPDIR=str(scratch))   # Roihu: $TMPDIR
    assert r.returncode == 0, r.stderr
    config = json.loads((tmp_path / ".scaletrain" / "job-77" / "ds_config.json").read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == stage and config["train_micro_batch_size_per_gpu"] == 16
    assert config["bf16"] == {"enabled": True}
    for part in ("offload_optimizer", "offload_param"):
        assert zero.get(part, {}).get("device") == device
    if device == "nvme":
        # the node-local disk is the job's own, filled in when the job runs
        assert zero["offload_param"]["nvme_path"] == f"{scratch}/deepspeed-nvme"
        assert "#SBATCH --gres=gpu:gh200:4\n" in text      # Roihu: $TMPDIR, nothing to request
    config_class = deepspeed_attr("deepspeed.runtime.config", "DeepSpeedConfig")
    if config_class is not None:   # DeepSpeed's own reader, where it installs (scripts/test.sh)
        parsed = config_class(config)
        assert parsed.zero_optimization_stage == stage and parsed.train_micro_batch_size_per_gpu == 16
    no_lint_findings(text, "roihu")


def test_nvme_offload_without_the_local_disk_stops_with_the_reason(tmp_path):
    text = render("narval", gpus=4, launcher="deepspeed", deepspeed_config="nvme", account="def-x")
    r = run_block(text, tmp_path)                       # no $SLURM_TMPDIR in this environment
    assert r.returncode == 3 and "SLURM_TMPDIR is not set" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / ".scaletrain" / "job-77" / "ds_config.json").exists()
    r = run_block(text, tmp_path, SLURM_TMPDIR=str(tmp_path / "local"))
    assert r.returncode == 0, r.stderr
    nvme = json.loads((tmp_path / ".scaletrain" / "job-77" / "ds_config.json").read_text())
    assert nvme["zero_optimization"]["offload_optimizer"]["nvme_path"] == f"{tmp_path}/local/deepspeed-nvme"


@pytest.mark.parametrize("cluster,why", [("lumi", "memory"), ("juwels-booster", "no node-local disk")])
def test_nvme_offload_refused_where_nodes_have_no_local_nvme(cluster, why):
    with pytest.raises(PlanError, match=why) as exc:
        plan(cluster, gpus=4, launcher="deepspeed", deepspeed_config="nvme")
    assert "offload" in exc.value.hint


def _nvme_cluster():
    """A cluster that sells node-local NVMe as a GRES (--gres=nvme:GB), as CSC's Puhti and Mahti did:
    Roihu's data with Puhti's disk rule, so the sizing is tested on a profile that plans."""
    import dataclasses

    return dataclasses.replace(load_profile("roihu"), name="nvme-gres", scratch_var="$LOCAL_SCRATCH",
                               scratch_gres="nvme", scratch_max_gb=3600.0)


def _nvme_plan(**kw):
    from scaletrain.plan.planner import make_plan
    from scaletrain.plan.request import JobRequest

    return make_plan(JobRequest(cluster="nvme-gres", script="train.py", account="p", **kw), _nvme_cluster())


def test_nvme_disk_grows_with_the_model_and_adds_to_staged_data():
    small = _nvme_plan(nodes=2, launcher="deepspeed", deepspeed_config="nvme")
    assert small.resources.disk_gb == 100
    big = _nvme_plan(nodes=2, launcher="deepspeed", deepspeed_config="nvme", params=70e9)
    assert big.resources.disk_gb == 613                         # 70e9 x 17.5 B / 2 nodes
    both = _nvme_plan(nodes=2, launcher="deepspeed", deepspeed_config="nvme", params=70e9,
                      stage_data="/scratch/data.tar", stage_data_gb=100.0)
    disk = both.resources.disk_gb
    assert disk == 613 + both.resources.stage.disk_gb and f"nvme:{disk}" in render_script(both)
    with pytest.raises(PlanError, match="more than nvme-gres's 3600 GB"):
        _nvme_plan(nodes=1, gpus_per_node=4, launcher="deepspeed", deepspeed_config="nvme", params=400e9)
    # Roihu itself: $TMPDIR needs no request, so no disk line at all
    assert plan("roihu", nodes=2, launcher="deepspeed", deepspeed_config="nvme").resources.disk_gb is None


def test_deepspeed_user_file_and_programs_that_name_their_own_option():
    own = render("roihu", gpus=4, launcher="deepspeed", deepspeed_config="/p/my ds.json")
    assert "train.py --deepspeed --deepspeed_config '/p/my ds.json'" in own
    assert "export SCALETRAIN_DEEPSPEED_CONFIG='/p/my ds.json'" in own and "# framework configs" not in own
    # an HF Trainer program takes --deepspeed FILE: nothing is added, the path is in the variable
    p = plan("roihu", gpus=4, launcher="deepspeed", deepspeed_config="zero2", expand_args=True,
             script_args=("--deepspeed", "$SCALETRAIN_DEEPSPEED_CONFIG"))
    assert program_line(p) == '"train.py" "--deepspeed" "$SCALETRAIN_DEEPSPEED_CONFIG"'
    assert any("adds none" in n for n in notes(p))


def test_lightning_gets_the_config_through_its_own_variable(tmp_path):
    p = plan("roihu", gpus=4, launcher="lightning", deepspeed_config="offload")
    text = render_script(p)
    assert 'export PL_DEEPSPEED_CONFIG_PATH="$SCALETRAIN_DEEPSPEED_CONFIG"' in text
    r = run_block(text, tmp_path)
    config = json.loads((tmp_path / ".scaletrain" / "job-77" / "ds_config.json").read_text())
    # Lightning fills the micro-batch from the program's DataLoader when the config has none
    assert r.returncode == 0 and "train_micro_batch_size_per_gpu" not in config


def test_submit_puts_the_configs_in_its_run_folder(tmp_path):
    p = plan("roihu", gpus=4, launcher="deepspeed", deepspeed_config="zero3", files_dir=str(tmp_path / "run x"))
    text = render_script(p)
    assert f"export SCALETRAIN_JOB_FILES='{tmp_path}/run x'" in text
    assert run_block(text, tmp_path).returncode == 0
    assert (tmp_path / "run x" / "ds_config.json").is_file()


# --------------------------------------------------------------------------- TensorFlow

def test_tensorflow_launcher_is_one_worker_per_node():
    p = plan("roihu", nodes=2, launcher="tensorflow")
    assert (p.resources.tasks_per_node, p.resources.procs_per_node, p.resources.world_size) == (1, 1, 2)
    assert p.resources.threads_per_proc == p.resources.cpus_per_task         # the one worker gets the node's cores
    text = render_script(p)
    # TF_CONFIG from bash and scontrol in each task: the job's Python (the centre's TensorFlow
    # module) needs nothing of scaletrain, and the script does not ask for it
    from scaletrain.frameworks.tensorflow import TASK_SHELL

    inner = TASK_SHELL + '; exec python3 -u "$@"'
    assert f"bash -c {shlex.quote(inner)} bash train.py" in text
    assert "import scaletrain" not in text and "scaletrain.frameworks" not in text
    no_lint_findings(text, "roihu")
    # CSC's TensorFlow module (python-tensorflow on Roihu), not its PyTorch one; on LUMI CSC's
    # tensorflow/2.16 module instead of the PyTorch-only AI Factory image
    assert "module load python-tensorflow" in text and "module load python-pytorch" not in text
    lumi = render("lumi", nodes=2, launcher="tensorflow")
    assert "module load tensorflow/2.16" in lumi and "singularity" not in lumi
    assert "TF_CONFIG" in render("lumi", nodes=2, launcher="tensorflow", container="/img/tf.sif")
    with pytest.raises(UsageError, match="TF_CONFIG from a Slurm allocation"):
        plan("local", gpus=2, launcher="tensorflow", account=None)
    with pytest.raises(UsageError, match="--requeue cannot work"):
        plan("lumi", nodes=2, launcher="tensorflow", requeue=True)


def test_every_cluster_and_config_renders_valid_bash():
    for cluster in ("roihu", "jupiter", "lumi", "narval", "juwels-booster"):
        kw = {"account": "def-x"} if cluster == "narval" else {}
        for extra in (dict(launcher="accelerate", accelerate_config="zero3"),
                      dict(launcher="deepspeed", deepspeed_config="offload"),
                      dict(launcher="scaletrain", deepspeed_config="zero2", requeue=True),
                      dict(launcher="tensorflow")):
            if extra["launcher"] in load_profile(cluster).missing_launchers:
                continue   # LUMI has no TensorFlow: refused (tests/unit/test_live_profiles.py)
            text = render(cluster, nodes=2, **kw, **extra)
            r = subprocess.run([BASH, "-n"], input=text, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, (cluster, extra, r.stderr)
            no_lint_findings(text, cluster)


def test_accelerate_config_names_say_fsdp_and_the_old_names_still_work():
    from scaletrain.frameworks.accelerate import accelerate_config

    new = accelerate_config("fsdp-full-shard", num_processes=8)
    assert new == accelerate_config("zero3", num_processes=8)       # the old name: an alias
    assert new["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert accelerate_config("fsdp-shard-grad-op")["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    p = plan("roihu", nodes=2, launcher="accelerate", accelerate_config="zero3")
    assert any("older name of fsdp-full-shard: PyTorch FSDP through Accelerate, not DeepSpeed ZeRO" in n
               for n in notes(p))
    assert not any("older name" in n for n in notes(plan("roihu", nodes=2, launcher="accelerate",
                                                          accelerate_config="fsdp-full-shard")))
