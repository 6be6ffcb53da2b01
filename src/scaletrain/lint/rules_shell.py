"""Rules about the script as shell text: where variables expand, #SBATCH placement, syntax.

The batch script runs once, on the first node. Anything it expands (``$SLURM_NODEID`` in a
double-quoted ``srun bash -c "..."`` body, say) is that node's value, copied to every task.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Iterable, Iterator

from scaletrain.lint.findings import ERROR, WARNING, Finding, LintContext, finding, rule
from scaletrain.lint.fixes import PER_TASK, per_task_shell_line
from scaletrain.lint.invocation import Invocation, classify
from scaletrain.lint.job import parse_int
from scaletrain.lint.script import Command, Word, interpreter

# Variables a user passes to a program expecting their value (besides SLURM_* and the script's own).
_COMMON_ENV = {"HOME", "USER", "PWD", "TMPDIR", "LOCAL_SCRATCH", "SCRATCH", "PROJAPPL",
               "WORK", "PROJECT", "HOSTNAME", "PATH", "MASTER_ADDR", "MASTER_PORT"}
# Programs that read ``$`` themselves: a single-quoted ``$X`` there is meant literally.
_LITERAL_OK = {"awk", "gawk", "mawk", "sed", "perl", "printf", "grep", "egrep", "find", "xargs",
               "trap", "alias", "eval", "envsubst", "jq", "ssh", "sbatch", "parallel", "watch",
               "expect", "cat", "tee", "sh", "bash", "zsh", "dash", "ksh"}
_DEVICES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def _srun_words(ctx: LintContext) -> Iterator[tuple[Word, Command, Invocation]]:
    """Every word of every srun command line, with its command."""
    for cmd in ctx.script.commands:
        inv = classify(cmd)
        if inv.srun is None:
            continue
        for w in cmd.words:
            yield w, cmd, inv


def _in_shell_body(word: Word, inv: Invocation) -> bool:
    """True when ``word`` is the body of ``srun bash -c BODY``: escaping inside its double
    quotes leaves the variable to each task's shell."""
    return inv.kind == "shell" and inv.shell_body is word


def _line_hint(name: str, cmd: Command, inv: Invocation) -> str:
    """The fix for a per-task variable on an srun line: the line rewritten to run in a shell of
    each task (:mod:`scaletrain.lint.fixes`), or, where it cannot be, the same in words."""
    line = per_task_shell_line(cmd)
    also = (" (or drop --node_rank and let torchrun's c10d rendezvous number the nodes: "
            "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29400 --rdzv_id=$SLURM_JOB_ID)"
            if inv.kind == "torchrun" and name == "SLURM_NODEID" else "")
    if line is None:
        return (f"let each task's own shell expand it: srun bash -c \"... \\${name} ...\" (the "
                f"command in double quotes, only \\${name} escaped){also}")
    return f"let each task's own shell expand it{also}; write the line as: {line}"


@rule("early-expansion", "a per-task variable ($SLURM_NODEID/$SLURM_PROCID/$SLURM_LOCALID) "
      "expanded by the batch shell for srun")
def early_expansion(ctx: LintContext) -> Iterable[Finding]:
    used_in_srun: dict[str, int] = {}
    for word, cmd, inv in _srun_words(ctx):
        for e in word.expansions:
            if e.expands:
                used_in_srun.setdefault(e.name, cmd.line)
            if e.name in PER_TASK and e.expands:
                hint = (f"escape it (\\${e.name}) inside the double quotes"
                        if _in_shell_body(word, inv) and e.quote == "double"
                        else _line_hint(e.name, cmd, inv))
                yield finding("early-expansion", ERROR, e.line,
                              f"${e.name} is expanded by the batch shell on the first node before srun "
                              f"starts the tasks: every task gets that node's value", hint)
        for hd in cmd.heredocs:
            for e in hd.expansions:
                if e.name in PER_TASK and e.expands:
                    yield finding("early-expansion", ERROR, e.line,
                                  f"${e.name} in an unquoted here-document is expanded by the batch "
                                  f"shell before srun starts the tasks",
                                  f"quote the delimiter (<<'EOF') or escape it (\\${e.name})")
    for name, entries in ctx.variables.items():
        if name not in used_in_srun:
            continue
        for word, _cmd in entries:
            for e in word.expansions:
                if e.name in PER_TASK and e.expands:
                    yield finding("early-expansion", ERROR, e.line,
                                  f"${e.name} is expanded when {name} is assigned, on the first node; "
                                  f"srun (line {used_in_srun[name]}) passes that one value to every task",
                                  f"set {name} in each task instead: srun bash -c \"{name}=\\${e.name}; "
                                  f"... \\${name} ...\" (the command in double quotes, the $ of both "
                                  "escaped)")


