"""Read an existing batch script back into what it asks for: ``recover(text) -> OldJob``.

The script is read with lint's parser (``scaletrain.lint``): the ``#SBATCH`` header gives the
size and the sbatch options, ``classify`` finds the one line that starts training and what it
runs (srun + python, torchrun, accelerate, deepspeed, mpirun, or ``bash -c "$RUN_CMD"`` with the
command in a variable). The program and its arguments are kept as the script's words, quotes
removed. Every other line is sorted: software set-up (modules, venvs: the target has its own),
values the new launch line computes (rendezvous, ``OMP_NUM_THREADS``), plain exports (carried
with ``--env``), other commands before the launch (carried as written, with ``--setup``), and
what cannot be carried (lines after the launch). Pure: text in, data out.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from scaletrain.errors import UsageError
from scaletrain.lint.invocation import Invocation, classify
from scaletrain.lint.job import read_request
from scaletrain.lint.script import BatchScript, Command, Word, parse_script
from scaletrain.lint.shell import split_commands
from scaletrain.port.heredoc import heredoc_line
from scaletrain.port.launchwords import local_rank_argument, module_launch, uncarried
from scaletrain.port.oneline import one_line, why_not
from scaletrain.port.refusals import (inline_program, refuse_inline, refuse_lookalikes, refuse_redirects,
                                      refuse_unreadable)
from scaletrain.port.venv import ENV_BUILD, NotCarried, command_packages, heredoc_packages, is_env_command
from scaletrain.plan.values import PER_TASK_VARS

HINT = "give a Slurm batch script whose srun/mpirun line starts a Python program or launcher"
# Variables a launch line computes itself: the new script sets them (or needs none).
LAUNCH_VARS = {"OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "RDZV_HOST", "RDZV_PORT", "WORLD_SIZE",
               "SRUN_CPUS_PER_TASK", "NUM_PROCESSES", "MAIN_PROCESS_IP", "GPUS_PER_NODE", "NNODES",
               "NODE_RANK", "LOCAL_RANK", "RANK"}
# sbatch options carried to the new script unchanged (job-wide, not the cluster's)
CARRIED = ("account", "time", "job-name", "mail-type", "mail-user", "array", "dependency", "output",
           "error", "exclusive", "chdir")
# sbatch options the planner recomputes for the target (listed as changes, never copied)
RECOMPUTED = {"nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "cpus-per-gpu", "mem", "mem-per-cpu",
              "mem-per-gpu", "gres", "gpus", "gpus-per-node", "gpus-per-task", "partition"}
_COMPOUND_OPEN = {"if", "for", "while", "until", "case", "select"}
_COMPOUND_CLOSE = {"fi", "done", "esac"}
_OLD_ENV = "a Python environment built on the old cluster"
_PYTHON_ENV = re.compile(r"(^|/)(activate|conda)$")


@dataclass(frozen=True)
class Line:
    """A line (or a block of lines) of the old script and what became of it."""

    line: int
    text: str
    why: str


@dataclass(kw_only=True)
class OldJob:
    """The request an old script makes, as far as it can be read."""

    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    gpu_type: str | None
    cpus_per_task: int | None
    mem_mb: float | None
    partition: str | None
    sbatch: dict[str, str | None]            # the carried options (CARRIED), as written
    launcher: str                            # our launcher name
    gpus_per_proc: int = 1
    launch_text: str = ""                    # the old launch line(s), as written
    script: str = ""
    args: tuple[str, ...] = ()
    expand_args: bool = False                # an argument expands a $NAME in the job
    accelerate_config: str | None = None
    container: str | None = None             # the image of 'singularity exec IMAGE' (not a wrapper)
    modules: list[Line] = field(default_factory=list)      # module commands (the target has its own)
    setup: list[Line] = field(default_factory=list)        # carried as --setup, as written
    env: list[tuple[str, str]] = field(default_factory=list)   # carried as --env
    replaced: list[Line] = field(default_factory=list)     # the new script computes these
    lost: list[Line] = field(default_factory=list)         # not carried over
    used_vars: set[str] = field(default_factory=set)       # $NAMEs the program's arguments read
    disk_gb: float | None = None             # node-local disk the old script asked (--gres=nvme:N)
    wheels: tuple[str, ...] = ()             # what the venv the old script built installed (pip names)
    env_problem: Line | None = None          # a step of that build port cannot carry (port needs --venv)


def _text(script: BatchScript, first: int, last: int) -> str:
    return "\n".join(script.lines[first - 1:last]).strip()


def _launch_of(cmd: Command, script: BatchScript) -> tuple[Invocation, Command] | None:
    """The invocation that starts training on this line (through ``bash -c "$VAR"`` too)."""
    inv = classify(cmd)
    if inv.kind == "shell" and inv.shell_body is not None:
        body = inv.shell_body.value
        m = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", body.strip())
        if m:   # srun bash -c "$RUN_CMD": the command is in a variable set earlier
            found = script.assignments().get(m.group(1))
            if not found:
                return None
            body = found[-1][0].value
        inner = split_commands(body, cmd.line)
        if len(inner) != 1:
            return None
        sub = classify(inner[0])
        if not sub.is_program:
            return None
        sub.srun = inv.srun
        return sub, cmd
    if inv.program == "horovodrun" and inv.program_word is not None:
        # horovodrun -np N [-H hosts] python train.py: MPI-style, one process per GPU
        rest = cmd.words[cmd.words.index(inv.program_word) + 1:]
        start = next((j for j, w in enumerate(rest) if os.path.basename(w.value).startswith("python")), None)
        if start is None:
            return None
        sub = classify(Command(words=rest[start:], line=cmd.line, end_line=cmd.end_line))
        sub.mpi = "horovodrun"
        return (sub, cmd) if sub.is_program else None
    if inv.is_program and (inv.srun is not None or inv.mpi is not None or inv.kind != "python"):
        return inv, cmd
    return None


def _launcher(inv: Invocation, tasks_per_node: int, gpn: int) -> tuple[str, int]:
    """Our launcher for the old form, and the GPUs each process drives."""
    if inv.kind == "torchrun":
        return "torchrun", 1
    if inv.kind == "accelerate":
        return "accelerate", 1
    if inv.kind == "deepspeed":
        return "deepspeed", 1
    if inv.kind == "scaletrain":
        return "scaletrain-run", 1
    if inv.mpi:   # mpirun/horovodrun start their processes themselves: one per GPU
        return "mpi", 1
    # python under srun: one task per process; a task may drive several GPUs
    per_proc = max(1, gpn // max(1, tasks_per_node)) if gpn else 1
    return "srun", per_proc


def _words_vars(words: list[Word]) -> set[str]:
    return {e.name for w in words for e in w.expansions if e.expands}


def recover(text: str, path: str = "<script>") -> OldJob:
    """Read ``text`` (a batch script) into an ``OldJob``; UsageError when it starts no training."""
    script = parse_script(text, path)
    refuse_lookalikes(script, path)
    refuse_unreadable(script, path)
    launches = [(i, found) for i, cmd in enumerate(script.commands)
                if (found := _launch_of(cmd, script)) is not None]
    if not launches:   # a bare 'python prog.py' (a one-GPU job): the one Python program the script runs
        launches = [(i, (inv, cmd)) for i, cmd in enumerate(script.commands)
                    if (inv := classify(cmd)).is_program and inv.kind == "python" and inv.script is not None]
    if not launches:
        refuse_inline(script, path, [c for c in script.commands if inline_program(c)])
        raise UsageError(f"{path}: no line that starts a Python training program (srun python, torchrun, "
                         "accelerate launch, deepspeed, mpirun)", HINT)
    if len(launches) > 1:
        lines = ", ".join(str(f[1].line) for _, f in launches)
        raise UsageError(f"{path}: {len(launches)} lines start training (lines {lines}); port handles one "
                         "training per script", "split the script, one training each, and port each part")
    index, (inv, cmd) = launches[0]
    refuse_inline(script, path, [cmd] if inline_program(cmd) else [])
    refuse_redirects(cmd, path)
    job = read_request(script)
    gpn = job.gpus_per_node or 0
    tpn = job.tasks_per_node
    if inv.script is None:
        raise UsageError(f"{path}:{cmd.line}: the launch line names no training script", HINT)
    launcher, per_proc = _launcher(inv, tpn, gpn)
    args = [inv.script, *inv.args]
    sbatch = {name: (o.value if (o := script.option(name)) else None) for name in CARRIED
              if script.option(name) is not None}
    script_word, arg_words = inv.script.value, tuple(w.value for w in inv.args)
    if module_launch(cmd, inv):    # python -m pkg.train: the plan's '-m' form
        script_word, arg_words = "-m", (inv.script.value, *arg_words)
    old = OldJob(nodes=job.node_count, gpus_per_node=gpn, tasks_per_node=tpn, gpu_type=job.gpu_type,
                 cpus_per_task=job.cpus_per_task, mem_mb=job.mem_mb, partition=job.partition, sbatch=sbatch,
                 launcher=launcher, gpus_per_proc=per_proc, launch_text=_text(script, cmd.line, cmd.end_line),
                 script=script_word, args=arg_words,
                 used_vars=_words_vars(args))
    old.expand_args = bool(old.used_vars)
    per_task = sorted(old.used_vars & set(PER_TASK_VARS))
    if per_task:
        raise UsageError(f"{path}:{cmd.line}: the program's arguments read ${per_task[0]}, which the batch shell "
                         "expands once for every task (the same value for all)",
                         "read it inside the program (os.environ), then port the script")
    for opt in script.options:
        if opt.name in ("requeue", "signal"):
            old.lost.append(Line(opt.line, opt.text, "requeueing: plan --requeue relays the signal to the "
                                 "tasks and requeues only when they saved (docs/long-jobs.md)"))
        elif opt.name not in CARRIED and opt.name not in RECOMPUTED:
            old.lost.append(Line(opt.line, opt.text, "an option of the old cluster's; not carried"))
        elif opt.name == "gres" and opt.value:
            for item in opt.value.split(","):
                kind, _, size = item.partition(":")
                if kind != "gpu":
                    old.disk_gb = float(size) if size.isdigit() else old.disk_gb
                    old.lost.append(Line(opt.line, opt.text, f"the request for {item}: the new cluster's "
                                         "node-local disk is asked its own way (see the changes)"))
    dropped = uncarried(cmd, inv)
    given = local_rank_argument(inv)
    if given is not None:
        old.lost.append(Line(cmd.line, "torch.distributed.launch", given))
    if dropped:
        old.lost.append(Line(cmd.line, " ".join(dropped), "on the old launch line; the new one, planned for the "
                             "target, does not write them: pass variables with --env, the rest with plan's flags"))
    if inv.kind == "accelerate":
        old.accelerate_config = inv.launcher_opts.get("config_file")
    if inv.container in ("singularity", "apptainer"):
        old.container = _image(cmd)
    _sort_lines(script, old, index, inv)
    if old.wheels and old.env_problem is None:
        # the venv the script built is the new job's now: activating it is replaced, not lost
        old.replaced += [Line(ln.line, ln.text, "the new job activates its own Python environment")
                         for ln in old.lost if ln.why == _OLD_ENV]
        old.lost = [ln for ln in old.lost if ln.why != _OLD_ENV]
    return old


def _image(cmd: Command) -> str | None:
    """The image of ``... singularity exec [opts] IMAGE prog``: the first word ending in .sif/.simg."""
    for w in cmd.words:
        if w.value.endswith((".sif", ".simg")):
            return w.value
    return None


def _sort_lines(script: BatchScript, old: OldJob, launch: int, inv: Invocation) -> None:
    """Sort every command but the launch: set-up, computed values, exports, carried, lost."""
    launch_cmd = script.commands[launch]
    launch_vars = _words_vars(launch_cmd.words) | _words_vars(list(inv.launcher_words.values()))
    assigned = script.assignments()
    body_var = None
    if inv.command is not launch_cmd:   # bash -c "$RUN_CMD": the variable and what it reads
        body_var = next(iter(_words_vars(launch_cmd.words)), None)
        if body_var in assigned:
            launch_vars |= {e.name for w, _ in assigned[body_var] for e in w.expansions}
    depth, block_start, block_first = 0, 0, 0
    shared, done_to = _shared_lines(script.commands), -1
    for i, cmd in enumerate(script.commands):
        first = cmd.words[0].value if cmd.words else ""
        if i <= done_to:
            continue    # on the line of a command before it, and sorted with it
        if not depth and first not in _COMPOUND_OPEN and i in shared:
            done_to = shared[i]
            _sort_shared(old, script, script.commands[i:done_to + 1], i, launch)
            continue
        if depth or first in _COMPOUND_OPEN:
            depth += (first in _COMPOUND_OPEN) - (first in _COMPOUND_CLOSE)
            if not block_start:
                block_start, block_first = cmd.line, i
            if depth == 0:
                block = Line(block_start, _text(script, block_start, cmd.end_line), "control flow")
                if block_first <= launch <= i:   # the training line is inside: it must not run twice
                    old.lost.append(Line(block.line, block.text, "control flow around the training line; "
                                         "the new script launches once, unconditionally"))
                else:
                    _carry_or_lose(old, block, after=i > launch)
                block_start = 0
            continue
        if i == launch:
            continue
        if cmd.heredocs:
            _heredoc(old, script, cmd, after=i > launch)
            continue
        text = _text(script, cmd.line, cmd.end_line)
        line = Line(cmd.line, text, "")
        if is_env_command(cmd) and i < launch:
            _env_build(old, line, partial(command_packages, cmd))
        elif first == "module":
            old.modules.append(line)
        elif (first in ("source", ".") and len(cmd.words) > 1 and _PYTHON_ENV.search(cmd.words[1].value)) \
                or (first == "conda" and "activate" in cmd.argv) or first == "eval" and "conda" in text:
            old.lost.append(Line(cmd.line, text, _OLD_ENV))
        elif _is_assignment(cmd):
            _assignment(old, cmd, line, launch_vars, body_var, after=i > launch)
        else:
            _carry_or_lose(old, line, after=i > launch)


def _shared_lines(commands: list[Command]) -> dict[int, int]:
    """First index -> last index of each run of commands that share a line (``a; b``, ``a && b``,
    ``a | b``): their text is the same lines, so they are carried (or not) as one."""
    out: dict[int, int] = {}
    i = 0
    while i < len(commands):
        j, end = i, commands[i].end_line
        while j + 1 < len(commands) and commands[j + 1].line <= end:
            j += 1
            end = max(end, commands[j].end_line)
        if j > i:
            out[i] = j
        i = j + 1
    return out


def _sort_shared(old: OldJob, script: BatchScript, members: list[Command], first: int, launch: int) -> None:
    """Commands that share their lines: once, as the lines' text (the training line's neighbours
    are listed: the new launch line replaces the whole line)."""
    line = Line(members[0].line, _text(script, members[0].line, max(c.end_line for c in members)), "")
    if first <= launch < first + len(members):
        old.lost.append(Line(line.line, line.text, "the other commands on the training line: the new launch line "
                             "replaces the whole line; put them on lines of their own and port again"))
    elif all(c.words and c.words[0].value == "module" for c in members):
        old.modules.append(line)
    elif any(c.heredocs for c in members):
        old.lost.append(Line(line.line, line.text, "a here-document on a line with other commands: add it "
                             "yourself (plan --setup, one line)"))
    else:
        _carry_or_lose(old, line, after=first > launch)


def _is_assignment(cmd: Command) -> bool:
    return (not cmd.words and bool(cmd.assignments)) or bool(cmd.words and cmd.words[0].value == "export")


def _assignment(old: OldJob, cmd: Command, line: Line, launch_vars: set[str], body_var: str | None,
                *, after: bool) -> None:
    pairs = [(n, w) for n, w in cmd.assignments] if not cmd.words else []
    for w in cmd.words[1:]:
        name, eq, _ = w.value.partition("=")
        if eq:
            pairs.append((name, Word(raw=w.raw.partition("=")[2], value=w.value.partition("=")[2],
                                     line=w.line, expansions=w.expansions)))
    names = {n for n, _ in pairs}
    if names and names <= (LAUNCH_VARS | launch_vars | {body_var}) - old.used_vars:
        old.replaced.append(Line(line.line, line.text, "the new launch line sets its own values"))
        return
    literal = (cmd.words and cmd.words[0].value == "export" and all(not w.expansions and "$" not in w.raw
                                                                     and "`" not in w.raw for _, w in pairs))
    if literal and not after:
        old.env += [(n, w.value) for n, w in pairs]
        return
    _carry_or_lose(old, line, after=after)


def _carry_or_lose(old: OldJob, line: Line, *, after: bool) -> None:
    if after:
        old.lost.append(Line(line.line, line.text, "runs after the training; the new script ends with it"))
        return
    joined = one_line(line.text)
    if joined is None:
        old.lost.append(Line(line.line, line.text, f"{why_not(line.text)} cannot be written as one line: add "
                             "it yourself (plan --setup, one line)"))
    else:
        old.setup.append(Line(line.line, joined, line.why))


def _env_build(old: OldJob, line: Line, packages: Callable[[], tuple[str, ...]]) -> None:
    """A step of the venv the old script built: its packages go to the new job's environment,
    or the step is kept as the reason port needs --venv."""
    try:
        found = packages()
    except NotCarried as exc:
        old.env_problem = old.env_problem or Line(line.line, line.text, str(exc))
        old.lost.append(Line(line.line, line.text, f"the Python environment the old script built: {exc}"))
        return
    old.wheels = tuple(dict.fromkeys([*old.wheels, *found]))
    what = f"installs {' '.join(found)}" if found else "makes the venv"
    old.replaced.append(Line(line.line, line.text, f"the old script's venv ({what}): the new job's Python "
                             "environment replaces it, with the same packages"))


def _heredoc(old: OldJob, script: BatchScript, cmd: Command, *, after: bool) -> None:
    """A command with a here-document: one line (``printf '%s\\n' LINES | command``) that feeds
    the command the same text, or listed as not carried."""
    body = cmd.heredocs[-1]
    end = body.line + (len(body.body.split("\n")) if body.body else 0)   # the delimiter's line
    text = _text(script, cmd.line, end)
    if after:
        old.lost.append(Line(cmd.line, text, "runs after the training; the new script ends with it"))
        return
    if ENV_BUILD.search(body.body):
        _env_build(old, Line(cmd.line, text, ""), lambda: heredoc_packages(body.body, body.line))
        return
    joined = heredoc_line(script.lines[cmd.line - 1], body.body, quoted=body.quoted) \
        if len(cmd.heredocs) == 1 and cmd.end_line == cmd.line else None
    if joined is None:
        old.lost.append(Line(cmd.line, text, "a here-document that cannot be written as one line: add it "
                             "yourself (plan --setup, one line)"))
        return
    old.setup.append(Line(cmd.line, joined, "here-document"))
