"""An emulated srun job looks like a GPU job, and a worker that misses a launcher's variable
is told which launcher sets it (issue 29 item 10)."""

from __future__ import annotations

import pytest

from scaletrain.launch.inproc.emulate import Place, slurm_vars
from scaletrain.launch.failure import FailedRank, missing_variable_hint, worker_failed_error
from scaletrain.launch.spec import RunRequest, plan_launch


def test_an_emulated_gpu_job_has_srun_gpu_variables():
    v = slurm_vars(Place(rank=3, world=4, nodes=2, cpus_per_task=2, gpus_per_node=2))
    assert (v["SLURM_GPUS_ON_NODE"], v["SLURM_GPUS_PER_NODE"], v["SLURM_STEP_GPUS"]) == \
        ("2", "2", "0,1")
    assert (v["SLURM_CPUS_PER_TASK"], v["SLURM_JOB_CPUS_PER_NODE"], v["SLURM_GTIDS"]) == \
        ("2", "4(x2)", "2,3")
    cpu_job = slurm_vars(Place(rank=0, world=2))
    assert "SLURM_GPUS_ON_NODE" not in cpu_job and "SLURM_GPUS_PER_NODE" not in cpu_job


@pytest.mark.parametrize("cpu,gpus,want", [(True, 0, "2"), (False, 0, "0"), (False, 4, "2")])
def test_the_plan_gives_one_gpu_per_emulated_task(tmp_path, cpu, gpus, want):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    plan = plan_launch(RunRequest(target=str(script), nproc_per_node=2, nnodes=2,
                                  emulate="slurm", cpu=cpu), environ={}, gpus=gpus, cores=8)
    assert plan.worker_env["SCALETRAIN_EMULATE_GPUS"] == want


def _tail(name: str) -> tuple[str, ...]:
    return ("Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
            f"    gpus = int(os.environ[{name!r}])", f"KeyError: {name!r}")


@pytest.mark.parametrize("name,emulate,said", [
    ("SLURM_GPUS_PER_TASK", "slurm", "srun sets it only when the job asks for it; export "
                                     "SLURM_GPUS_PER_TASK=VALUE"),
    ("SLURM_PROCID", None, "run it with 'scaletrain run --emulate slurm'"),
    ("OMPI_COMM_WORLD_RANK", None, "Open MPI's mpirun sets and this run did not: run it with "
                                   "'scaletrain run --emulate mpi'"),
    ("PMI_RANK", None, "an MPI launcher (mpirun, mpiexec) sets"),
    ("LOCAL_RANK", "slurm", "--emulate slurm gives the program that launcher's view"),
])
def test_a_missing_launcher_variable_is_named(name, emulate, said):
    hint = missing_variable_hint(_tail(name), emulate)
    assert hint is not None and hint.startswith(f"the program reads {name}, which "), hint
    assert said in hint


@pytest.mark.parametrize("tail,emulate", [
    (_tail("LOCAL_RANK"), None),          # scaletrain run sets it: not a launcher's gap
    (_tail("MY_DATA_DIR"), "slurm"),      # the program's own setting
    (("KeyError: 'learning_rate'",), None),  # a dict key, not a variable
    (("ValueError: bad",), "slurm"),
])
def test_other_failures_keep_the_plain_hint(tail, emulate):
    assert missing_variable_hint(tail, emulate) is None


def test_the_worker_error_carries_the_named_variable():
    failed = [FailedRank(rank=0, local_rank=0, pid=7, exitcode=1,
                         stderr_tail=_tail("SLURM_GPUS_ON_NODE"))]
    error = worker_failed_error(failed, emulate=None)
    assert "reads SLURM_GPUS_ON_NODE, which srun sets" in error.hint
    plain = worker_failed_error([FailedRank(rank=0, local_rank=0, pid=7, exitcode=1,
                                            stderr_tail=("ValueError: bad",))])
    assert plain.hint == "the lines above are that rank's stderr; fix the error and run again"


