"""One bad and one corrected script per lint rule: the rule fires on the first, not the second.

``test_every_rule_has_a_case`` keeps this table complete as rules are added.
"""

from __future__ import annotations

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.lint.engine import lint_text
from scaletrain.lint.findings import RULES


def job(*sbatch: str, body: str = "srun python3 train.py", shebang: str = "#!/bin/bash") -> str:
    """A batch script: shebang, #SBATCH lines, a blank line, then ``body``."""
    head = [shebang] if shebang else []
    return "\n".join(head + [f"#SBATCH {s}" for s in sbatch] + ["", body, ""])


PUHTI = ("--account=project_1", "--partition=gpu", "--time=1:00:00")
MAHTI = ("--account=project_1", "--time=1:00:00")
LUMI = ("--account=project_1", "--partition=small-g", "--time=1:00:00")
FULL_PUHTI = PUHTI + ("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=40", "--mem=320G",
                      "--gres=gpu:v100:4")
TORCHRUN_2N = ("srun torchrun --nnodes=$SLURM_NNODES --nproc_per_node=4 --rdzv_id=$SLURM_JOB_ID "
               "--rdzv_backend=c10d --rdzv_endpoint={host}:29400 train.py")

BOOSTER_1TASK = ("--account=a", "--partition=booster", "--nodes=1", "--ntasks-per-node=1", "--gres=gpu:4",
                 "--time=1:00:00")
TORCHRUN_1N = "srun torchrun --standalone --nproc_per_node=4 x.py"

