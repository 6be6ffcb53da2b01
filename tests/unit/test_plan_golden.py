"""Golden tests: ``scaletrain plan`` reproduces every Slurm example of the seed documents.

The guides' job shapes are stored as data in golden_facts.py, so these tests run on a clone
without the guides; ``test_stored_facts_match_the_guides`` checks the data against our scripts in
the guides' shapes (tests/unit/guide_jobs, every clone) and against the guides themselves wherever
they are present (../shared/seeds).

Each seed script (000/001 CSC guide: Puhti, Mahti, LUMI; 003 Alliance; 004 JUWELS) is
extracted from the document, reduced to its *job shape* (nodes, tasks per node, GPUs per node,
CPUs per task, memory, partition family, time, and the launch structure), and compared with
the shape of the script ``plan`` renders for the equivalent request. The same parser reads
both scripts.

Where the rendered script legitimately differs, the CASE says so field by field, pinning both
values (seed, ours) and the reason - so a change on either side still fails. The reasons are:
001 is the older revision of 000 and "the newer one wins" (seeds README); 001's LUMI used the
retired ``eap`` partition with 8 cores per GPU; scaletrain's equivalent of a seed "no MPI"
program (one task per node that uses every GPU of the node) is the ``torchrun`` launch mode.
Seed blocks that are not a job scaletrain plans are listed in EXCLUDED with the reason.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.errors import PlanError
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import render_script
from scaletrain.plan.request import JobRequest, parse_mem_gb

from golden_facts import shape  # tests/unit is on sys.path (pytest's rootdir-relative import)
from lint_seed_blocks import guide_sources

_ALIASES = {"tasks-per-node": "ntasks-per-node", "N": "nodes", "n": "ntasks", "p": "partition",
            "A": "account", "c": "cpus-per-task", "t": "time", "G": "gpus"}


def seed_blocks(path: Path) -> list[str]:
    """Every code block of a seed that holds an ``#SBATCH`` line, in document order.

    Markdown fences (indented or in list items) and MediaWiki ``{{File|contents=...}}`` blocks.
    An unterminated fence (000 ends inside one) yields nothing.
    """
    text = path.read_text(encoding="utf-8")
    out: list[str] = []
    cur: list[str] | None = None
    for line in text.splitlines():
        s = line.strip()
        s = s[2:].strip() if s.startswith("- ") else s
        if s.startswith("```"):
            if cur is None:
                cur = []
            else:
                body = textwrap.dedent("\n".join(cur))
                if "#SBATCH" in body:
                    out.append(body)
                cur = None
            continue
        if cur is not None:
            cur.append(line)
    for m in re.finditer(r"\|contents=[ \t]*\n(.*?)\n\}\}", text, re.S):
        if "#SBATCH" in m.group(1):
            out.append(m.group(1))
    return out


def logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined."""
    out, buf = [], ""
    for raw in text.splitlines():
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        out.append(buf + raw)
        buf = ""
    if buf:
        out.append(buf)
    return out


def sbatch_options(text: str) -> dict[str, str]:
    """The #SBATCH options of a script (aliases normalised), last one wins."""
    opts: dict[str, str] = {}
    for line in logical_lines(text):
        s = line.strip()
        if not s.startswith("#SBATCH"):
            continue
        tokens = shlex.split(s[len("#SBATCH"):], comments=True)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.startswith("--"):
                key, eq, val = tok[2:].partition("=")
                if not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                    val, i = tokens[i + 1], i + 1
            elif tok.startswith("-"):
                key, val = tok[1:2], tok[2:]
                if not val and i + 1 < len(tokens):
                    val, i = tokens[i + 1], i + 1
            else:
                i += 1
                continue
            opts[_ALIASES.get(key, key)] = val
            i += 1
    return opts