def test_a_rendezvous_at_the_programs_own_port_hosts_its_own_store():
    """Issue 29 item 11: a process mp.spawn started inherits TORCHELASTIC_USE_AGENT_STORE."""
    from scaletrain.launch.inproc.rendezvous import AGENT_PORT_VAR, own_store, remember_agent_store

    worker = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_PORT": "41000"}
    remember_agent_store(worker)
    child = {**worker, "MASTER_PORT": "12355"}  # the program set its own, then spawned
    remember_agent_store(child)
    assert child[AGENT_PORT_VAR] == "41000"  # the agent's, not the program's
    own_store("41000", child)
    assert child["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the agent's store: join it
    own_store("12355", child)
    assert child["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts its own
    emulated = {"TORCHELASTIC_USE_AGENT_STORE": "False", "MASTER_PORT": "41000"}
    remember_agent_store(emulated)
    assert AGENT_PORT_VAR not in emulated


def test_a_rendezvous_of_one_process_is_bounded_too():
    """The bound applies at world size 1: a lone rank waiting on a store nobody hosts stops."""
    import subprocess
    import sys

    code = (
        "import sys, time, types\n"
        "from scaletrain.launch.inproc.rendezvous import patch_c10d\n"
        "c10d = types.ModuleType('c10d')\n"
        "c10d.init_process_group = lambda *a, **k: time.sleep(60)\n"
        "patch_c10d(c10d)\n"
        "c10d.init_process_group('gloo', rank=0, world_size=1)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "12355",
           "SCALETRAIN_RENDEZVOUS_TIMEOUT": "0.5"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert "the rendezvous at 127.0.0.1:12355 did not complete within 0.5 s (1 processes " \
           "expected)" in proc.stderr


def test_lone_workers_that_stepped_and_crashed_are_named(tmp_path):
    """Issue 29 item 12: no group, optimizer steps, then a crash: the note shows."""
    import json

    from scaletrain.launch import group_check
    from scaletrain.launch.inproc import group_record

    for rank in ("0", "1"):
        (tmp_path / f"step-rank{rank}-pid1.json").write_text(json.dumps({"rank": rank}))
    text = group_check.verdict(group_record.read_records(tmp_path), expected_world=2,
                               local_ranks=["0", "1"], crashed=True)
    assert text is not None and text.startswith(
        "the 2 workers did not form one process group before they failed (2 of 2 never "
        "started torch.distributed, 2 of them took optimizer steps)"), text
    (tmp_path / "step-rank0-pid1.json").unlink()
    (tmp_path / "step-rank1-pid1.json").unlink()
    assert group_check.verdict(group_record.read_records(tmp_path), expected_world=2,
                               local_ranks=["0", "1"], crashed=True) is None


def test_the_first_optimizer_step_is_recorded_once(tmp_path, monkeypatch):
    import types

    from scaletrain.launch.inproc import group_record

    hooks: list = []

    class Handle:
        def __init__(self, fn):
            self.fn = fn

        def remove(self):
            hooks.remove(self.fn)

    def register(fn):
        hooks.append(fn)
        return Handle(fn)

    monkeypatch.setattr(group_record, "_STATE", {"folder": str(tmp_path), "rank": "1",
                                                 "world": None})
    group_record.patch_optimizer(types.SimpleNamespace(register_optimizer_step_post_hook=register))
    assert len(hooks) == 1
    hooks[0](None, (), {})
    assert hooks == []  # removed after the first step
    assert group_record.read_records(tmp_path).stepped == {"1"}
    group_record.patch_optimizer(types.SimpleNamespace())  # an old torch: nothing to hook


# -- SCALETRAIN_EMULATE in the launcher's own environment ---------------------------------------

@pytest.mark.parametrize("value", ["pbs", "SLURM", "slurm,mpi", "1"])
def test_an_unknown_emulation_in_the_environment_is_refused_naming_the_accepted_ones(
        capsys, monkeypatch, tmp_path, value):
    from helpers import run_cli

    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    monkeypatch.setenv("SCALETRAIN_EMULATE", value)
    code, out, err = run_cli(capsys, "run", "--nproc-per-node", "2", str(script))
    # before: every worker ran as rank 0 of a world of 1 and the run exited 0
    assert code == 2 and "ran" not in out + err
    lines = err.strip().splitlines()
    assert lines[0] == f"scaletrain: error: SCALETRAIN_EMULATE must be one of 'slurm', 'mpi', got {value!r}"
    assert len(lines) == 2 and lines[1].lstrip().startswith("HINT: ") and "Traceback" not in err


def test_a_known_emulation_in_the_environment_is_the_flags_and_a_contradiction_is_refused(tmp_path):
    from scaletrain.errors import UsageError

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    plan = plan_launch(RunRequest(target=str(script), nproc_per_node=2),
                       environ={"SCALETRAIN_EMULATE": "mpi"}, gpus=0, cores=8)
    assert plan.emulate == "mpi" and plan.worker_env["SCALETRAIN_EMULATE"] == "mpi"
    assert plan_launch(RunRequest(target=str(script), nproc_per_node=2),
                       environ={"SCALETRAIN_EMULATE": " "}, gpus=0, cores=8).emulate is None
    with pytest.raises(UsageError, match="--emulate slurm disagrees with SCALETRAIN_EMULATE=mpi"):
        plan_launch(RunRequest(target=str(script), nproc_per_node=2, emulate="slurm"),
                    environ={"SCALETRAIN_EMULATE": "mpi"}, gpus=0, cores=8)


def test_a_worker_given_an_unknown_emulation_keeps_its_rank(capsys):
    from scaletrain.launch.inproc import worker_shim

    env = {"SCALETRAIN_EMULATE": "pbs", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    worker_shim._emulate("slurm", dict(env))   # a known one still works
    with pytest.raises(ValueError, match="unknown emulation 'pbs'"):
        worker_shim._emulate("pbs", env)
    assert (env["RANK"], env["WORLD_SIZE"]) == ("1", "2")   # before: both removed