# rule id -> (cluster or None, bad script, good script, severity on the bad one)
CASES: dict[str, tuple[str | None, str, str, str]] = {
    "gpus-per-node": ("puhti", job(*PUHTI, "--gres=gpu:v100:8"), job(*PUHTI, "--gres=gpu:v100:4"), "error"),
    "gpu-syntax": ("puhti", job(*PUHTI, "--gres=gpu:a100:2"), job(*PUHTI, "--gres=gpu:v100:2"), "error"),
    "cluster-retired": ("puhti", job(*PUHTI, "--gres=gpu:v100:4"),
                        job("--account=p", "--partition=gpumedium", "--time=1:00:00", "--gres=gpu:gh200:4"),
                        "warning"),
    "partition-unknown": ("lumi", job("--account=p", "--partition=eap", "--time=1:00:00", "--gpus-per-node=2"),
                          job(*LUMI, "--gpus-per-node=2"), "warning"),
    "partition-limit": ("mahti", job(*MAHTI, "--partition=gpusmall", "--gres=gpu:a100:3"),
                        job(*MAHTI, "--partition=gpumedium", "--gres=gpu:a100:4"), "error"),
    "time-limit": ("puhti", job("--account=p", "--partition=gputest", "--time=1:00:00", "--gres=gpu:v100:1"),
                   job("--account=p", "--partition=gputest", "--time=00:15:00", "--gres=gpu:v100:1"), "error"),
    "cpu-limit": ("puhti", job(*PUHTI, "--ntasks-per-node=4", "--cpus-per-task=20", "--gres=gpu:v100:4"),
                  job(*PUHTI, "--ntasks-per-node=4", "--cpus-per-task=10", "--gres=gpu:v100:4"), "error"),
    "mem-limit": ("lumi", job(*LUMI, "--gpus-per-node=8", "--mem=500G"),
                  job(*LUMI, "--gpus-per-node=8", "--mem=480G"), "error"),
    # issue 8: the per-GPU share (same check as plan) and masks that must match --cpus-per-task
    "gpu-share": ("puhti", job(*PUHTI, "--ntasks-per-node=1", "--cpus-per-task=40", "--gres=gpu:v100:1"),
                  job(*PUHTI, "--ntasks-per-node=1", "--cpus-per-task=10", "--gres=gpu:v100:1"), "error"),
    "cpu-bind-mask": (None, job("--ntasks-per-node=2", "--cpus-per-task=2", "--gres=gpu:2", "--time=1:00:00",
                                body="srun --cpu-bind=mask_cpu:0x7,0x38 python3 x.py"),
                      job("--ntasks-per-node=2", "--cpus-per-task=2", "--gres=gpu:2", "--time=1:00:00",
                          body="srun --cpu-bind=mask_cpu:0x3,0xc python3 x.py"), "error"),
    "account-missing": ("mahti", job("--partition=gpusmall", "--time=1:00:00", "--gres=gpu:a100:1"),
                        job(*MAHTI, "--partition=gpusmall", "--gres=gpu:a100:1"), "warning"),
    "tasks-per-gpu": (None, job("--ntasks-per-node=8", "--gres=gpu:4", "--time=1:00:00"),
                      job("--ntasks-per-node=4", "--gres=gpu:4", "--time=1:00:00"), "error"),
    "torchrun-nproc": (None, job("--ntasks=1", "--gres=gpu:4", "--time=1:00:00",
                                 body="srun torchrun --standalone --nproc-per-node=8 train.py"),
                       job("--ntasks=1", "--gres=gpu:4", "--time=1:00:00",
                           body="srun torchrun --standalone --nproc-per-node=4 train.py"), "error"),
    "launcher-tasks": (None, job("--ntasks-per-node=4", "--gres=gpu:4", "--time=1:00:00",
                                 body="srun deepspeed train.py --deepspeed"),
                       job("--ntasks-per-node=1", "--gres=gpu:4", "--time=1:00:00",
                           body="srun deepspeed train.py --deepspeed"), "error"),
    "no-srun": (None, job("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4", "--time=1:00:00",
                          body="torchrun --nnodes=2 --nproc_per_node=4 train.py"),
                job("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4", "--time=1:00:00",
                    body=TORCHRUN_2N.format(host="$(hostname)")), "error"),
    "torchrun-standalone": (None, job("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4", "--time=1:00:00",
                                      body="srun torchrun --standalone --nnodes=2 --nproc_per_node=4 x.py"),
                            job("--nodes=1", "--ntasks-per-node=1", "--gres=gpu:4", "--time=1:00:00",
                                body="srun torchrun --standalone --nnodes=1 --nproc_per_node=4 x.py"), "error"),
    "rendezvous-localhost": (None, job(*FULL_PUHTI, body=TORCHRUN_2N.format(host="127.0.0.1")),
                             job(*FULL_PUHTI, body=TORCHRUN_2N.format(host="$RDZV_HOST")), "error"),
    "launcher-nodes": (None, job(*FULL_PUHTI, body=TORCHRUN_2N.format(host="$H").replace("$SLURM_NNODES", "1")),
                       job(*FULL_PUHTI, body=TORCHRUN_2N.format(host="$H").replace("$SLURM_NNODES", "2")), "error"),
    "node-rank-missing": (None, job(*FULL_PUHTI, body="srun torchrun --nnodes=2 --nproc_per_node=4 "
                                                      "--master_addr=$MA --master_port=$MP x.py"),
                          job(*FULL_PUHTI, body="srun bash -c 'torchrun --nnodes=2 --nproc_per_node=4 "
                                                "--node_rank=$SLURM_NODEID --master_addr=$MA --master_port=$MP x.py'"),
                          "error"),
    "accelerate-nproc": (None, job(*FULL_PUHTI, body="srun bash -c 'accelerate launch --num_processes=16 "
                                                     "--num_machines=2 --machine_rank=$SLURM_NODEID x.py'"),
                         job(*FULL_PUHTI, body="srun bash -c 'accelerate launch --num_processes=8 "
                                               "--num_machines=2 --machine_rank=$SLURM_NODEID x.py'"), "error"),
    "early-expansion": (None, job(*FULL_PUHTI, body='srun bash -c "torchrun --node_rank=$SLURM_NODEID x.py"'),
                        job(*FULL_PUHTI, body='srun bash -c "torchrun --node_rank=\\$SLURM_NODEID x.py"'), "error"),
    "single-quoted-var": (None, job("--time=1:00:00", body="srun python train.py --out 'ckpt/$SLURM_JOB_ID'"),
                          job("--time=1:00:00", body='srun python train.py --out "ckpt/$SLURM_JOB_ID"'), "error"),
    # a profile that says the nodes are shared: without one lint cannot tell (issue 17, JSC dc-gpu)
    "master-port": ("narval", job("--account=def-x", "--time=1:00:00", "--gres=gpu:a100:1",
                                  body="export MASTER_PORT=29500\nsrun python x.py"),
                    job("--account=def-x", "--time=1:00:00", "--gres=gpu:a100:1",
                        body="export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))\nsrun python x.py"), "warning"),
    "sbatch-after-command": (None, job("--time=1:00:00", body="module load pytorch\n#SBATCH --mem=8G\nsrun python x.py"),
                             job("--time=1:00:00", "--mem=8G", body="module load pytorch\nsrun python x.py"), "error"),
    "time-missing": (None, job("--ntasks=1"), job("--ntasks=1", "--time=10"), "warning"),
    "mem-conflict": (None, job("--time=1:00:00", "--mem=8G", "--mem-per-cpu=2G"),
                     job("--time=1:00:00", "--mem=8G"), "error"),
    "visible-devices": (None, job("--time=1:00:00", "--gres=gpu:2", body="export CUDA_VISIBLE_DEVICES=0,1,2,3\n"
                                                                        "srun python x.py"),
                        job("--time=1:00:00", "--gres=gpu:2", body="srun python x.py"), "error"),
    "merge-conflict": (None, job("--time=1:00:00", body="<<<<<<< HEAD\nsrun python a.py\n=======\n"
                                                         "srun python b.py\n>>>>>>> other"),
                       job("--time=1:00:00", body="srun python a.py"), "error"),
    "bash-syntax": (None, job("--time=1:00:00", body='if true; then\n  srun python x.py\n'),
                    job("--time=1:00:00", body='if true; then\n  srun python x.py\nfi'), "error"),
    "no-shebang": (None, job("--time=1:00:00", shebang=""), job("--time=1:00:00"), "warning"),
    "sbatch-option": (None, job("--time=1:00:00", "--ntask-per-node=4"), job("--time=1:00:00", "--ntasks-per-node=4"),
                      "warning"),
    "dos-line-endings": (None, job("--time=1:00:00").replace("\n", "\r\n"), job("--time=1:00:00"), "error"),
    "master-addr-suffix": ("juwels-booster",
                           job("--account=a", "--partition=booster", "--nodes=2", "--ntasks-per-node=4",
                               "--gres=gpu:4", "--cpus-per-task=24", "--time=1:00:00",
                               body="export MASTER_ADDR=$(scontrol show hostnames | head -n 1)\nsrun python x.py"),
                           job("--account=a", "--partition=booster", "--nodes=2", "--ntasks-per-node=4",
                               "--gres=gpu:4", "--cpus-per-task=24", "--time=1:00:00",
                               body='export MASTER_ADDR="$(scontrol show hostnames | head -n 1)i"\nsrun python x.py'),
                           "warning"),
    "partition-missing": ("mahti", job(*MAHTI, "--gres=gpu:a100:4"),
                          job(*MAHTI, "--partition=gpumedium", "--gres=gpu:a100:4"), "warning"),
    "placeholder": (None, job("--time=1:00:00", body="module load python/<select version>\nsrun python x.py <options>"),
                    job("--time=1:00:00", body="module load python/3.11\nsrun python x.py --lr 0.1"), "error"),
    "site-command": (None, job("--time=1:00:00", body="export MASTER_PORT=$(get_free_port)\nsrun python x.py"),
                     job("--time=1:00:00", body="get_free_port() { echo 29400; }\n"
                                                "export MASTER_PORT=$(get_free_port)\nsrun python x.py"), "warning"),
    "log-dir": (None, job("--time=1:00:00", "--output=logs/%x-%j.out", body="mkdir -p logs\nsrun python x.py"),
                job("--time=1:00:00", "--output=%x-%j.out", body="mkdir -p logs\nsrun python x.py"), "warning"),
    "ntasks-distribution": (None, job("--time=1:00:00", "--nodes=2", "--ntasks=8", "--gres=gpu:4"),
                            job("--time=1:00:00", "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4"), "warning"),
    "omp-threads": (None, job("--time=1:00:00", "--ntasks=1", "--cpus-per-task=32", "--gres=gpu:4",
                              body="export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK\n"
                                   "srun torchrun --standalone --nproc_per_node=4 x.py"),
                    job("--time=1:00:00", "--ntasks=1", "--cpus-per-task=32", "--gres=gpu:4",
                        body="export OMP_NUM_THREADS=$((SLURM_CPUS_PER_TASK / 4))\n"
                             "srun torchrun --standalone --nproc_per_node=4 x.py"), "warning"),
    "no-launch": (None, job("--time=1:00:00", body="module load pytorch\necho ready"),
                  job("--time=1:00:00", body="module load pytorch\nsrun python x.py"), "warning"),
    # issue 17 item 8 and 11, issue 22 item 7
    "bf16-unsupported": ("puhti", job(*PUHTI, "--gres=gpu:v100:4", "--ntasks-per-node=1",
                                      body="srun accelerate launch --mixed_precision=bf16 --num_processes=4 x.py"),
                         job(*PUHTI, "--gres=gpu:v100:4", "--ntasks-per-node=1",
                             body="srun accelerate launch --mixed_precision=fp16 --num_processes=4 x.py"), "warning"),
    "gpu-not-requested": ("puhti", job(*PUHTI, "--ntasks=1", body="srun python train.py"),
                          job(*PUHTI, "--ntasks=1", "--gres=gpu:v100:1", body="srun python train.py"), "warning"),
    "gpus-shared-by-tasks": (None, "", "", "warning"),   # needs a program file: test_gpus_shared_by_tasks
    "local-world-size": (None, job("--time=1:00:00", "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4",
                                   body="export LOCAL_WORLD_SIZE=$WORLD_SIZE\nsrun python x.py"),
                         job("--time=1:00:00", "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4",
                             body="export LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE\nsrun python x.py"), "error"),
    "subshell-exit": (None, job("--time=1:00:00", body='test -d data || (echo "no data"; exit 1)\nsrun python x.py'),
                      job("--time=1:00:00", body='test -d data || { echo "no data"; exit 1; }\nsrun python x.py'),
                      "error"),
    # issue 29 item 13, issue 36 item 3: only on a cluster whose profile says it runs Slurm 22.05-23.02
    # the one task lint's launcher-tasks fix leaves keeps one task's CPUs for all its workers
    "launcher-cpus": ("juwels-booster", job(*BOOSTER_1TASK, "--cpus-per-task=12", body=TORCHRUN_1N),
                      job(*BOOSTER_1TASK, "--cpus-per-task=96", body=TORCHRUN_1N), "warning"),
    "srun-cpus-per-task": (None, "", "", "warning"),   # needs a profile's Slurm release: test_lint_slurm_version
    "sbatch-unicode": (None, job("--time=1:00:00", "\u2014account=project_1"),
                       job("--time=1:00:00", "--account=project_1"), "error"),
    # a count, size or time sbatch cannot read (lint said nothing of --nodes=1e400)
    "sbatch-value": (None, job("--time=1:00:00", "--nodes=1e400"), job("--time=1:00:00", "--nodes=2"), "error"),
    # a line that looks like a directive but is not one
    "sbatch-typo": (None, "#!/bin/bash\n#SBATCH --time=1:00:00\n# SBATCH --mem=8G\n\nsrun python x.py\n",
                    "#!/bin/bash\n#SBATCH --time=1:00:00\n##SBATCH --mem=8G\n\nsrun python x.py\n", "warning"),
}