def slurm_seconds(text: str) -> int:
    m = re.match(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$", text.strip())
    assert m, text
    d, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if d is not None:
        h, mi, s = (parts + [0, 0])[:3]
        return int(d) * 86400 + h * 3600 + mi * 60 + s
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def _launch_line(text: str) -> str:
    lines = [ln.strip() for ln in logical_lines(text)]
    body = [ln for ln in lines if ln and not ln.startswith("#")]
    assigns = {}
    for ln in body:
        m = re.match(r'^([A-Z_]+)="(.*)"$', ln)
        if m:
            assigns[m.group(1)] = m.group(2)
    cands = [ln for ln in body if re.search(r"(^|\s)srun\s", ln) and "mkdir" not in ln]
    if not cands:
        cands = [ln for ln in body if re.search(r"\bpython3?\b", ln) and "pip " not in ln]
    launch = cands[-1]
    for name, value in assigns.items():
        launch = launch.replace(f'"${name}"', value).replace(f"${name}", value)
    return launch


def _family(cluster: str, partition: str | None) -> str | None:
    if partition is None:
        return None
    if cluster == "lumi" and partition in ("eap", "small-g", "standard-g", "dev-g"):
        return "lumi-g"
    return partition


def job_shape(text: str, cluster: str) -> dict[str, object]:
    """What a batch script asks for and how it launches, in comparable terms."""
    o = sbatch_options(text)
    nodes = int(o.get("nodes", "1"))
    if "ntasks-per-node" in o:
        tpn = int(o["ntasks-per-node"])
    else:
        tpn = int(o.get("ntasks", str(nodes))) // nodes
    gpn = 0
    for item in o.get("gres", "").split(","):
        if item.startswith("gpu"):
            gpn = int(item.split(":")[-1])
    if "gpus-per-node" in o:
        gpn = int(o["gpus-per-node"].split(":")[-1])
    if "gpus-per-task" in o:
        gpn = int(o["gpus-per-task"]) * tpn
    launch = _launch_line(text)
    if re.search(r"torch\.distributed\.run|\btorchrun\b|scaletrain run", launch):
        kind = "torchrun"
    elif "accelerate launch" in launch:
        kind = "accelerate"
    elif re.search(r"(^|\s)deepspeed(\s|$)", launch):
        kind = "deepspeed"
    else:
        kind = "python"
    nproc = None
    m = re.search(r"--(?:nproc[_-]per[_-]node|num_gpus)[= ](\d+)", launch)
    if m:
        nproc = int(m.group(1))
    mp = re.search(r"--num_processes=(\d+)", launch)
    mm = re.search(r"--num_machines=(\d+)", launch)
    if mp and mm:
        nproc = int(mp.group(1)) // int(mm.group(1))
    return {
        "nodes": nodes,
        "tasks_per_node": tpn,
        "gpus_per_node": gpn,
        "cpus_per_task": int(o.get("cpus-per-task", "1")),
        "mem": o.get("mem"),
        "partition_family": _family(cluster, o.get("partition")),
        "time_s": slurm_seconds(o["time"]) if "time" in o else None,
        "srun": bool(re.search(r"(^|\s)srun\s", launch)),
        "kind": kind,
        "nproc": nproc,
        "multi_node_rdzv": any(k in launch for k in ("--rdzv_endpoint", "--master-addr", "--master_addr",
                                                     "--main_process_ip")),
        "node_rank": "SLURM_NODEID" in launch,
    }


# --------------------------------------------------------------------------- the cases

FIELDS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem", "partition_family",
          "time_s", "srun", "kind", "nproc", "multi_node_rdzv", "node_rank")

NEWER = "001 is the older revision; 000 (newer, it wins) asks for this"
LUMI_EAP = "001's LUMI 'eap' nodes had 8 cores/GPU and no --mem; 000 and LUMI docs: 7 cores and 60 GB per GPU"
NO_MPI = ("seed 'no MPI' = one task per node whose program drives every GPU of the node; "
          "scaletrain's equivalent is --launcher torchrun (torchrun starts a worker per GPU)")
NO_MPI_2N = NO_MPI + "; across nodes torchrun joins them with c10d rendezvous on the first node"
DS_ALL = "the seed's deepspeed launcher takes every visible GPU; scaletrain names --num_gpus"
ONE_PER_GPU = "the seed gives a 2-GPU process one core; scaletrain's --cpus-per-gpu gives one per GPU"
NO_SRUN = "a one-task seed job runs python directly; scaletrain always starts it with srun --kill-on-bad-exit=1"


