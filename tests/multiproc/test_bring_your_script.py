"""Programs written for other launchers run unmodified under `scaletrain run` - and never
silently alone. Real worker processes (gloo on the CPU); each test is one launch."""

from __future__ import annotations

import importlib.util
import json
import socket

import pytest

from workers import REPO, run_workers

pytestmark = pytest.mark.multiproc
PROGS = REPO / "tests" / "multiproc" / "bring"
EXAMPLES = REPO / "examples" / "bring"
WARNING = "did not form one process group"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")


@pytest.mark.parametrize("nodes,extra", [(1, []), (2, ["--cpu"])], ids=["2-tasks", "2x2-cuda-form"])
def test_srun_program_runs_under_emulated_slurm(tmp_path, nodes, extra):
    out = tmp_path / "out.json"
    world = 2 * nodes
    prog_args = ["--init_method", f"tcp://127.0.0.1:{_port()}", "--world_size", str(world),
                 "--out", str(out)] + (["--cuda"] if extra else [])
    proc = run_workers(EXAMPLES / "srun_ddp.py", nproc=2, args=prog_args,
                       launcher_args=["--emulate", "slurm", "--nnodes", str(nodes), *extra])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["world"] == world and result["params_equal"]
    ranks = sorted(r["rank"] for r in result["ranks"])
    assert ranks == list(range(world))
    for r in result["ranks"]:
        env = r["env"]
        assert env["SLURM_PROCID"] == str(r["rank"]) and env["SLURM_NTASKS"] == str(world)
        assert int(env["SLURM_NODEID"]) == r["rank"] // 2 and env["SLURM_NNODES"] == str(nodes)
        assert env["RANK"] is None and env["WORLD_SIZE"] is None  # srun does not set them
    assert WARNING not in proc.stderr