def _rules(text: str, cluster: str | None) -> dict[str, set[str]]:
    result = lint_text(text, profile=load_profile(cluster) if cluster else None)
    out: dict[str, set[str]] = {}
    for f in result.findings:
        out.setdefault(f.rule, set()).add(f.severity)
    return out


def test_every_rule_has_a_case() -> None:
    assert set(CASES) == set(RULES)


PROGRAM_RULES = {"gpus-shared-by-tasks",   # read the program beside the script: tested with files
                 "srun-cpus-per-task"}     # keyed by the profile's Slurm release: test_lint_slurm_version


@pytest.mark.parametrize("rule_id", sorted(set(CASES) - PROGRAM_RULES))
def test_rule_fires_on_bad_script(rule_id: str) -> None:
    cluster, bad, _good, severity = CASES[rule_id]
    assert severity in _rules(bad, cluster).get(rule_id, set()), bad


# the fix for a script on a retired system is the same job on its successor
GOOD_CLUSTER = {"cluster-retired": "roihu"}


@pytest.mark.parametrize("rule_id", sorted(set(CASES) - PROGRAM_RULES))
def test_rule_quiet_on_corrected_script(rule_id: str) -> None:
    cluster, _bad, good, _severity = CASES[rule_id]
    assert rule_id not in _rules(good, GOOD_CLUSTER.get(rule_id, cluster)), good


