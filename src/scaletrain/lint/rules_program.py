"""Rules about what the job runs: its precision against the GPU, its GPU request, each task's view
of the node's GPUs, and shell constructs that look like a check but do not stop the job.

Some of these read the training program itself when it sits beside the script (``train.py`` next
to ``job.sh``): ``precision="bf16"`` and the choice of a GPU per process live there, not in the
batch script. A program lint cannot find is not guessed at.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from typing import Iterable

from scaletrain.errors import UsageError
from scaletrain.fileio import read_user_file
from scaletrain.lint.findings import ERROR, WARNING, Finding, LintContext, Step, finding, rule
from scaletrain.lint.fixes import per_task_shell_line
from scaletrain.lint.invocation import classify
from scaletrain.lint.rules_launch import step_tasks_per_node
from scaletrain.lint.shell import split_commands
from scaletrain.lint.words import ASSIGN_RE, Command, assignment_value

PROGRAM_MAX_BYTES = 1 << 20   # a training program of more than 1 MiB is generated; not read

# GPUs without native bfloat16 (it came with NVIDIA Ampere and AMD CDNA): Volta, Pascal, Turing,
# Kepler and Vega. torch emulates some bf16 ops there, slowly, and frameworks refuse it
# (Accelerate and Lightning check torch.cuda.is_bf16_supported()).
_NO_BF16 = re.compile(r"\b(v100|p100|p40|p4|t4|k80|k40|titan ?v|gtx ?1\d{3}|rtx ?20\d0|quadro|mi50|mi60|"
                      r"mi25|vega)\b", re.IGNORECASE)
# How a job asks for bf16: Accelerate/Lightning/HF flags, Lightning's precision="bf16-mixed",
# a DeepSpeed config's "bf16": {"enabled": true}, torch.bfloat16 autocast.
_BF16_ASKED = re.compile(
    r"mixed[_-]precision[\s=:]+[\"']?bf16"
    r"|\bprecision\s*[=:]\s*[\"']?bf16"
    r"|--precision[\s=]+[\"']?bf16"
    r"|--bf16\b(?![\s=]+(?:false|0)\b)"
    r"|[\"']bf16[\"']\s*:\s*\{[^{}]*[\"']enabled[\"']\s*:\s*true"
    r"|dtype\s*=\s*torch\.bfloat16",
    re.IGNORECASE)
# Signs that a program chooses its own GPU from its local rank (or leaves it to a library that does).
_PICKS_GPU = re.compile(r"LOCAL_RANK|SLURM_LOCALID|local_rank|set_device|scaletrain|Accelerator|"
                        r"PartialState|lightning|deepspeed|device_ids|MPI\.COMM|hvd\.local_rank|"
                        r"cuda:\{|visible_devices", re.IGNORECASE)
_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def program_text(ctx: LintContext, step: Step) -> str | None:
    """The text of the Python file ``step`` runs, read when it sits beside the script; else None."""
    word = step.invocation.script
    if word is None or word.expansions or not word.value.endswith(".py"):
        return None
    base = os.path.dirname(os.path.abspath(ctx.script.path)) if ctx.script.path != "<script>" else None
    if base is None:
        return None
    path = os.path.join(base, word.value)
    if not os.path.exists(path):
        return None
    try:                # the rules of every user file: a pipe or device is not waited on
        data = read_user_file(path, what="a program", hint="", limit=PROGRAM_MAX_BYTES)
    except UsageError:
        return None     # not read: the rules that need it stay silent, as for a generated one
    return data.decode("utf-8", errors="replace")


def python_code(source: str) -> str:
    """``source`` without its comments: a comment that mentions ROCR_VISIBLE_DEVICES is not code
    that picks a GPU. A file Python cannot tokenize loses what follows a ``#`` on each line."""
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                  if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, SyntaxError, ValueError):
        return "\n".join(line.split("#", 1)[0] for line in source.splitlines())