@dataclass(frozen=True)
class Case:
    seed: str                 # "000", "001", "003", "004"
    index: int                # n-th #SBATCH block of that seed
    sig: tuple[str, ...]      # substrings the block must hold (guards the index)
    cluster: str
    req: dict = field(default_factory=dict)
    dev: dict = field(default_factory=dict)   # field -> (seed value, our value, reason)

    @property
    def key(self) -> tuple[str, int, str]:
        """The case's entry in golden_facts.FACTS."""
        return (self.seed, self.index, self.cluster)

    @property
    def id(self) -> str:
        return f"{self.seed}[{self.index}]-{self.cluster}-" + "-".join(f"{k}{v}" for k, v in self.req.items()
                                                                      if k in ("gpus", "nodes", "launcher"))


def _no_mpi(nodes: int, gpn: int) -> dict:
    d = {"kind": ("python", "torchrun", NO_MPI), "nproc": (None, gpn, NO_MPI)}
    if nodes > 1:
        d["multi_node_rdzv"] = (False, True, NO_MPI_2N)
    return d


def _d(**kw: tuple) -> dict:
    return kw


TR = {"launcher": "torchrun"}
CASES: list[Case] = [
    # ---- 000 (newer CSC guide): the 12 Slurm cases
    Case("000", 0, ("--gres=gpu:v100:2", "--mem=160G"), "puhti", {"gpus": 2, **TR}, _no_mpi(1, 2)),
    Case("000", 1, ("gpusmall", "--cpus-per-task=64"), "mahti", {"gpus": 2, **TR}, _no_mpi(1, 2)),
    Case("000", 2, ("small-g", "--gpus-per-node=2"), "lumi", {"gpus": 2, **TR}, _no_mpi(1, 2)),
    Case("000", 3, ("--ntasks-per-node=4", "--mem=320G"), "puhti", {"gpus": 4}),
    Case("000", 4, ("gpumedium", "--ntasks-per-node=4"), "mahti", {"gpus": 4}),
    Case("000", 5, ("small-g", "--ntasks-per-node=8"), "lumi", {"gpus": 8}),
    Case("000", 6, ("--nodes=2", "--ntasks-per-node=1"), "puhti", {"nodes": 2, **TR}, _no_mpi(2, 4)),
    Case("000", 7, ("--nodes=2", "--cpus-per-task=128"), "mahti", {"nodes": 2, **TR}, _no_mpi(2, 4)),
    Case("000", 8, ("--nodes=2", "--cpus-per-task=56"), "lumi", {"nodes": 2, **TR}, _no_mpi(2, 8)),
    Case("000", 9, ("--nodes=2", "--ntasks-per-node=4"), "puhti", {"gpus": 8}),
    Case("000", 10, ("--nodes=2", "--cpus-per-task=32"), "mahti", {"gpus": 8}),
    Case("000", 11, ("--nodes=2", "--ntasks-per-node=8"), "lumi", {"gpus": 16}),
    # ---- 000: PyTorch DDP with torchrun, 1 and 2 nodes
    Case("000", 12, ("--standalone", "gpu"), "puhti", {"gpus": 4, **TR}),
    Case("000", 13, ("--standalone", "gpumedium"), "mahti", {"gpus": 4, **TR}),
    Case("000", 14, ("--standalone", "small-g"), "lumi", {"gpus": 8, **TR}),
    Case("000", 15, ("rdzv_backend=c10d", "v100"), "puhti", {"gpus": 8, **TR},
         {}),
    Case("000", 16, ("rdzv_backend=c10d", "a100"), "mahti", {"gpus": 8, **TR},
         {}),
    Case("000", 17, ("rdzv_backend=c10d", "small-g"), "lumi", {"gpus": 16, **TR},
         {}),
    # ---- 000: PyTorch Lightning, 1 and 2 nodes
    *[Case("000", 18 + i, ("--gpus=", f"--nodes={n}"), cl, {"gpus": g * n, "launcher": "lightning"})
      for i, (cl, g, n) in enumerate([("puhti", 4, 1), ("mahti", 4, 1), ("lumi", 8, 1),
                                      ("puhti", 4, 2), ("mahti", 4, 2), ("lumi", 8, 2)])],
    # ---- 000: Accelerate, 1 and 2 nodes
    Case("000", 24, ("accelerate launch", "gpu:v100:4"), "puhti", {"gpus": 4, "launcher": "accelerate"}),
    Case("000", 25, ("accelerate launch", "gpumedium"), "mahti", {"gpus": 4, "launcher": "accelerate"}),
    Case("000", 26, ("accelerate launch", "small-g"), "lumi", {"gpus": 8, "launcher": "accelerate"}),
    *[Case("000", 27 + i, ("RUN_CMD", "machine_rank=\\$SLURM_NODEID"), cl,
           {"gpus": g, "launcher": "accelerate"},
           _d(nproc=(None, g // 2, "the seed computes --num_processes in the shell; scaletrain writes the number")))
      for i, (cl, g) in enumerate([("puhti", 8), ("mahti", 8), ("lumi", 16)])],
    # ---- 000: DeepSpeed launcher, one node (the LUMI block is cut off in the seed)
    Case("000", 30, ("apptainer_wrapper exec deepspeed", "gpu:v100:4"), "puhti",
         {"gpus": 4, "launcher": "deepspeed"}, _d(nproc=(None, 4, DS_ALL))),
    Case("000", 31, ("apptainer_wrapper exec deepspeed", "gpumedium"), "mahti",
         {"gpus": 4, "launcher": "deepspeed"}, _d(nproc=(None, 4, DS_ALL))),

    # ---- 001 (older CSC guide): the 12 Slurm cases
    Case("001", 0, ("--mem=64G", "gpu:v100:2"), "puhti", {"gpus": 2, **TR},
         {**_no_mpi(1, 2), "mem": ("64G", "160G", NEWER)}),
    Case("001", 1, ("gpusmall", "--cpus-per-task=10"), "mahti", {"gpus": 2, **TR},
         {**_no_mpi(1, 2), "cpus_per_task": (10, 64, NEWER)}),
    Case("001", 2, ("eap", "--gpus-per-task=2"), "lumi", {"gpus": 2, **TR},
         {**_no_mpi(1, 2), "cpus_per_task": (16, 14, LUMI_EAP), "mem": (None, "120G", LUMI_EAP)}),
    Case("001", 3, ("--mem=0", "--ntasks-per-node=4"), "puhti", {"gpus": 4}, _d(mem=("0", "320G", NEWER))),
    Case("001", 4, ("gpumedium", "--ntasks-per-node=4"), "mahti", {"gpus": 4},
         _d(cpus_per_task=(10, 32, NEWER))),
    Case("001", 5, ("eap", "--ntasks-per-node=8"), "lumi", {"gpus": 8},
         _d(cpus_per_task=(8, 7, LUMI_EAP), mem=(None, "480G", LUMI_EAP))),
    Case("001", 6, ("--nodes=2", "--ntasks-per-node=1", "v100"), "puhti", {"nodes": 2, **TR},
         {**_no_mpi(2, 4), "mem": ("0", "320G", NEWER)}),
    Case("001", 7, ("--nodes=2", "--ntasks-per-node=1", "a100"), "mahti", {"nodes": 2, **TR},
         {**_no_mpi(2, 4), "cpus_per_task": (40, 128, NEWER)}),
    Case("001", 8, ("--nodes=2", "--gpus-per-task=8"), "lumi", {"nodes": 2, **TR},
         {**_no_mpi(2, 8), "cpus_per_task": (64, 56, LUMI_EAP), "mem": (None, "480G", LUMI_EAP)}),
    Case("001", 9, ("--ntasks=8", "v100"), "puhti", {"gpus": 8}, _d(mem=("64G", "320G", NEWER))),
    Case("001", 10, ("--ntasks=8", "a100"), "mahti", {"gpus": 8}, _d(cpus_per_task=(10, 32, NEWER))),
    Case("001", 11, ("eap", "--nodes=2", "--ntasks-per-node=8"), "lumi", {"gpus": 16},
         _d(cpus_per_task=(8, 7, LUMI_EAP), mem=(None, "480G", LUMI_EAP))),
    # ---- 001: torchrun 1 and 2 nodes
    Case("001", 12, ("--standalone", "v100"), "puhti", {"gpus": 4, **TR}, _d(mem=("0", "320G", NEWER))),
    Case("001", 13, ("--standalone", "a100"), "mahti", {"gpus": 4, **TR},
         _d(cpus_per_task=(40, 128, NEWER))),
    Case("001", 14, ("--standalone", "eap"), "lumi", {"gpus": 8, **TR},
         _d(cpus_per_task=(128, 56, LUMI_EAP), mem=(None, "480G", LUMI_EAP))),
    Case("001", 15, ("c10d", "v100"), "puhti", {"gpus": 8, **TR},
         _d(mem=("0", "320G", NEWER))),
    Case("001", 16, ("c10d", "a100"), "mahti", {"gpus": 8, **TR},
         _d(cpus_per_task=(40, 128, NEWER))),
    Case("001", 17, ("c10d", "eap"), "lumi", {"gpus": 16, **TR},
         _d(cpus_per_task=(128, 56, LUMI_EAP), mem=(None, "480G", LUMI_EAP),
            nproc=(4, 8, "001's LUMI example starts 4 workers on 8 GPUs (a seed bug); 000 fixes it to 8"))),
    # ---- 001: DeepSpeed launcher (1 node) and DeepSpeed in MPI mode (2 nodes, one task per GPU)
    Case("001", 18, ("singularity_wrapper exec deepspeed", "v100"), "puhti",
         {"gpus": 4, "launcher": "deepspeed"}, _d(mem=("0", "320G", NEWER), nproc=(None, 4, DS_ALL))),
    Case("001", 19, ("singularity_wrapper exec deepspeed", "a100"), "mahti",
         {"gpus": 4, "launcher": "deepspeed"}, _d(cpus_per_task=(40, 128, NEWER), nproc=(None, 4, DS_ALL))),
    Case("001", 20, ("--deepspeed_config", "--ntasks-per-node=4", "v100"), "puhti",
         {"gpus": 8, "launcher": "mpi"}, _d(mem=("0", "320G", NEWER))),
    Case("001", 21, ("--deepspeed_config", "--ntasks-per-node=4", "a100"), "mahti",
         {"gpus": 8, "launcher": "mpi"}, _d(cpus_per_task=(10, 32, NEWER))),

    # ---- 003 (Alliance): the first job is sized for Cedar ("6 on Cedar, 16 on Graham")
    Case("003", 0, ("pytorch-test.py", "--cpus-per-task=6"), "cedar", {"gpus": 1},
         _d(srun=(False, True, NO_SRUN))),
    Case("003", 0, ("pytorch-test.py", "--mem=32000M"), "graham", {"gpus": 1},
         _d(srun=(False, True, NO_SRUN),
            cpus_per_task=(6, 16, "seed 003's comment: 16 cores per GPU on Graham"),
            mem=("32000M", "64000M", "seed 003's comment: 64000M per GPU on Graham"))),
    # the rest ask 1 CPU per task and a fixed --mem: the same flags reproduce them exactly
    Case("003", 2, ("cifar10-gpu.py", "--gres=gpu:1"), "narval",
         {"gpus": 1, "cpus_per_gpu": 1, "mem_per_gpu": "8G"}, _d(srun=(False, True, NO_SRUN))),
    Case("003", 4, ("pytorch-ddp-test.py", "--tasks-per-node=2"), "narval",
         {"gpus": 2, "launcher": "mpi", "cpus_per_gpu": 1, "mem_per_gpu": "4G"}),
    Case("003", 5, ("pytorch-ddp-test-pl.py",), "narval",
         {"gpus": 2, "launcher": "lightning", "cpus_per_gpu": 1, "mem_per_gpu": "4G"}),
    Case("003", 6, ("pytorch_horovod.py",), "beluga",
         {"gpus": 2, "launcher": "mpi", "cpus_per_gpu": 1, "mem_per_gpu": "4G"}),
    *[Case("003", i, (name,), "narval",
           {"gpus": 2, "launcher": "lightning", "cpus_per_gpu": 1, "mem_per_gpu": "16G"})
      for i, name in ((9, "deepspeed-stage3.py"), (10, "deepspeed-stage3-offload-cpu.py"),
                      (11, "deepspeed-stage3-offload-nvme.py"))],

    # ---- 003: the job shapes beyond one process per GPU (issue 8)
    Case("003", 1, ("cifar10-cpu.py",), "narval", {"cpus": 1},
         _d(srun=(False, True, NO_SRUN), mem=("8G", "3993M", "the seed asks a fixed 8G; scaletrain gives a "
                                                            "CPU-only job the CPU nodes' memory per core "
                                                            "(3.9 GB: 250G for 64 cores, Alliance wiki Narval)"))),
    Case("003", 3, ("nvidia-cuda-mps-control",), "narval",
         {"gpus": 1, "procs_per_gpu": 8, "cpus_per_gpu": 1, "mem_per_gpu": "8G"}),
    Case("003", 7, ("pytorch-modelpar-pipelined-rpc.py",), "narval",
         {"gpus": 2, "gpus_per_proc": 2, "cpus_per_gpu": 1, "mem_per_gpu": "4G"},
         _d(srun=(False, True, NO_SRUN), cpus_per_task=(1, 2, ONE_PER_GPU))),
    Case("003", 8, ("pytorch-model-data-par.py",), "narval",
         {"nodes": 2, "gpus_per_proc": 2, "launcher": "mpi", "cpus_per_gpu": 1, "mem_per_gpu": "4G"},
         _d(cpus_per_task=(1, 2, ONE_PER_GPU))),

    # ---- 004 (JSC, JUWELS Booster): 1 GPU, 4 GPUs, 16 nodes (Lightning: one task per GPU)
    Case("004", 0, ("--gres=gpu:1", "--cpus-per-task=96"), "juwels-booster", {"gpus": 1}),
    Case("004", 1, ("--gres=gpu:4", "--cpus-per-task=24"), "juwels-booster",
         {"gpus": 4, "launcher": "lightning"}),
    Case("004", 2, ("--nodes=16", "ddp_training.py"), "juwels-booster", {"nodes": 16, "launcher": "lightning"}),
]

EXCLUDED: dict[tuple[str, int], str] = {
    ("004", 3): "slide fragment ('It was'): not a complete job",
    ("004", 4): "slide fragment ('Became'): not a complete job",
}
SOURCES = guide_sources()
BLOCK_COUNTS = {"000": 32, "001": 22, "003": 12, "004": 5}


# --------------------------------------------------------------------------- machinery

_blocks_cache: dict[tuple[str, str], list[str]] = {}


def _blocks(source: str, seed: str) -> list[str]:
    """The #SBATCH blocks of one guide (``0NN_*.txt``) in one source folder."""
    if (source, seed) not in _blocks_cache:
        (path,) = SOURCES[source].glob(f"{seed}_*.txt")
        _blocks_cache[source, seed] = seed_blocks(path)
    return _blocks_cache[source, seed]


def _request(case: Case) -> JobRequest:
    req = dict(case.req)
    if "mem_per_gpu" in req:
        req["mem_per_gpu_gb"] = parse_mem_gb(req.pop("mem_per_gpu"))
    return JobRequest(cluster=case.cluster, script="myprog.py", script_args=("<options>",),
                      account="project_2001234", time=shape(case.key)["time"], **req)


def compare(seed_shape: dict, our_shape: dict, dev: dict) -> list[str]:
    """Every field where the shapes differ other than as pinned by ``dev``."""
    problems = []
    for f in FIELDS:
        if f in dev:
            want_seed, want_ours, _why = dev[f]
            if seed_shape[f] != want_seed:
                problems.append(f"{f}: seed has {seed_shape[f]!r}, the case pins {want_seed!r}")
            if our_shape[f] != want_ours:
                problems.append(f"{f}: plan gives {our_shape[f]!r}, the case pins {want_ours!r}")
        elif seed_shape[f] != our_shape[f]:
            problems.append(f"{f}: seed {seed_shape[f]!r} != plan {our_shape[f]!r}")
    return problems


def _render(case: Case) -> str:
    return render_script(make_plan(_request(case), load_profile(case.cluster)))


def _stored(case: Case) -> dict:
    return {k: v for k, v in shape(case.key).items() if k in FIELDS}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_plan_reproduces_seed_script(case: Case) -> None:
    """The guide's job shape (stored as data, golden_facts.py) against the script plan writes.

    A guide written for a system that has since been retired (Puhti, Mahti, Cedar, Graham, Beluga)
    is no longer planned: plan refuses the system and names its successor; the guide's script
    stays readable by lint (tests/unit/test_lint_seeds.py), and the live systems have their own
    cases (tests/unit/test_live_profiles.py).
    """
    profile = load_profile(case.cluster)
    if profile.retired:
        with pytest.raises(PlanError, match=f"retired on {profile.retired}.*successor is {profile.successor}"):
            _render(case)
        return
    ours = _render(case)
    assert compare(_stored(case), job_shape(ours, case.cluster), case.dev) == [], ours
    for f, (_s, _o, why) in case.dev.items():
        assert f in FIELDS and why, f"deviation {f} needs a reason"


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_stored_facts_match_the_guides(case: Case, source: str) -> None:
    """The data the golden test uses is what the guide's script says (ours, and the guides where present)."""
    block = _blocks(source, case.seed)[case.index]
    for s in case.sig:
        assert s in block, f"seed {case.seed} block {case.index} is not the expected one (no {s!r})"
    assert job_shape(block, case.cluster) == _stored(case)
    assert sbatch_options(block).get("time") == shape(case.key)["time"]


@pytest.mark.parametrize("source", SOURCES)
def test_every_seed_block_is_a_case_or_excluded_with_reason(source: str) -> None:
    covered = {(c.seed, c.index) for c in CASES}
    for seed, count in BLOCK_COUNTS.items():
        blocks = _blocks(source, seed)
        assert len(blocks) == count, f"seed {seed}: {len(blocks)} #SBATCH blocks, expected {count}"
        for i in range(count):
            assert (seed, i) in covered or (seed, i) in EXCLUDED, f"seed {seed} block {i} untested"
    assert not covered & set(EXCLUDED)


def test_issue_acceptance_cases_are_all_present() -> None:
    # 001's 12 cases, torchrun 1+2 nodes, Lightning 1+2, Accelerate 1+2, DeepSpeed (issue 3)
    got = {(c.seed, c.index) for c in CASES}
    assert {("001", i) for i in range(12)} <= got
    assert {("000", i) for i in range(12, 32)} <= got
    assert {("001", i) for i in range(12, 22)} <= got


def test_golden_comparison_can_fail() -> None:
    """Mutations on either side are caught: a wrong plan, a wrong pinned value, a wrong fact."""
    case = next(c for c in CASES if (c.seed, c.index) == ("000", 11))   # LUMI, 2 nodes, MPI
    seed_shape = _stored(case)
    assert compare(seed_shape, job_shape(_render(case), case.cluster), case.dev) == []
    # the plan asked for the wrong thing: one task per node instead of one per GPU
    wrong = Case("000", 11, (), "lumi", {"gpus": 16, "launcher": "torchrun"})
    problems = compare(seed_shape, job_shape(_render(wrong), "lumi"), {})
    assert any(p.startswith("tasks_per_node") for p in problems)
    assert any(p.startswith("cpus_per_task") for p in problems)
    # a mutated fact: 7 tasks per node instead of 8
    mutated = {**seed_shape, "tasks_per_node": 7}
    assert compare(mutated, job_shape(_render(case), "lumi"), {}) == ["tasks_per_node: seed 7 != plan 8"]
    # a pinned deviation with a wrong value
    bad_pin = {"mem": ("480G", "100G", "wrong on purpose")}
    assert compare(seed_shape, job_shape(_render(case), "lumi"), bad_pin) \
        == ["mem: plan gives '480G', the case pins '100G'"]


def test_shape_parser_reads_aliases_and_ntasks() -> None:
    text = textwrap.dedent("""\
        #!/bin/bash
        #SBATCH -N 2
        #SBATCH --tasks-per-node 4   # a comment
        #SBATCH --gres=gpu:v100:4,nvme:100
        #SBATCH --time=0-03:00
        srun python3 x.py
        """)
    shape = job_shape(text, "puhti")
    assert (shape["nodes"], shape["tasks_per_node"], shape["gpus_per_node"], shape["time_s"]) == (2, 4, 4, 10800)
    assert shape["srun"] and shape["kind"] == "python" and shape["cpus_per_task"] == 1