def test_fewer_torchrun_processes_than_gpus_is_a_warning() -> None:
    text = job("--ntasks=1", "--gres=gpu:4", "--time=1:00:00",
               body="srun torchrun --standalone --nproc_per_node=2 train.py")
    assert _rules(text, None)["torchrun-nproc"] == {"warning"}


def test_fewer_tasks_than_gpus_is_a_warning_and_mps_allows_more() -> None:
    assert _rules(job("--ntasks-per-node=2", "--gres=gpu:4", "--time=1"), None)["tasks-per-gpu"] == {"warning"}
    mps = job("--ntasks-per-node=8", "--gres=gpu:1", "--time=1",
              body="nvidia-cuda-mps-control -d\nsrun python x.py")
    assert "tasks-per-gpu" not in _rules(mps, None)


def test_cluster_rules_need_a_cluster() -> None:
    text = job("--partition=gpu", "--gres=gpu:a100:8", "--time=1")
    assert "gpu-syntax" not in _rules(text, None)
    assert {"gpu-syntax", "gpus-per-node"} <= set(_rules(text, "puhti"))


def test_bare_python_for_setup_next_to_srun_is_only_a_warning() -> None:
    text = job("--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", "--time=1",
               body="python prepare_data.py\nsrun python train.py")
    assert _rules(text, None)["no-srun"] == {"warning"}


