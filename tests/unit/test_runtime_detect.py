"""Launcher detection from env dicts: every detector, the priority order, contradictions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scaletrain.errors import DistEnvError, UsageError
from scaletrain.runtime import detect as detect_mod
from scaletrain.runtime import device as device_mod
from scaletrain.contract.environ import port_from_job_id
from scaletrain.runtime.detect import (DETECTORS, LocalEnv, OpenMPIEnv, PMIEnv, SlurmEnv,
                                       TorchrunEnv, detect)


@pytest.fixture(autouse=True)
def _no_gpu_nodes(monkeypatch):
    """Detection must not depend on the test machine's /dev: pretend there are no GPUs."""
    monkeypatch.setattr(device_mod, "_probe_device_nodes", lambda: (0, "no GPU device nodes"))


TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "node0",
            "MASTER_PORT": "29611", "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}

SLURM = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5",
         "SLURM_LOCALID": "1", "SLURM_NTASKS": "7", "SLURM_NODEID": "2",
         "SLURM_JOB_NUM_NODES": "4", "SLURM_TASKS_PER_NODE": "2(x3),1",
         "SLURM_JOB_NODELIST": "nid[007-009,012]", "SLURM_CPUS_PER_TASK": "8"}

OMPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "OMPI_COMM_WORLD_NODE_RANK": "1", "MASTER_ADDR": "hostA"}

PMI = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2",
       "MASTER_ADDR": "hostB", "MASTER_PORT": "23456"}


# --- each detector -----------------------------------------------------------------------

def test_torchrun():
    env = detect(TORCHRUN)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert (env.master_addr, env.master_port) == ("node0", 29611)
    assert env.launcher == "torchrun" and env.job_id == "abc"
    assert (env.device, env.backend) == ("cpu", "gloo")
    assert not env.is_main and env.distributed


def test_torchrun_minimal_hand_made_env():
    env = detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": "1234"})
    assert (env.rank, env.local_rank, env.local_world_size, env.num_nodes) == (1, 1, 2, 1)


def test_slurm_srun_task():
    env = detect(SLURM)
    assert (env.rank, env.local_rank, env.world_size) == (5, 1, 7)
    assert (env.node_rank, env.num_nodes, env.local_world_size) == (2, 4, 2)
    assert env.master_addr == "nid007"  # first host of the list
    assert env.master_port == port_from_job_id("123456") == 10000 + 123456 % 20000
    assert env.launcher == "slurm" and env.job_id == "123456"
    assert env.extra["cpus_per_task"] == "8"


def test_slurm_last_node_has_fewer_tasks():
    env = detect({**SLURM, "SLURM_PROCID": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "3"})
    assert env.local_world_size == 1 and env.node_rank == 3


def test_slurm_step_values_win_over_job_values():
    # a 1-node step inside a 2-node job (values as real Slurm 22.05 sets them)
    env = detect({"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "1", "SLURM_PROCID": "1",
                  "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": "2",
                  "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_NUM_NODES": "2",
                  "SLURM_STEP_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "2(x2)",
                  "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "n[1-2]",
                  "SLURM_STEP_NODELIST": "n2"})
    assert (env.world_size, env.num_nodes, env.local_world_size) == (2, 1, 2)
    assert env.master_addr == "n2"


def test_slurm_user_master_wins():
    env = detect({**SLURM, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "40000"})
    assert (env.master_addr, env.master_port) == ("10.0.0.5", 40000)


def test_slurm_batch_step_is_single_process():
    # sbatch exports SLURM_PROCID=0 and the job's NTASKS to the batch script, but no step id
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    batch.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0")
    env = detect(batch)
    assert (env.rank, env.world_size, env.launcher, env.job_id) == (0, 1, "local", "123456")
    assert env.extra["slurm_batch_step"] == "1" and env.extra["slurm_ntasks"] == "7"