@rule("single-quoted-var", "a $VARIABLE inside single quotes passed to a program (never expanded)")
def single_quoted_var(ctx: LintContext) -> Iterable[Finding]:
    known = set(ctx.variables) | _COMMON_ENV
    for cmd in ctx.script.commands:
        inv = classify(cmd)
        if not cmd.words or inv.kind == "shell" or inv.program in _LITERAL_OK \
                or cmd.words[0].value in _LITERAL_OK or cmd.words[0].value in ("export", "local", "declare"):
            continue
        if inv.program.startswith("python") and any(w.value == "-c" for w in cmd.words):
            continue
        echo = inv.program == "echo" or cmd.words[0].value == "echo"
        previous = ""
        for word in cmd.words:
            # a rendezvous id only has to be the same text on every node: the literal works
            same_everywhere = _RDZV_ID.match(word.value) is not None or previous in _RDZV_ID_OPTS
            severity = WARNING if echo or same_everywhere else ERROR
            previous = word.value
            for e in word.expansions:
                wanted = e.name.startswith("SLURM_") or (e.name in known and not echo)
                if e.quote == "single" and wanted:
                    why = (" (it works as a rendezvous id, since every node passes the same text, but "
                           "every job then shares that id)" if same_everywhere else "")
                    yield finding("single-quoted-var", severity, e.line,
                                  f"'${e.name}' is in single quotes: the program receives the text "
                                  f"'${e.name}', not its value{why}",
                                  f"use double quotes: \"${e.name}\"")


_RDZV_ID_OPTS = {"--rdzv_id", "--rdzv-id", "--run_id", "--run-id"}
_RDZV_ID = re.compile(r"--(rdzv[_-]id|run[_-]id)=")


_TCP_PORT = re.compile(r"tcp://[^\s/:]+:(\d+)")


@rule("master-port", "a fixed rendezvous port (MASTER_PORT, --master_port, tcp://HOST:PORT) "
      "on nodes other jobs share")
def master_port(ctx: LintContext) -> Iterable[Finding]:
    from scaletrain.contract.environ import PORT_SHELL_EXPR

    if ctx.whole_nodes or not ctx.shares_nodes:
        return    # no other job runs on these nodes (or lint cannot tell): nothing to collide with
    hint = f"derive it from the job id: MASTER_PORT={PORT_SHELL_EXPR}"
    collide = "two jobs sharing a node collide"
    for word, _cmd in ctx.variables.get("MASTER_PORT", []):
        if word.value.strip().isdigit():
            yield finding("master-port", WARNING, word.line,
                          f"MASTER_PORT={word.value.strip()} is fixed: {collide}", hint)
    for step in ctx.steps:
        inv = step.invocation
        for key in ("master_port", "main_process_port"):
            value = inv.launcher_opts.get(key)
            if value and value.isdigit():
                yield finding("master-port", WARNING, inv.launcher_words[key].line,
                              f"--{key}={value} is fixed: {collide}", hint)
    for cmd in ctx.script.commands:
        for word in cmd.words + [w for _n, w in cmd.assignments]:
            m = _TCP_PORT.search(word.value)
            if m:
                yield finding("master-port", WARNING, word.line,
                              f"port {m.group(1)} in {m.group(0)} is fixed: {collide}",
                              f"{hint}, and pass tcp://...:$MASTER_PORT")