def _script_code(ctx: LintContext) -> list[tuple[int, str]]:
    """(line, text) of every line of the script that is not a comment (heredoc bodies included)."""
    return [(n, line) for n, line in enumerate(ctx.script.lines, start=1)
            if not line.lstrip().startswith("#")]


def _gpu_model(ctx: LintContext) -> str | None:
    """The GPU the job runs on: the type it asks for, else the profile's model."""
    if ctx.job.gpu_type:
        return ctx.job.gpu_type
    if ctx.profile is not None and ctx.profile.gpus_per_node > 0:
        return ctx.profile.gpu_model
    return None


@rule("bf16-unsupported", "bf16 asked for on GPUs without native bfloat16 (V100, P100 and older)")
def bf16_unsupported(ctx: LintContext) -> Iterable[Finding]:
    model = _gpu_model(ctx)
    if not model or not _NO_BF16.search(model):
        return
    hint = "use fp16 (--mixed_precision=fp16, precision=\"16-mixed\", a DeepSpeed \"fp16\" block), or run on A100/H100/MI250"
    why = (f"the job runs on {model}, which has no native bfloat16: frameworks refuse it "
           "(torch.cuda.is_bf16_supported() is False) or emulate it many times slower")
    for number, line in _script_code(ctx):
        m = _BF16_ASKED.search(line)
        if m:
            yield finding("bf16-unsupported", WARNING, number, f"{m.group(0).strip()} asks for bf16, but {why}", hint)
            return
    text = ctx.script.text   # a DeepSpeed block spread over several lines of a here-document
    m = _BF16_ASKED.search(text)
    if m:
        yield finding("bf16-unsupported", WARNING, text[:m.start()].count("\n") + 1,
                      f"a bf16 block asks for bf16, but {why}", hint)
        return
    for step in ctx.steps:
        source = program_text(ctx, step) if step.invocation.is_program else None
        m = _BF16_ASKED.search(source or "")
        if m:
            yield finding("bf16-unsupported", WARNING, step.line,
                          f"{step.invocation.script.value} asks for bf16 ({m.group(0).strip()}), "  # type: ignore[union-attr]
                          f"but {why}", hint)
            return


def _gpu_partition(ctx: LintContext) -> bool:
    """The job names a GPU partition: the profile says so, or (without one) its name has 'gpu'."""
    name = ctx.job.partition
    if not name:
        return False
    if ctx.profile is not None and ctx.partition is not None:
        return ctx.partition.gpus
    return re.search(r"(^|[-_])gpu|gpu($|[-_])|-g$", name, re.IGNORECASE) is not None


@rule("gpu-not-requested", "a program started on a GPU partition without asking for any GPU")
def gpu_not_requested(ctx: LintContext) -> Iterable[Finding]:
    if ctx.job.gpus or not _gpu_partition(ctx):
        return
    if any(o.name in ("gpus-per-task", "ntasks-per-gpu", "gres") for o in ctx.script.options):
        return
    step = next((s for s in ctx.steps if s.invocation.is_program), None)
    if step is None:
        return
    size = ctx.profile.gpus_per_node if ctx.profile is not None and ctx.profile.gpus_per_node else None
    yield finding("gpu-not-requested", WARNING, ctx.option_line("partition"),
                  f"partition '{ctx.job.partition}' is a GPU partition, but the job asks for no GPU: "
                  f"Slurm gives it none, and '{step.invocation.program}' (line {step.line}) runs on the CPU "
                  "or fails to find a device",
                  f"#SBATCH --gpus-per-node={size or 'N'} (or the cluster's --gres form); "
                  "a CPU-only job belongs on a CPU partition")