def test_slurm_allocation_without_task_is_local():
    env = detect({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1"})  # salloc shell
    assert env.launcher == "local" and env.world_size == 1


def test_slurm_script_master_addr_wins_and_no_profile_is_read():
    """A generated JUWELS script exports MASTER_ADDR with the InfiniBand suffix; the runtime
    takes it as it is and never reads a cluster profile (an unknown name changes nothing)."""
    env = detect({**SLURM, "SCALETRAIN_CLUSTER": "no-such-cluster", "MASTER_ADDR": "jwb0001i",
                  "SLURM_JOB_NODELIST": "jwb[0001-0004]"})
    assert env.master_addr == "jwb0001i"
    code = ("import sys, scaletrain.runtime.init, scaletrain.runtime.detect as d; "
            "d.detect({'SLURM_JOB_ID': '1', 'SLURM_STEP_ID': '0', 'SLURM_PROCID': '0', "
            "'SLURM_NTASKS': '1', 'SCALETRAIN_CLUSTER': 'lumi'}); "
            "print(sorted(m for m in sys.modules if m.startswith('scaletrain.clusters')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_openmpi():
    env = detect(OMPI)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (5, 1, 8, 4)
    assert (env.node_rank, env.num_nodes, env.launcher) == (1, 2, "openmpi")
    assert env.master_addr == "hostA"


def test_openmpi_single_node_needs_no_master():
    env = detect({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                  "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                  "OMPI_MCA_ess_base_jobid": "77"})
    assert env.master_addr == "127.0.0.1" and env.master_port == port_from_job_id("77")


def test_openmpi_multi_node_without_master_addr_is_an_error():
    bad = {k: v for k, v in OMPI.items() if k != "MASTER_ADDR"}
    with pytest.raises(DistEnvError, match="MASTER_ADDR") as info:
        detect(bad)
    assert "mpirun -x MASTER_ADDR" in info.value.hint


def test_mpirun_inside_slurm_task_is_openmpi():
    # mpirun starts its daemons with one srun task per node; ranks inherit that task's vars
    env = detect({**SLURM, "SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
                  "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "1(x4)",
                  **{k: v for k, v in OMPI.items() if k != "MASTER_ADDR"}})
    assert env.launcher == "openmpi" and env.world_size == 8 and env.rank == 5
    assert env.master_addr == "nid007"


def test_pmi():
    env = detect(PMI)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (2, 0, 4, 2)
    assert (env.node_rank, env.num_nodes, env.launcher) == (1, 2, "pmi")
    assert (env.master_addr, env.master_port) == ("hostB", 23456)


def test_pmix_rank_without_size_is_an_error():
    with pytest.raises(DistEnvError, match="PMIX_RANK=1"):
        detect({"PMIX_RANK": "1"})


def test_local():
    env = detect({})
    assert (env.rank, env.world_size, env.launcher, env.device, env.backend) == \
        (0, 1, "local", "cpu", "gloo")
    assert env.is_main and not env.distributed


# --- priority ----------------------------------------------------------------------------

def test_fixed_priority_order():
    assert DETECTORS == (TorchrunEnv, SlurmEnv, OpenMPIEnv, PMIEnv, LocalEnv)


def test_torchrun_inside_slurm_wins():
    env = detect({**SLURM, **TORCHRUN})
    assert env.launcher == "torchrun" and env.rank == 3 and env.world_size == 4


def test_slurm_wins_over_pmi_when_consistent():
    # srun --mpi=pmi2 sets PMI_* that agree with Slurm's own variables
    env = detect({**SLURM, "PMI_RANK": "5", "PMI_SIZE": "7"})
    assert env.launcher == "slurm"


def test_openmpi_wins_over_pmi():
    assert detect({**PMI, **OMPI}).launcher == "openmpi"


# --- devices from variables (no torch) ----------------------------------------------------

def test_device_from_visible_gpus():
    env = detect({**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert (env.device, env.backend) == ("cuda:1", "nccl")


def test_device_one_gpu_per_task():
    env = detect({**SLURM, "CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_ON_NODE": "2"})
    assert env.device == "cuda:0"


def test_device_cpu_forced():
    env = detect({**TORCHRUN, "CUDA_VISIBLE_DEVICES": "0,1", "SCALETRAIN_DEVICE": "cpu"})
    assert (env.device, env.backend) == ("cpu", "gloo")


def test_device_empty_visible_list_is_cpu():
    assert detect({"CUDA_VISIBLE_DEVICES": ""}).device == "cpu"
    assert detect({"CUDA_VISIBLE_DEVICES": "-1"}).device == "cpu"


def test_rocm_visible_devices():
    env = detect({**TORCHRUN, "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert env.device == "cuda:1"


def test_more_local_ranks_than_gpus():
    with pytest.raises(DistEnvError) as info:
        detect({**TORCHRUN, "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8", "RANK": "3",
                "LOCAL_RANK": "3", "GROUP_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,1"})
    err = info.value
    assert err.message == "4 processes on this node but 2 GPUs visible (CUDA_VISIBLE_DEVICES=0,1)"
    assert "--ntasks-per-node=2" in err.hint


def test_bad_scaletrain_device():
    with pytest.raises(UsageError, match="SCALETRAIN_DEVICE"):
        detect({"SCALETRAIN_DEVICE": "tpu"})


# --- contradictions: one line, variables named, a hint ------------------------------------

CONTRADICTIONS = [
    ({**TORCHRUN, "RANK": "4"}, "RANK=4 is not below WORLD_SIZE=4"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"),
    ({**TORCHRUN, "RANK": "-1"}, "RANK='-1' must be >= 0"),
    ({**TORCHRUN, "WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be >= 1"),
    ({**TORCHRUN, "RANK": "two"}, "RANK='two' is not an integer"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE=8 exceeds WORLD_SIZE=4"),
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"RANK": "", "WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 but MASTER_ADDR is not set"),
    ({**TORCHRUN, "MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a TCP port"),
    ({**TORCHRUN, "MASTER_PORT": "x"}, "MASTER_PORT='x' is not an integer"),
    ({**SLURM, "SLURM_NTASKS": "8"}, "SLURM_NTASKS=8 but SLURM_TASKS_PER_NODE=2(x3),1 sums to 7"),
    ({**SLURM, "SLURM_PROCID": "7"}, "SLURM_PROCID=7 is not below SLURM_NTASKS=7"),
    ({**SLURM, "SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is not below SLURM_TASKS_PER_NODE[2]=2"),
    ({**SLURM, "SLURM_JOB_NUM_NODES": "3"},
     "SLURM_TASKS_PER_NODE=2(x3),1 lists 4 nodes but SLURM_JOB_NUM_NODES=3"),
    ({**SLURM, "SLURM_NODEID": "4", "SLURM_JOB_NUM_NODES": "4"}, "SLURM_NODEID=4 is not below 4"),
    ({**SLURM, "SLURM_TASKS_PER_NODE": "2(x"}, "SLURM_TASKS_PER_NODE='2(x' is not Slurm's"),
    ({**SLURM, "SLURM_JOB_NODELIST": "nid[007-"}, "bad host list 'nid[007-'"),
    ({**SLURM, "SLURM_PROCID": "-3"}, "SLURM_PROCID='-3' must be >= 0"),
    ({**OMPI, "OMPI_COMM_WORLD_RANK": "8"},
     "OMPI_COMM_WORLD_RANK=8 is not below OMPI_COMM_WORLD_SIZE=8"),
    ({**PMI, "MPI_LOCALRANKID": "2"}, "MPI_LOCALRANKID=2 is not below MPI_LOCALNRANKS=2"),
]


@pytest.mark.parametrize(("environ", "message"), CONTRADICTIONS,
                         ids=[m[:40] for _, m in CONTRADICTIONS])
def test_contradictions(environ, message):
    with pytest.raises(DistEnvError) as info:
        detect(environ)
    err = info.value
    assert err.message.startswith(message), err.message
    assert "\n" not in err.message and err.hint and err.exit_code == 3


# --- no side effects ----------------------------------------------------------------------

def test_port_range_avoids_ephemeral_ports():
    ports = {port_from_job_id(str(j)) for j in range(0, 200000, 7)}
    assert min(ports) >= 10000 and max(ports) < 32768
    assert len(ports) > 15000  # wide: two jobs rarely share one
    assert port_from_job_id("abc") == port_from_job_id("abc")


def test_detect_reads_os_environ_without_writing(clean_env):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    before = dict(os.environ)
    env = detect()
    assert env.launcher == "torchrun" and dict(os.environ) == before


def test_detect_imports_no_torch():
    code = ("import sys, scaletrain; e = scaletrain.detect({'RANK':'0','WORLD_SIZE':'1'}); "
            "e = scaletrain.detect(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_slurm_one_node_step_in_two_node_job_real_values():
    # `srun --nodes=1 --ntasks=2 -w n2` in a 2-node job, variables as Slurm 22.05 set them
    env = detect({"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "1", "SLURM_PROCID": "1",
                  "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": "2",
                  "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
                  "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "n[1-2]",
                  "SLURM_STEP_NODELIST": "n2"})
    assert (env.rank, env.world_size, env.num_nodes, env.master_addr) == (1, 2, 1, "n2")
    older = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "1", "SLURM_PROCID": "0",
             "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "1",
             "SLURM_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    assert detect(older).num_nodes == 1  # no STEP_NUM_NODES: SLURM_NNODES is the step's


# --- torchrun variables beside Slurm's: a launcher inside a task, or a contradiction -----------

def test_hand_set_torchrun_variables_contradicting_slurm_fail_fast():
    """RANK/WORLD_SIZE that no launcher set (no torchrun agent, no LOCAL_RANK) and that
    disagree with the Slurm task would wait 30 minutes for a rank 0 that never starts."""
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999",
           "SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    with pytest.raises(DistEnvError) as info:
        detect(env)
    text = str(info.value)
    assert "RANK=1" in text and "SLURM_PROCID=0" in text and "\n" not in text
    assert "unset RANK" in info.value.hint
    with pytest.raises(DistEnvError, match="SLURM_NTASKS=2"):  # srun step, world disagrees
        detect({**env, "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
                "WORLD_SIZE": "4"})


def test_torchrun_inside_slurm_is_no_contradiction():
    # torchrun (one agent per node) in the batch step of a 1-task job: rank 1 of 2 is fine
    batch = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    workers = {**TORCHRUN, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
               "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}
    assert detect({**batch, **workers}).rank == 1
    # `srun torchrun`: SLURM_PROCID is the agent's task, the ranks are torchrun's
    assert detect({**SLURM, **TORCHRUN}).rank == 3
    # a launcher that sets LOCAL_RANK (DeepSpeed, torch.distributed.launch) inside a task
    assert detect({**batch, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                   "MASTER_ADDR": "n1"}).rank == 1
    # hand-exported from Slurm's own values (RANK=$SLURM_PROCID ...): they agree
    assert detect({**SLURM, "RANK": "5", "WORLD_SIZE": "7", "MASTER_ADDR": "n1"}).rank == 5
    # one process in a batch script of a 4-task job that names itself rank 0 of 1
    assert detect({**batch, "SLURM_NTASKS": "4", "RANK": "0", "WORLD_SIZE": "1"}).world_size == 1


@pytest.mark.parametrize("value", ["\u0665", "1\u0660", "\uff15", "\u0968"])
def test_unicode_digits_in_slurm_procid_are_refused(value):
    # issue 22: int() reads Arabic-Indic, full-width and Devanagari digits; Slurm never writes them
    with pytest.raises(DistEnvError, match="SLURM_PROCID"):
        detect({**SLURM, "SLURM_PROCID": value})
