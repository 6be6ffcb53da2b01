"""What a command line starts: srun/mpirun, a container wrapper, and the program or launcher.

``srun --kill-on-bad-exit=1 singularity exec img.sif torchrun --nproc_per_node=4 train.py``
becomes ``Invocation(srun=..., kind="torchrun", launcher_opts={"nproc_per_node": "4"}, ...)``.
Options are read the way each tool reads them, well enough to find the values the rules need.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from scaletrain.lint.script import Command, Word

# Words that may precede the real command without changing what runs.
_PREFIX = {"time", "exec", "nohup", "command", "builtin", "then", "do", "else", "elif", "if",
           "while", "until", "!", "{", "eval"}
_PREFIX_WITH_OPTS = {"nice", "stdbuf", "numactl", "taskset", "ionice", "timeout", "env",
                     "chrt", "hwloc-bind"}

# srun long options that take no value (the rest take one, as ``--x=v`` or ``--x v``).
_SRUN_LONG_FLAGS = {"exclusive", "label", "unbuffered", "overlap", "kill-on-bad-exit", "pty",
                    "quiet", "verbose", "overcommit", "no-kill", "exact", "spread-job",
                    "test-only", "disable-status", "oversubscribe", "contiguous", "help",
                    "usage", "whole", "multi-prog", "no-allocate", "preserve-env", "reboot",
                    "hold", "immediate", "x11", "wait-all-nodes", "use-min-nodes", "external-launcher"}
_SRUN_SHORT_FLAGS = set("EHIKlQsuvXZhO")
_SRUN_SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "G": "gpus", "p": "partition",
               "t": "time", "w": "nodelist", "x": "exclude", "o": "output", "e": "error",
               "J": "job-name", "A": "account", "m": "distribution", "B": "extra-node-info"}
_SRUN_ALIAS = {"tasks-per-node": "ntasks-per-node", "tasks": "ntasks"}

# torchrun / deepspeed / accelerate options that take no value.
_LAUNCHER_FLAGS = {"standalone", "no_python", "no-python", "module", "m", "run_path", "run-path",
                   "multi_gpu", "multi-gpu", "use_deepspeed", "use_fsdp", "cpu", "no_local_rank",
                   "no-local-rank", "force_multi", "enable_each_rank_log", "bind_cores_to_rank",
                   "debug", "quiet", "q", "same_network", "same-network", "tpu", "use_cpu",
                   "mpi", "ssh", "autotune", "elastic_training", "no_ssh_check", "dynamo_use_fullgraph",
                   "rdzv_conf_only", "no_ssh", "h", "help", "use_env"}

_CONTAINER = {"singularity", "apptainer"}
_CONTAINER_FLAGS = {"nv", "rocm", "cleanenv", "e", "containall", "C", "contain", "c", "writable",
                    "w", "fakeroot", "f", "no-home", "userns", "u", "nvccli", "no-mount", "compat"}
_CONTAINER_WRAPPERS = {"singularity_wrapper", "apptainer_wrapper"}

# Profilers that start the program they are given (``nsys profile [opts] python x.py``): every
# option without ``=`` takes a value. ``kernprof`` runs a Python file itself.
_PROFILERS = {"nsys", "ncu", "nv-nsight-cu-cli", "rocprof", "rocprofv2", "omniperf"}
_PROFILER_VERBS = {"profile", "launch", "record"}
_KERNPROF_VALUE_OPTS = {"-o", "--outfile", "-s", "--setup", "-u", "--unit", "-p", "--prof-mod"}
# ``python -m cProfile [-o out] [-s sort] prog.py``: the module runs the program after it
_PROFILE_MODULES = {"cProfile", "profile", "trace", "line_profiler", "memory_profiler", "pyinstrument",
                    "scalene", "viztracer"}
_PROFILE_MODULE_VALUE_OPTS = {"-o", "-s", "--outfile", "--sort", "--count-file", "-r", "--renderer"}

_MPI = {"mpirun", "mpiexec", "mpiexec.hydra", "orterun", "prun"}
_SHELLS = {"bash", "sh", "zsh", "ksh", "dash"}
_NOT_PROGRAM_MODULES = {"pip", "venv", "ensurepip", "virtualenv", "site", "json", "http", "pydoc",
                        "compileall", "uv"}


def norm(option: str) -> str:
    """Option spelling folded: ``--nproc-per-node`` and ``--nproc_per_node`` are one name."""
    return option.lstrip("-").replace("-", "_")


@dataclass(kw_only=True)
class SrunCall:
    """An ``srun`` and the options given to it (long names, dashes kept)."""

    options: dict[str, str | None]
    word: Word


@dataclass(kw_only=True)
class Invocation:
    """What one command starts."""

    command: Command
    srun: SrunCall | None = None
    mpi: str | None = None                      # mpirun/mpiexec when that launches it
    container: str | None = None
    kind: str = "other"   # torchrun | scaletrain | deepspeed | accelerate | python | shell | other
    program: str = ""                           # the basename of the program word
    program_word: Word | None = None
    launcher_opts: dict[str, str | None] = field(default_factory=dict)   # norm(name) -> value
    launcher_words: dict[str, Word] = field(default_factory=dict)        # norm(name) -> word
    script: Word | None = None                  # the training script (python/launcher positional)
    args: list[Word] = field(default_factory=list)                       # after the script
    shell_body: Word | None = None              # bash -c BODY

    @property
    def is_program(self) -> bool:
        """A training program or a multi-process launcher (what must be started by srun)."""
        return self.kind in ("torchrun", "scaletrain", "deepspeed", "accelerate", "python")

    @property
    def is_launcher(self) -> bool:
        """A launcher that starts one process per GPU itself."""
        return self.kind in ("torchrun", "scaletrain", "deepspeed", "accelerate")


def _skip_prefixes(words: list[Word]) -> list[Word]:
    i = 0
    while i < len(words):
        v = words[i].value
        if v in _PREFIX:
            i += 1
        elif v in _PREFIX_WITH_OPTS:
            i += 1
            if v == "timeout" and i < len(words) and not words[i].value.startswith("-"):
                i += 1
            while i < len(words) and (words[i].value.startswith("-") or "=" in words[i].value):
                opt = words[i].value
                i += 1
                if v in ("nice", "taskset", "ionice", "chrt") and opt in ("-n", "-c", "-p") \
                        and i < len(words):
                    i += 1
            if v == "taskset" and i < len(words):
                i += 1   # the mask
        else:
            break
    return words[i:]


def srun_option_takes_value(option: str) -> bool:
    """Whether srun's ``option`` (``--nodes``, ``-N``) takes the next word as its value
    (``--nodes=2``, ``-N2`` and flags such as ``--exclusive`` do not)."""
    if option.startswith("--"):
        name, eq, _ = option[2:].partition("=")
        return not eq and _SRUN_ALIAS.get(name, name) not in _SRUN_LONG_FLAGS
    return len(option) == 2 and option[1] not in _SRUN_SHORT_FLAGS


def _parse_srun(words: list[Word]) -> tuple[dict[str, str | None], list[Word]]:
    """srun's options and the words of the command it runs."""
    opts: dict[str, str | None] = {}
    i = 1
    while i < len(words):
        v = words[i].value
        if v == "--":
            i += 1
            break
        if not v.startswith("-") or len(v) < 2:
            break
        takes = srun_option_takes_value(v)
        if v.startswith("--"):
            name, _, val = v[2:].partition("=")
            name = _SRUN_ALIAS.get(name, name)
        else:
            name, val = _SRUN_SHORT.get(v[1], v[1]), v[2:].lstrip("=")
        if takes:
            opts[name] = words[i + 1].value if i + 1 < len(words) else None
            i += 1
        elif v.startswith("--"):
            opts[name] = val if "=" in v else None
        else:
            opts[name] = val if len(v) > 2 else None
        i += 1
    return opts, words[i:]