def test_mpi_program_sees_open_mpi_ranks(tmp_path):
    out = tmp_path / "views.json"
    proc = run_workers(PROGS / "mpi_init.py", nproc=2, args=[str(out)],
                       launcher_args=["--emulate", "mpi", "--nnodes", "2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    views = json.loads(out.read_text())
    got = [(v["launcher"], v["rank"], v["local_rank"], v["world"], v["node"], v["ompi"])
           for v in views]
    assert got == [("openmpi", r, r % 2, 4, r // 2, str(r)) for r in range(4)]


def test_cuda_program_trains_on_cpu_with_cpu_flag(tmp_path):
    out = tmp_path / "cuda.json"
    proc = run_workers(EXAMPLES / "cuda_ddp.py", nproc=2, args=[str(out)], launcher_args=["--cpu"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["world"] == 2 and result["backend"] == "gloo" and result["device"] == "cpu"
    assert result["params_equal"] and result["cuda_devices"] == 2
    assert "CPU smoke test" in proc.stderr and WARNING not in proc.stderr


SCALETRAIN_ON_GPUS = """
import json, sys
import torch
import scaletrain

env = scaletrain.init()            # on the GPU node: cuda:LOCAL_RANK and NCCL, as asked for here
t = torch.ones(1, device=env.device) * (env.rank + 1)
torch.distributed.all_reduce(t)
json.dump({"backend": env.backend, "device": str(env.device), "sum": float(t.item())},
          open(sys.argv[1] + f".{env.rank}", "w"))
scaletrain.shutdown()
"""


def test_a_scaletrain_program_runs_under_cpu_as_on_its_gpu_node(tmp_path):
    """scaletrain.init() under --cpu chooses what it would on the GPU node (cuda:i, NCCL), and the
    smoke test serves NCCL with gloo (it stopped at 'torch ... has no NCCL/RCCL support')."""
    program = tmp_path / "train.py"
    program.write_text(SCALETRAIN_ON_GPUS)
    out = tmp_path / "seen"
    proc = run_workers(program, nproc=2, args=[str(out)], launcher_args=["--cpu"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = [json.loads((tmp_path / f"seen.{r}").read_text()) for r in range(2)]
    assert [s["device"] for s in seen] == ["cuda:0", "cuda:1"] and {s["backend"] for s in seen} == {"nccl"}
    assert {s["sum"] for s in seen} == {3.0}


def test_cuda_program_without_cpu_flag_fails_with_our_hint(tmp_path):
    proc = run_workers(EXAMPLES / "cuda_ddp.py", nproc=2, args=[str(tmp_path / "x.json")])
    assert proc.returncode != 0
    assert "this program needs a CUDA GPU" in proc.stderr
    assert "scaletrain run --cpu" in proc.stderr


@pytest.mark.parametrize("mode,alone", [("skip", True), ("one", True), ("early", False)])
def test_workers_that_never_form_one_group_are_reported(mode, alone):
    proc = run_workers(PROGS / "alone.py", nproc=2, args=[mode])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (WARNING in proc.stderr) is alone, proc.stderr


@pytest.mark.parametrize("mode", ["one", "skip"])
def test_lone_workers_that_crash_are_still_reported(mode):
    """"skip": no group at all, but optimizer steps before the crash (issue 29 item 12)."""
    proc = run_workers(PROGS / "alone.py", nproc=2, args=[mode, "crash"])
    assert proc.returncode == 1
    assert "did not form one process group before they failed" in proc.stderr, proc.stderr
    assert "failed after training alone" in proc.stderr  # the failure report stays


def test_workers_that_crash_before_training_are_not_called_alone():
    proc = run_workers(PROGS / "alone.py", nproc=2, args=["skip", "crash-first"])
    assert proc.returncode == 1
    assert "failed before training" in proc.stderr
    assert WARNING not in proc.stderr, proc.stderr


def test_the_warning_under_cpu_does_not_suggest_cpu():
    proc = run_workers(PROGS / "alone.py", nproc=2, args=["one"], launcher_args=["--cpu"])
    assert proc.returncode == 0, proc.stderr
    assert WARNING in proc.stderr
    hint = proc.stderr.split(WARNING, 1)[1]
    assert "--cpu" not in hint.split("(exit code 0 kept")[0], hint


def test_strict_turns_the_warning_into_a_failure():
    proc = run_workers(PROGS / "alone.py", nproc=2, args=["skip"], launcher_args=["--strict"])
    assert proc.returncode == 1
    assert WARNING in proc.stderr and "HINT:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("module,prog,setting,key,alone,hint", [
    ("accelerate", "accelerate_train.py", "plain", "num_processes", True, "Accelerator(cpu=True)"),
    ("accelerate", "accelerate_train.py", "cpu", "num_processes", False, None),
    ("lightning", "lightning_train.py", "untold", "world_size", True, "Trainer(devices="),
    ("lightning", "lightning_train.py", "told", "world_size", False, None),
], ids=["accelerate-no-cpu-setting", "accelerate-cpu", "lightning-untold", "lightning-told"])
def test_framework_programs(tmp_path, module, prog, setting, key, alone, hint):
    _needs(module)
    out = tmp_path / "out.json"
    proc = run_workers(EXAMPLES / prog, nproc=2, args=[setting, str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(out.read_text())[key] == (1 if alone else 2)  # what the framework says
    assert (WARNING in proc.stderr) is alone, proc.stderr
    if hint:
        assert hint in proc.stderr
    if module == "accelerate":  # the example says that it trained, and with how many processes
        # alone, each process takes all 8 batches itself; together they split them
        assert f"trained {8 if alone else 4} steps on {1 if alone else 2} process(es)" in proc.stdout, proc.stdout


@pytest.mark.built
def test_deepspeed_example_leaves_no_gloo_thread_that_ran_work_at_exit(tmp_path):
    """The abort at exit ('terminate called without an active exception') needs a gloo worker
    thread still releasing a finished collective while Python shuts down. The example destroys
    the group its collectives ran on before it returns: at exit only the default group's
    threads remain, and they never ran a collective (their switches are those after init)."""
    _needs("deepspeed")
    from scaletrain.frameworks.deepspeed import deepspeed_config, to_json

    config = tmp_path / "zero2.json"
    config.write_text(to_json(deepspeed_config("zero2", micro_batch_per_gpu=4)))
    threads = tmp_path / "threads"
    proc = run_workers(PROGS / "exit_threads.py", nproc=2, timeout=300,
                       args=[threads, EXAMPLES / "deepspeed_train.py", tmp_path / "ds.json",
                             "--deepspeed", "--deepspeed_config", config])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "ds.json").read_text())["world_size"] == 2
    for rank in (0, 1):
        seen = json.loads((threads / f"rank-{rank}.json").read_text())
        assert seen["after_init"], seen                   # the default group's workers
        assert seen["at_exit"] == seen["after_init"], seen  # no other group's, none that ran