@rule("visible-devices", "CUDA_VISIBLE_DEVICES (or ROCR/HIP) naming GPUs the job lacks, or hiding some it has")
def visible_devices(ctx: LintContext) -> Iterable[Finding]:
    # Listing every allocated GPU (0..N-1) is harmless, and some centres ask for it (JSC's
    # JUWELS guides export CUDA_VISIBLE_DEVICES=0,1,2,3): only a list that differs is reported.
    gpn = ctx.job.gpus_per_node
    for name in _DEVICES:
        for word, _cmd in ctx.variables.get(name, []):
            value = word.value.strip()
            if word.expansions:
                continue
            ids = [p.strip() for p in value.split(",") if p.strip()]
            nums = [n for n in (parse_int(p) for p in ids if p.isdigit()) if n is not None]
            if gpn and (len(ids) > gpn or any(n >= gpn for n in nums)):
                yield finding("visible-devices", ERROR, word.line,
                              f"{name}={value} names devices outside the {gpn} GPU(s) per node the job "
                              "asks for (Slurm numbers the allocated GPUs from 0)",
                              f"list only 0..{gpn - 1}, or ask for {len(ids)} GPUs per node")
            elif not gpn and ids:
                yield finding("visible-devices", WARNING, word.line,
                              f"{name}={value} but the job asks for no GPUs", "request GPUs, or remove it")
            elif gpn and len(nums) == len(ids) and sorted(set(nums)) == list(range(gpn)):
                continue
            elif gpn and not ids:
                yield finding("visible-devices", WARNING, word.line,
                              f"{name} is empty: the program sees none of the {gpn} GPU(s) per node "
                              "the job asks for", "remove the line, or ask for no GPUs")
            elif gpn:
                yield finding("visible-devices", WARNING, word.line,
                              f"{name}={value} shows {len(ids)} of the {gpn} GPUs per node the job "
                              "asks for: the others stay idle",
                              f"{name}={','.join(str(i) for i in range(gpn))} (or leave it to Slurm), "
                              f"or ask for {len(ids)} GPUs per node")


def _merge_marker_lines(ctx: LintContext) -> list[int]:
    return [n for n, line in enumerate(ctx.script.lines, start=1)
            if re.match(r"(<{7}|>{7})( |$)", line)]


@rule("merge-conflict", "unresolved merge-conflict markers")
def merge_conflict(ctx: LintContext) -> Iterable[Finding]:
    for number in _merge_marker_lines(ctx):
        if ctx.script.lines[number - 1].startswith("<<<<<<<") or not any(
                ln.startswith("<<<<<<<") for ln in ctx.script.lines):
            yield finding("merge-conflict", ERROR, number,
                          "unresolved merge conflict (<<<<<<< ... >>>>>>>)",
                          "keep one side, delete the markers, and lint again")


# A template's blank to fill in: <project>, <options>, python/<select version>. Not a
# redirection (<file >out: the text before '>' ends in a space) nor a here-document (<<).
_PLACEHOLDER = re.compile(r"(?<![<\w$])<([A-Za-z][^<>\n$|&;()`]*[A-Za-z0-9_.-])>(?!>)")


def _mask_single_quoted(line: str) -> str:
    """``line`` with what single quotes enclose blanked out (same length): a quoted word is a
    literal value (scaletrain quotes every user value so), not a blank the guide left."""
    out, state, escaped = [], "", False
    for ch in line:
        if state == "'":
            if ch == "'":
                state = ""
                out.append(ch)
            else:
                out.append(" ")
            continue
        out.append(ch)
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            state = "" if state == '"' else '"'
        elif ch == "'" and state == "":
            state = "'"
    return "".join(out)


def placeholder_lines(ctx: LintContext) -> list[tuple[int, str]]:
    """(line, placeholder) of every line that still holds a template's blank."""
    from scaletrain.lint.rules_sbatch import heredoc_lines

    skip = heredoc_lines(ctx)      # program text (python: i<n and j>0) is not the template's
    out = []
    for number, line in enumerate(ctx.script.lines, start=1):
        stripped = line.lstrip()
        if number in skip or stripped.startswith(("echo ", "printf ")):
            continue   # text for people, not a command
        if stripped.startswith("#") and not line.startswith("#SBATCH"):
            continue   # a comment may show <options> as documentation
        m = _PLACEHOLDER.search(_mask_single_quoted(line) if "'" in line else line)
        if m:
            out.append((number, line[m.start():m.end()]))
        elif line.startswith("#SBATCH"):
            dots = _DOTS_VALUE.search(line)
            if dots:
                out.append((number, dots.group(0).strip()))
    return out


