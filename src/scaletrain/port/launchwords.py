"""The old launch line's words that the new launch line has no counterpart for, to be listed.

The new launch line is the plan's: srun's sizes, the launcher's process counts and rendezvous
are computed for the target. Everything else the old line said (``srun --export=ALL,FOO=1``,
``--cpu-bind``, ``python -O -W ignore``, ``torchrun --max-restarts=3``, a wrapper such as
``env FOO=1`` or ``nsys profile``) is not written again, so it is listed, never dropped unsaid.
Pure: the parsed line in, text out.
"""

from __future__ import annotations

import os

from scaletrain.lint.invocation import Invocation, norm
from scaletrain.lint.words import Command

# srun options the plan sets for the target (its sizes, and the step's kill on a failed task)
_SRUN_PLANNED = {"nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "gres", "gpus", "gpus-per-node",
                 "gpus-per-task", "cpus-per-gpu", "ntasks-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu",
                 "kill-on-bad-exit", "N", "n", "c", "G"}
# launcher options the new line computes (counts, rendezvous) or carries another way (-m, a config)
_LAUNCHER_PLANNED = {norm(o) for o in (
    "nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_backend", "rdzv_id", "master_addr",
    "master_port", "standalone", "num_processes", "num_machines", "machine_rank", "main_process_ip",
    "main_process_port", "num_gpus", "num_nodes", "multi_gpu", "config_file", "m", "module", "hostfile",
    "launcher", "same_network", "rdzv_conf",
    "use_env")}   # torch.distributed.launch --use-env: what torchrun always does
# interpreter options the new line writes itself
_PYTHON_PLANNED = {"-u", "-m"}


def module_launch(cmd: Command, inv: Invocation) -> bool:
    """True when the program is a module (``python -m pkg.train``, ``torchrun -m pkg.train``)."""
    if inv.script is None:
        return False
    if inv.kind == "python":
        k = next(i for i, w in enumerate(cmd.words) if w is inv.script)
        return k > 0 and cmd.words[k - 1].value == "-m"
    return "m" in inv.launcher_opts or "module" in inv.launcher_opts


def uncarried(cmd: Command, inv: Invocation) -> list[str]:
    """The old launch line's options and wrappers the new line does not write, as written."""
    words = cmd.words
    if inv.command is not cmd or inv.script is None:
        return []        # srun bash -c "$RUN_CMD": the variable's line is listed on its own
    end = next(i for i, w in enumerate(words) if w is inv.script)
    out: list[str] = []
    program = next((i for i in range(end) if os.path.basename(words[i].value).startswith("python")
                    or words[i] is inv.program_word), end)
    j = 0
    if inv.srun is not None:
        opts = inv.srun.options
        own = [f"--{n}" + (f"={v}" if v is not None else "") for n, v in opts.items() if n not in _SRUN_PLANNED]
        out += [f"srun {' '.join(own)}"] if own else []
        values = {v for v in opts.values() if v is not None}
        j = next(i for i, w in enumerate(words) if w is inv.srun.word) + 1
        while j < program and words[j].value.startswith("-"):   # srun's options, and a value given apart
            apart = "=" not in words[j].value and j + 1 < program and words[j + 1].value in values
            j += 2 if apart else 1
    if program > j and not inv.container and not inv.mpi:   # a wrapper between srun and the program: env, nsys, numactl
        out.append(" ".join(w.raw for w in words[j:program]))
    if inv.kind == "python":
        flags = [w.value for w in words[program + 1:end]]
        if module_launch(cmd, inv):
            flags = flags[:-1]      # the -m before the module: carried
        out += [f for f in flags if f not in _PYTHON_PLANNED]
    else:
        out += [f"--{n}" + (f"={v}" if v is not None else "") for n, v in inv.launcher_opts.items()
                if n not in _LAUNCHER_PLANNED]   # names as lint folds them (--max_restarts)
    return out


def local_rank_argument(inv: Invocation) -> str | None:
    """What the old launcher gave the program that the new one does not: ``python -m
    torch.distributed.launch`` (without ``--use-env``) passes each process ``--local-rank=N``
    (``--local_rank=N`` before torch 2.0); torchrun, which the new line runs, sets LOCAL_RANK
    in the environment only (torch's "Transitioning from torch.distributed.launch to
    torchrun"). None for any other launcher."""
    words = [w.value for w in inv.command.words]
    launch = any(a == "-m" and b == "torch.distributed.launch" for a, b in zip(words, words[1:]))
    if not launch or "use_env" in inv.launcher_opts:
        return None
    return ("--local-rank=N, which torch.distributed.launch passed to each process: torchrun sets "
            "LOCAL_RANK in the environment instead, so a program that reads args.local_rank runs "
            "every rank on its default device; read int(os.environ['LOCAL_RANK']) in the program")