def _skip_mpi(words: list[Word]) -> list[Word]:
    value_opts = {"-np", "-n", "-c", "-N", "-npernode", "--npernode", "-ppn", "--map-by", "--bind-to",
                  "-x", "-H", "--host", "-host", "-hostfile", "--hostfile", "-machinefile",
                  "-f", "--rank-by", "-mca", "--mca", "-genv", "-env", "-wdir", "--np"}
    i = 1
    while i < len(words):
        v = words[i].value
        if not v.startswith("-"):
            break
        if v in ("-mca", "--mca", "-genv", "-env"):
            i += 3
            continue
        i += 2 if v in value_opts else 1
    return words[i:]


def _skip_container(words: list[Word]) -> list[Word]:
    """``singularity exec [opts] IMAGE cmd`` -> ``cmd``; ``*_wrapper exec cmd`` -> ``cmd``."""
    name = os.path.basename(words[0].value)
    i = 1
    if i < len(words) and words[i].value in ("exec", "run", "shell"):
        i += 1
    if name in _CONTAINER_WRAPPERS:
        return words[i:]
    while i < len(words) and words[i].value.startswith("-"):
        opt = words[i].value.lstrip("-")
        if "=" in opt or opt in _CONTAINER_FLAGS:
            i += 1
        else:
            i += 2
    return words[i + 1:]   # skip the image


def _parse_launcher(words: list[Word]) -> tuple[dict[str, str | None], dict[str, Word], list[Word]]:
    """Options of torchrun/deepspeed/accelerate up to the first positional (the script)."""
    opts: dict[str, str | None] = {}
    owords: dict[str, Word] = {}
    i = 0
    while i < len(words):
        v = words[i].value
        if not v.startswith("-") or v == "-":
            break
        name, eq, val = v.partition("=")
        key = norm(name)
        owords[key] = words[i]
        if eq:
            opts[key] = val
        elif key in _LAUNCHER_FLAGS or i + 1 >= len(words) or words[i + 1].value.startswith("--"):
            opts[key] = None
        else:
            opts[key] = words[i + 1].value if i + 1 < len(words) else None
            if i + 1 < len(words):
                owords[key] = words[i + 1]
            i += 1
        i += 1
    return opts, owords, words[i:]