def test_srun_step_options_override_the_job_tasks() -> None:
    text = job("--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4", "--time=1",
               body="srun --ntasks-per-node=1 deepspeed train.py")
    assert "launcher-tasks" not in _rules(text, None)


def test_single_quotes_for_an_inner_shell_are_correct() -> None:
    text = job(*FULL_PUHTI, body="srun bash -c 'torchrun --node_rank=$SLURM_NODEID --nnodes=2 "
                                 "--nproc_per_node=4 --rdzv_backend=c10d --rdzv_endpoint=$H:1 x.py'")
    rules = _rules(text, "puhti")
    assert "single-quoted-var" not in rules and "early-expansion" not in rules


def test_unknown_partition_downgrades_node_limits_to_warnings() -> None:
    text = job("--account=p", "--partition=eap", "--time=1", "--ntasks=1", "--cpus-per-task=128",
               "--gpus-per-task=8")
    assert _rules(text, "lumi")["cpu-limit"] == {"warning"}
    text = text.replace("eap", "small-g")
    assert _rules(text, "lumi")["cpu-limit"] == {"error"}


def test_sbatch_takes_unambiguous_abbreviations_and_the_tasks_per_node_alias() -> None:
    text = job("--time=1:00:00", "--ntasks-per-n=4", "--tasks-per-node=4", "--accou=p")
    assert "sbatch-option" not in _rules(text, None)
    assert "sbatch-option" in _rules(job("--time=1:00:00", "--mem-per=4G"), None)   # ambiguous


def test_site_wrapper_script_in_front_of_the_program() -> None:
    text = job("--ntasks-per-node=8", "--gpus-per-node=4", "--time=1", body="srun ./select_gpu python3 x.py")
    assert _rules(text, None)["tasks-per-gpu"] == {"error"}


def test_crlf_reported_once_at_first_line_and_rules_still_run() -> None:
    text = job("--time=1:00:00", "--mem=8G", "--mem-per-cpu=1G").replace("\n", "\r\n")
    result = lint_text(text)
    assert [(f.rule, f.line) for f in result.findings if f.rule == "dos-line-endings"] == [("dos-line-endings", 1)]
    assert "mem-conflict" in {f.rule for f in result.findings}


def test_unquoted_heredoc_to_srun_expands_early() -> None:
    bad = job(*FULL_PUHTI, body="srun bash <<EOF\npython x.py --rank $SLURM_PROCID\nEOF")
    good = job(*FULL_PUHTI, body="srun bash <<'EOF'\npython x.py --rank $SLURM_PROCID\nEOF")
    assert "early-expansion" in _rules(bad, None)
    assert "early-expansion" not in _rules(good, None)


def test_per_task_variable_outside_srun_is_fine() -> None:
    assert "early-expansion" not in _rules(job("--time=1", body='echo "r$SLURM_NODEID"\nsrun python x.py'), None)