def _per_task_devices(ctx: LintContext) -> bool:
    """The script narrows each task's GPUs itself (a per-task CUDA/ROCR_VISIBLE_DEVICES, a site
    wrapper such as LUMI's select_gpu) or asks Slurm to (--gpus-per-task, --gpu-bind).

    Read from the commands, never from the text: a comment or an ``echo`` that mentions
    ``CUDA_VISIBLE_DEVICES=$SLURM_LOCALID`` narrows nothing."""
    for name in ("gpus-per-task", "gpu-bind", "ntasks-per-gpu", "tres-bind"):
        if ctx.script.option(name) is not None:
            return True
    for step in ctx.steps:
        srun = step.invocation.srun
        if srun is not None and any(k in srun.options for k in ("gpus-per-task", "gpu-bind", "ntasks-per-gpu")):
            return True
    commands = list(ctx.script.commands)
    for cmd in ctx.script.commands:   # a bash -c body, a wrapper script written by a heredoc
        inv = classify(cmd)
        if inv.kind == "shell" and inv.shell_body is not None:
            commands += ctx.shell_body_commands(inv.shell_body)
        for hd in cmd.heredocs:
            commands += split_commands(hd.body, first_line=hd.line, heredoc_quote="bare")
    # the variable escaped inside a double-quoted bash -c "..." (LUMI's guides:
    # ROCR_VISIBLE_DEVICES=\$SLURM_LOCALID) is expanded by each task's shell, as it must be
    return any(_sets_device_per_task(cmd) or _runs_gpu_wrapper(cmd) for cmd in commands)


_LOCAL_RANK_VARS = {"SLURM_LOCALID", "LOCAL_RANK", "SLURM_PROCID", "MPI_LOCALRANKID",
                    "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK"}
_GPU_WRAPPER = re.compile(r"select_gpu|gpu_bind|\bselect-gpu")


def _sets_device_per_task(cmd: Command) -> bool:
    """``CUDA_VISIBLE_DEVICES=$SLURM_LOCALID`` as an assignment: before a command, alone, or
    given to ``export``/``env``/``declare`` (not as text an ``echo`` prints)."""
    pairs = list(cmd.assignments)
    if cmd.words and cmd.words[0].value in ("export", "env", "declare", "typeset", "readonly", "local"):
        pairs += [(m.group(1), assignment_value(w)) for w in cmd.words[1:]
                  if (m := ASSIGN_RE.match(w.raw))]
    return any(name in _DEVICE_VARS and any(e.name in _LOCAL_RANK_VARS for e in value.expansions)
               for name, value in pairs)


def _runs_gpu_wrapper(cmd: Command) -> bool:
    """A command that runs or writes a site's GPU-selection wrapper (LUMI's ``select_gpu``)."""
    return any(_GPU_WRAPPER.search(w.value) for w in cmd.words)


@rule("gpus-shared-by-tasks", "several tasks per node that all see every GPU, with a program that "
      "does not choose its own")
def gpus_shared_by_tasks(ctx: LintContext) -> Iterable[Finding]:
    gpn = ctx.job.gpus_per_node
    if not gpn or gpn < 2 or _per_task_devices(ctx):
        return
    for step in ctx.steps:
        inv = step.invocation
        if inv.kind != "python" or not step.under_srun or step_tasks_per_node(ctx, step) < 2:
            continue
        source = program_text(ctx, step)
        if source is None or _PICKS_GPU.search(python_code(source)):
            continue   # a program lint cannot read is not guessed at
        tpn = step_tasks_per_node(ctx, step)
        yield finding("gpus-shared-by-tasks", WARNING, step.line,
                      f"srun starts {tpn} tasks per node and each sees all {gpn} GPUs, but "
                      f"{inv.script.value} never picks one by its local rank: every task "  # type: ignore[union-attr]
                      "computes on the first GPU and the others stay idle",
                      _one_gpu_per_task_hint(ctx, step))
        return