# An #SBATCH value left as an ellipsis (--partition=..., --account=…): the guide's blank.
_DOTS_VALUE = re.compile(r"(?:\s|^)(--?[A-Za-z][\w-]*[= ]\s*(?:\.{3}|\u2026))(?=\s|$|#)")


@rule("placeholder", "a template placeholder left in (<project>, <options>)")
def placeholder(ctx: LintContext) -> Iterable[Finding]:
    found = placeholder_lines(ctx)
    if found:
        number, text = found[0]
        more = f" and {len(found) - 1} more line(s)" if len(found) > 1 else ""
        yield finding("placeholder", ERROR, number,
                      f"template placeholder {text} is still in the script{more}: "
                      "it cannot run until each one is filled in",
                      f"replace {text} with the real value (and lint again)")


# Commands that exist on any Linux/Slurm system (what a rendezvous line reasonably calls).
_STANDARD = {"python", "python3", "shuf", "expr", "echo", "seq", "scontrol", "hostname", "awk",
             "sed", "head", "tail", "cut", "printf", "comm", "ss", "netstat", "od", "date", "id",
             "tr", "sort", "uniq", "grep", "getent", "nslookup", "host", "dig", "ip", "ifconfig",
             "squeue", "sinfo", "srun", "perl", "bash", "sh", "wc", "cat", "basename", "dirname",
             "whoami", "nproc", "true", "mktemp", "readlink", "realpath", "hostnamectl"}
_RDZV_VARS = ("MASTER_PORT", "MASTER_ADDR", "RDZV_HOST", "RDZV_PORT", "MAIN_NODE")
_CALLED = re.compile(r"(?:\$\(|`)\s*([A-Za-z_][\w.-]*)")


@rule("site-command", "a rendezvous value from a command that is neither standard nor defined "
      "in the script (another centre's shell function)")
def site_command(ctx: LintContext) -> Iterable[Finding]:
    from scaletrain.contract.environ import PORT_SHELL_EXPR

    text = ctx.script.text
    for name in _RDZV_VARS:
        for word, _cmd in ctx.variables.get(name, []):
            for called in _CALLED.findall(word.raw):
                if called in _STANDARD or "/" in called or called.startswith("python"):
                    continue
                if re.search(rf"(^|\n)\s*(function\s+{re.escape(called)}\b|{re.escape(called)}\s*\(\s*\))", text):
                    continue   # defined in the script itself
                yield finding("site-command", WARNING, word.line,
                              f"{name} comes from '{called}', which is not a standard command and is "
                              "not defined in this script: a shell function of one centre's "
                              f"environment; elsewhere it fails and {name} is empty",
                              "define it in the script, or compute the value with standard tools "
                              f"(e.g. MASTER_PORT={PORT_SHELL_EXPR})")


@rule("bash-syntax", "a shell syntax error (bash -n)")
def bash_syntax(ctx: LintContext) -> Iterable[Finding]:
    if _merge_marker_lines(ctx) or placeholder_lines(ctx):
        return   # the markers/placeholders are the syntax error; their own rules say it better
    base = interpreter(ctx.script.shebang) or "bash"
    exe = shutil.which("bash") if base not in ("sh", "dash", "zsh", "ksh") else shutil.which(base)
    exe = exe or shutil.which("bash")
    if exe is None:
        return
    try:
        proc = subprocess.run([exe, "-n"], input=ctx.script.text, capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    seen: set[int] = set()
    for line in proc.stderr.splitlines():
        m = re.search(r"line (\d+): (.*)", line)
        if not m or int(m.group(1)) in seen:
            continue
        seen.add(int(m.group(1)))
        yield finding("bash-syntax", ERROR, int(m.group(1)), f"{base}: {m.group(2)}",
                      "fix the shell syntax (check quotes, 'fi'/'done', and <placeholders> left in)")