def test_scaletrain_run_and_deepspeed_num_gpus_are_per_node_launchers() -> None:
    body = ("srun bash -c 'python3 -m scaletrain run --nnodes 2 --node-rank \"$SLURM_NODEID\" "
            "--nproc-per-node 8 train.py'")
    assert _rules(job(*FULL_PUHTI, body=body), "puhti")["torchrun-nproc"] == {"error"}
    assert "torchrun-nproc" not in _rules(job(*FULL_PUHTI, body=body.replace("8 train", "4 train")), "puhti")
    no_rank = body.replace('--node-rank \"$SLURM_NODEID\" ', "").replace("8 train", "4 train")
    assert "node-rank-missing" in _rules(job(*FULL_PUHTI, body=no_rank), "puhti")
    ds = ("srun bash -c 'deepspeed --hostfile=$H --no_ssh --node_rank=$SLURM_NODEID --num_nodes=2 "
          "--num_gpus=6 train.py'")
    assert _rules(job(*FULL_PUHTI, body=ds), "puhti")["torchrun-nproc"] == {"error"}


def test_gpu_type_on_a_cluster_whose_profile_names_none() -> None:
    ok = job(*LUMI, "--gpus-per-node=mi250:8")
    assert "gpu-syntax" not in _rules(ok, "lumi")
    # sbatch refuses a GRES type no node has: an error, not a warning
    assert _rules(job(*LUMI, "--gpus-per-node=a100:8"), "lumi")["gpu-syntax"] == {"error"}


def test_no_partition_on_alliance_is_routed_and_checked_against_it() -> None:
    text = job("--account=def-x", "--time=8-00:00:00", "--gres=gpu:1")
    rules = _rules(text, "narval")
    assert "partition-missing" not in rules and rules["time-limit"] == {"error"}   # 7 days max
    assert "partition-limit" not in _rules(job(*MAHTI, "--gres=gpu:a100:4"), "mahti")  # planner default unused


def test_gpu_syntax_message_agrees_with_its_hint() -> None:
    # it said "mahti does not take GPU requests in the form --gres" and then hinted --gres=gpu:a100:1
    result = lint_text(job(*MAHTI, "--partition=gpusmall", "--gres=gpu:1"), profile=load_profile("mahti"))
    (f,) = [f for f in result.findings if f.rule == "gpu-syntax"]
    assert "--gres=gpu:N (no GPU type)" in f.message and f.hint == "#SBATCH --gres=gpu:a100:1"


def test_plugin_options_and_far_spellings_get_no_wrong_suggestion() -> None:
    text = job("--time=1:00:00", "--image=docker:x/y:1", "--module=gpu", "--container-image=nvcr.io#x")
    assert "sbatch-option" not in _rules(text, None)
    (f,) = lint_text(job("--time=1:00:00", "--frobnicate=1")).findings
    assert f.rule == "sbatch-option" and "did you mean" not in f.hint


def test_placeholder_hides_the_bash_syntax_error_it_causes() -> None:
    found = _rules(job("--time=1:00:00", body="srun python x.py <options>\nsrun python y.py <more options>"), None)
    assert found.get("placeholder") == {"error"} and "bash-syntax" not in found
    assert "placeholder" not in _rules(job("--time=1:00:00", body="sort <in.txt >out.txt\nsrun python x.py"), None)
    heredoc = "python - <<'EOF'\nif i<n and j>0: pass\nEOF\necho \"<b>done</b>\"\nsrun python x.py"
    assert "placeholder" not in _rules(job("--time=1:00:00", body=heredoc), None)


def test_side_steps_beside_the_training_are_not_told_gpus_are_idle() -> None:
    text = job("--nodes=1", "--ntasks-per-node=1", "--gres=gpu:4", "--time=1:00:00",
               body="srun python prepare.py\nsrun torchrun --standalone --nproc_per_node=4 train.py")
    assert "tasks-per-gpu" not in _rules(text, None)


def test_visible_devices_subset_warns_full_list_is_quiet() -> None:
    subset = job("--time=1:00:00", "--gres=gpu:4", body="export CUDA_VISIBLE_DEVICES=0,1\nsrun python x.py")
    assert _rules(subset, None)["visible-devices"] == {"warning"}
    full = job("--time=1:00:00", "--gres=gpu:4", body="export CUDA_VISIBLE_DEVICES=0,1,2,3\nsrun python x.py")
    assert "visible-devices" not in _rules(full, None)


def test_multiprocessing_program_is_not_told_gpus_are_idle() -> None:
    text = job("--ntasks=1", "--gres=gpu:4", "--time=1:00:00",
               body="srun python main.py --multiprocessing-distributed --world-size 1 --rank 0")
    assert "tasks-per-gpu" not in _rules(text, None)