def _one_gpu_per_task_hint(ctx: LintContext, step: Step) -> str:
    """Give each task the GPU of its local rank: the srun line rewritten to set the visible
    devices in each task's own shell (:mod:`scaletrain.lint.fixes`), or the same in words."""
    amd = ctx.profile is not None and ctx.profile.gpu_vendor == "amd"
    var = "ROCR_VISIBLE_DEVICES" if amd else "CUDA_VISIBLE_DEVICES"
    line = None if step.via_shell else per_task_shell_line(step.invocation.command,
                                                           before=f"{var}=\\$SLURM_LOCALID exec ")
    where = (f"write the line as: {line}" if line is not None else
             f"set {var}=\\$SLURM_LOCALID in each task's shell: srun bash -c \"{var}=\\$SLURM_LOCALID "
             "exec python ...\"")
    return (f"give each task the GPU of its local rank; {where} (or #SBATCH --gpus-per-task=1; "
            "scaletrain.init() picks the GPU from SLURM_LOCALID)")


def _programs_never_read(ctx: LintContext, name: str) -> list[str]:
    """The programs the job runs, when lint can read every one and none of them mentions
    ``name`` in its code; else [] (a program lint cannot read may read anything)."""
    names = []
    for step in ctx.steps:
        if not step.invocation.is_program:
            continue
        source = program_text(ctx, step)
        if source is None or name in python_code(source):
            return []
        names.append(step.invocation.script.value)  # type: ignore[union-attr]
    return names


@rule("local-world-size", "LOCAL_WORLD_SIZE set to the whole job's size on more than one node")
def local_world_size(ctx: LintContext) -> Iterable[Finding]:
    nodes = ctx.job.node_count
    if nodes <= 1:
        return
    for word, _cmd in ctx.variables.get("LOCAL_WORLD_SIZE", []):
        m = re.fullmatch(r"[\"']?\$\{?(WORLD_SIZE|SLURM_NTASKS|SLURM_NPROCS)\}?[\"']?", word.raw.strip())
        if not m:
            continue
        unread = _programs_never_read(ctx, "LOCAL_WORLD_SIZE")
        # a wrong value nothing in the program reads is a trap for later, not a wrong result now
        severity, effect = ((WARNING, f"{', '.join(unread)} never reads it, but a library or a "
                             "later version may") if unread
                            else (ERROR, "programs then compute wrong local ranks"))
        yield finding("local-world-size", severity, word.line,
                      f"LOCAL_WORLD_SIZE=${m.group(1)} on a {nodes}-node job: the local world is "
                      f"the processes of one node, {ctx.job.tasks_per_node} here, not the "
                      f"{ctx.job.total_tasks} of the whole job; {effect}",
                      "LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE (or leave it to the launcher)")


# `cmd || (echo ...; exit 1)`, `if ...; then (echo ...; exit 1); fi`: the parentheses make a
# subshell, so exit ends only the subshell.
_SUBSHELL_EXIT = re.compile(r"(\|\||&&|\bthen\b|\belse\b)\s*\((?!\()"
                            r"((?:[^()'\"]|'[^']*'|\"[^\"]*\")*?)\bexit\b")


@rule("subshell-exit", "an exit inside parentheses after a failed check (a subshell): the job goes on")
def subshell_exit(ctx: LintContext) -> Iterable[Finding]:
    from scaletrain.lint.rules_sbatch import heredoc_lines

    skip = heredoc_lines(ctx)
    text = ctx.script.text
    for m in _SUBSHELL_EXIT.finditer(text):
        number = text[:m.start()].count("\n") + 1
        line = ctx.script.lines[number - 1]
        if number in skip or line.lstrip().startswith("#") or "#" in line[:line.find(m.group(1))]:
            continue
        yield finding("subshell-exit", ERROR, number,
                      f"'{m.group(1)} ( ... exit )' exits only the subshell the parentheses start: "
                      "the check fails and the job goes on",
                      "use braces, which run in the same shell: cmd || { echo '...' >&2; exit 1; } "
                      "(after then/else the parentheses can simply go)")