def _skip_profiler(words: list[Word]) -> list[Word]:
    """``nsys profile -o x -t cuda python x.py`` -> ``python x.py``; anything else unchanged."""
    if not words or os.path.basename(words[0].value) not in _PROFILERS:
        return words
    i = 1
    if i < len(words) and words[i].value in _PROFILER_VERBS:
        i += 1
    while i < len(words) and words[i].value.startswith("-"):
        if words[i].value == "--":
            i += 1
            break
        i += 1 if "=" in words[i].value else 2
    return words[i:]


def _after_options(words: list[Word], value_opts: set[str]) -> list[Word]:
    """The words after a tool's options (those in ``value_opts`` take the next word)."""
    i = 0
    while i < len(words) and words[i].value.startswith("-") and words[i].value != "-":
        if words[i].value == "--":
            return words[i + 1:]
        i += 2 if words[i].value in value_opts else 1
    return words[i:]


def classify(command: Command) -> Invocation:
    """Describe what ``command`` starts (see the module docstring)."""
    inv = Invocation(command=command)
    words = _unwrap(command, inv)
    if not words:
        return inv
    prog = os.path.basename(words[0].value)
    inv.program = prog
    inv.program_word = words[0]
    rest = words[1:]
    if prog == "kernprof":          # line_profiler's runner: kernprof -l -v prog.py args
        rest = _after_options(rest, _KERNPROF_VALUE_OPTS)
        if rest:
            inv.kind, inv.script, inv.args = "python", rest[0], rest[1:]
        return inv
    if prog.startswith("python"):
        launched = _classify_python(inv, rest)
        if launched is None:
            return inv
        rest = launched
    elif prog == "torchrun":
        inv.kind = "torchrun"
    elif prog == "scaletrain" and rest and rest[0].value == "run":
        inv.kind = "scaletrain"
        rest = rest[1:]
    elif prog == "deepspeed":
        inv.kind = "deepspeed"
    elif prog == "accelerate" and rest and rest[0].value == "launch":
        inv.kind = "accelerate"
        rest = rest[1:]
    elif prog in _SHELLS:
        inv.kind = "shell"
        for j, w in enumerate(rest):
            if w.value == "-c" and j + 1 < len(rest):
                inv.shell_body = rest[j + 1]
                break
            if not w.value.startswith("-"):
                break
        return inv
    else:
        return inv
    inv.launcher_opts, inv.launcher_words, positional = _parse_launcher(rest)
    if positional:
        inv.script, inv.args = positional[0], positional[1:]
    return inv


def _unwrap(command: Command, inv: Invocation) -> list[Word]:
    """The words from the program on: srun, an MPI launcher, a container, a profiler and a
    site wrapper script in front of it are skipped and recorded on ``inv``."""
    words = _skip_prefixes(command.words)
    if not words:
        return words
    first = os.path.basename(words[0].value)
    if first == "srun":
        opts, words = _parse_srun(words)
        inv.srun = SrunCall(options=opts, word=command.words[0])
        words = _skip_prefixes(words)
    elif first in _MPI:
        inv.mpi = first
        words = _skip_prefixes(_skip_mpi(words))
    if words and os.path.basename(words[0].value) in _CONTAINER | _CONTAINER_WRAPPERS:
        inv.container = os.path.basename(words[0].value)
        words = _skip_prefixes(_skip_container(words))
    words = _skip_prefixes(_skip_profiler(words))
    if words and inv.srun is not None and ("/" in words[0].value or words[0].value.endswith(".sh")):
        # a site wrapper script in front of the program (LUMI's ./select_gpu python ...)
        for j in range(1, min(len(words), 4)):
            base = os.path.basename(words[j].value)
            if base.startswith("python") or base in ("torchrun", "deepspeed", "accelerate"):
                return words[j:]
    return words


def _classify_python(inv: Invocation, rest: list[Word]) -> list[Word] | None:
    """Fill ``inv`` for ``python ...``; the launcher's words for ``python -m torch.distributed.run``
    or ``-m scaletrain run`` (parsed like torchrun's), else None (``inv`` is complete)."""
    if rest and rest[0].value == "-m" and len(rest) > 1:
        module = rest[1].value
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            inv.kind = "torchrun"
            return rest[2:]
        if module == "scaletrain" and len(rest) > 2 and rest[2].value == "run":
            inv.kind = "scaletrain"      # torchrun-compatible per-node launcher
            return rest[3:]
        if module.split(".")[0] in _NOT_PROGRAM_MODULES:
            return None
        if module in _PROFILE_MODULES:
            prog_words = _after_options(rest[2:], _PROFILE_MODULE_VALUE_OPTS)
            if prog_words:
                inv.kind, inv.script, inv.args = "python", prog_words[0], prog_words[1:]
            return None
        inv.kind = "python"
        inv.script = rest[1]
        inv.args = rest[2:]
        return None
    # skip interpreter flags such as -u, -O, -X dev
    j = 0
    while j < len(rest) and rest[j].value.startswith("-"):
        if rest[j].value == "-c":
            return None
        j += 2 if rest[j].value in ("-X", "-W") else 1
    if j < len(rest):
        inv.kind = "python"
        inv.script = rest[j]
        inv.args = rest[j + 1:]
    return None
