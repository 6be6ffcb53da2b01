"""Rules about the ``#SBATCH`` header and the file itself: placement, spelling, sbatch's refusals."""

from __future__ import annotations

import difflib
import re
from typing import Iterable

from scaletrain.lint.findings import ERROR, WARNING, Finding, LintContext, finding, rule
from scaletrain.lint.lookalike import HINT as LOOKALIKE_HINT
from scaletrain.lint.lookalike import line_lookalike, script_lookalikes
from scaletrain.slurm.parse import parse_mem_mib, parse_time_seconds

# sbatch's long options (Slurm 23-24 man page). sbatch also takes any unambiguous prefix.
SBATCH_OPTIONS = frozenset("""
account acctg-freq array batch bb bbf begin chdir cluster-constraint
clusters comment constraint container container-id contiguous core-spec cores-per-socket cpu-freq
cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution error exclude exclusive
export export-file extra extra-node-info get-user-env gid gpu-bind gpu-freq gpus
gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs
input job-name kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind
mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist
nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket open-mode output overcommit
oversubscribe parsable partition power prefer priority profile propagate qos
quiet reboot requeue reservation resv-ports segment signal sockets-per-node spread-job
stepmgr switches test-only thread-spec threads-per-core time time-min tmp tres-bind
tres-per-task uid usage use-min-nodes verbose version wait wait-all-nodes wckey
wrap x11 immediate
""".split())


# Options that Slurm plugins (SPANK) add to sbatch at some sites: valid where the plugin is
# installed, so they are not typos. NERSC's Shifter; NVIDIA's Pyxis (enroot containers).
PLUGIN_OPTIONS = {
    "image": "Shifter", "module": "Shifter", "volume": "Shifter",
    "container-image": "Pyxis", "container-mounts": "Pyxis", "container-workdir": "Pyxis",
    "container-name": "Pyxis", "container-save": "Pyxis", "container-mount-home": "Pyxis",
    "no-container-mount-home": "Pyxis", "container-remap-root": "Pyxis",
    "no-container-remap-root": "Pyxis", "container-writable": "Pyxis",
    "container-readonly": "Pyxis", "container-env": "Pyxis", "container-entrypoint": "Pyxis",
    "no-container-entrypoint": "Pyxis",
}


@rule("sbatch-option", "an #SBATCH option sbatch does not know (a warning: the list may lag Slurm)")
def sbatch_option(ctx: LintContext) -> Iterable[Finding]:
    for opt in ctx.script.options:
        if len(opt.name) == 1 or opt.name in SBATCH_OPTIONS or opt.name in PLUGIN_OPTIONS:
            continue
        prefixed = [o for o in SBATCH_OPTIONS if o.startswith(opt.name)]
        if len(prefixed) == 1:
            continue   # getopt accepts an unambiguous abbreviation
        # only a near spelling is worth suggesting: "--image" is not a typo of "--time"
        close = difflib.get_close_matches(opt.name, sorted(SBATCH_OPTIONS), n=1, cutoff=0.8)
        what = "ambiguous (" + ", ".join(sorted(prefixed)[:4]) + ")" if prefixed else "unknown"
        yield finding("sbatch-option", WARNING, opt.line,
                      f"--{opt.name} is {what} as an sbatch option: sbatch refuses to submit a script "
                      "with one, unless a plugin of the site adds it",
                      f"did you mean --{close[0]}?" if close else
                      "check 'man sbatch' and the site's documentation")


def heredoc_lines(ctx: LintContext) -> set[int]:
    """Line numbers inside here-document bodies (text for another program, not commands)."""
    lines: set[int] = set()
    for cmd in ctx.script.commands:
        for hd in cmd.heredocs:
            lines.update(range(hd.line, hd.line + hd.body.count("\n") + 1))
    return lines


@rule("sbatch-after-command", "an #SBATCH line after the first command (Slurm ignores it)")
def sbatch_after_command(ctx: LintContext) -> Iterable[Finding]:
    skip = heredoc_lines(ctx)
    for number, line in enumerate(ctx.script.lines, start=1):
        if number > ctx.script.header_end and line.startswith("#SBATCH") and number not in skip:
            yield finding("sbatch-after-command", ERROR, number,
                          f"'{line.strip()}' comes after the first command (line {ctx.script.header_end}): "
                          "sbatch stops reading #SBATCH lines there and silently ignores it",
                          "move every #SBATCH line above the first command")


@rule("sbatch-typo", "a line that looks like #SBATCH but that Slurm does not read")
def sbatch_typo(ctx: LintContext) -> Iterable[Finding]:
    for number, line in enumerate(ctx.script.lines[:ctx.script.header_end - 1], start=1):
        stripped = line.strip()
        if line.startswith("#SBATCH") or line_lookalike(line, number):
            continue   # a look-alike is sbatch-unicode's (an error that names the character)
        if re.match(r"#\s*sbatch\b", stripped, re.IGNORECASE) and not stripped.startswith("##"):
            yield finding("sbatch-typo", WARNING, number,
                          f"'{stripped[:40]}' is not read by sbatch (only '#SBATCH' at the start of a line is)",
                          "write it as '#SBATCH --option=value' at column 1, or '##SBATCH' to disable it on purpose")


@rule("time-missing", "no --time (the partition default applies, often the maximum or very short)")
def time_missing(ctx: LintContext) -> Iterable[Finding]:
    if ctx.script.option("time") is None and ctx.script.options:
        yield finding("time-missing", WARNING, ctx.script.options[0].line,
                      "no #SBATCH --time: the partition's default limit applies",
                      "#SBATCH --time=HH:MM:SS (a realistic limit also starts sooner)")


@rule("mem-conflict", "more than one of --mem, --mem-per-cpu, --mem-per-gpu (sbatch rejects it)")
def mem_conflict(ctx: LintContext) -> Iterable[Finding]:
    given = [o for o in (ctx.script.option(n) for n in ("mem", "mem-per-cpu", "mem-per-gpu")) if o]
    if len(given) > 1:
        last = max(given, key=lambda o: o.line)
        yield finding("mem-conflict", ERROR, last.line,
                      f"{' and '.join('--' + o.name for o in given)} are mutually exclusive: sbatch refuses the job",
                      "keep one of them")


@rule("no-shebang", "no #! line (sbatch refuses a script without one)")
def no_shebang(ctx: LintContext) -> Iterable[Finding]:
    if ctx.script.shebang is None:
        yield finding("no-shebang", WARNING, 1,
                      "the first line is not '#!...': sbatch refuses to submit the file as it is",
                      "make '#!/bin/bash' the first line")


@rule("dos-line-endings", "Windows (CRLF) line endings (sbatch refuses the script)")
def dos_line_endings(ctx: LintContext) -> Iterable[Finding]:
    if ctx.script.crlf_line is not None:
        yield finding("dos-line-endings", ERROR, ctx.script.crlf_line,
                      "the file has DOS/Windows line breaks (\\r\\n): sbatch refuses it",
                      "convert it: dos2unix FILE (or sed -i 's/\\r$//' FILE)")


def _folder(path: str) -> str:
    path = path.strip().rstrip("/")
    while path.startswith("./"):
        path = path[2:]
    return path


@rule("log-dir", "--output/--error into a folder the script itself creates (Slurm opens the log first)")
def log_dir(ctx: LintContext) -> Iterable[Finding]:
    made: dict[str, int] = {}
    for cmd in ctx.script.commands:
        if cmd.words and cmd.words[0].value == "mkdir":
            for w in cmd.words[1:]:
                if not w.value.startswith("-"):
                    made.setdefault(_folder(w.value), cmd.line)
    if not made:
        return
    for name in ("output", "error"):
        opt = ctx.script.option(name)
        if opt is None or not opt.value or "/" not in opt.value:
            continue
        folder = _folder(opt.value.rsplit("/", 1)[0])
        for target, line in made.items():
            if target and (target == folder or folder.endswith("/" + target) or target.endswith("/" + folder)):
                # a warning: lint cannot know whether the folder exists where the job is submitted
                yield finding("log-dir", WARNING, opt.line,
                              f"--{name}={opt.value} goes into {folder}/, which the script creates "
                              f"itself (line {line}): Slurm opens the file before the script runs, "
                              "so where the folder does not exist yet the job fails at once with no log",
                              f"create it before submitting (mkdir -p {folder} && sbatch ...), or "
                              f"write the log into the submit folder (--{name}=%x-%j.out)")
                break


@rule("sbatch-unicode", "an #SBATCH line with a look-alike character (typographic dash, Cyrillic "
      "or Greek letter, zero-width or non-breaking space) that sbatch does not read")
def sbatch_unicode(ctx: LintContext) -> Iterable[Finding]:
    # the one detector port uses too (scaletrain.lint.lookalike)
    for found in script_lookalikes(ctx.script):
        yield finding("sbatch-unicode", ERROR, found.line, found.message(), LOOKALIKE_HINT)


# #SBATCH options that take a count, and what sbatch reads there: a whole number (1e400, nan, -1
# and 2.5 are refused before the job is queued); --nodes also a range MIN-MAX; the GPU options an
# optional type first (a100:4). Slurm keeps counts in 32 bits.
_COUNTS = ("nodes", "ntasks", "ntasks-per-node", "cpus-per-task", "cpus-per-gpu", "ntasks-per-gpu",
           "ntasks-per-core", "ntasks-per-socket", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")
_COUNT = re.compile(r"([A-Za-z0-9_.-]+:)?([0-9]+)(?:-([0-9]+))?")
SLURM_MAX_COUNT = 2**32 - 3      # NO_VAL (2**32 - 2) and INFINITE above it are Slurm's own words
PAST_SLURM = f"past Slurm's largest count ({SLURM_MAX_COUNT:,})"
_MEMORY = ("mem", "mem-per-cpu", "mem-per-gpu")


def unreadable(name: str, value: str | None) -> str | None:
    """Why sbatch refuses ``--name=value``, or None when it reads it (or lint does not check it)."""
    if name in _MEMORY:
        return None if parse_mem_mib(value) is not None else "not a memory size (e.g. 32G, 4000M)"
    if name == "time":
        try:
            seconds = parse_time_seconds(value or "x")
        except ValueError:
            return "not a time limit (e.g. 01:30:00, 2-00:00:00)"
        # Slurm keeps a limit in minutes, 32 bits: 99999999999999999999-00:00:00 reads as nothing
        return None if seconds is None or seconds // 60 <= SLURM_MAX_COUNT else "past Slurm's longest time limit"
    if name == "gres":   # gpu:a100:1e400: the count of each gpu item is a count too
        for item in (value or "").split(","):
            parts = item.split("(")[0].split(":")            # gpu[:type][:count][(S:0-1)]
            typed = len(parts) == 2 and not parts[1][:1].isdigit() and not parts[1].startswith("-")
            if parts[0] == "gpu" and len(parts) > 1 and not typed:   # gpu:a100 is one GPU of a type
                why = unreadable("gpus", parts[-1])
                if why:
                    return why
        return None
    if name not in _COUNTS:
        return None
    m = _COUNT.fullmatch((value or "").strip())
    gpus = name.startswith("gpus")
    if m is None or (m.group(1) and not gpus) or (m.group(3) and name != "nodes"):
        return "not a whole number" + (" or a range MIN-MAX" if name == "nodes" else "")
    if max(len(m.group(2)), len(m.group(3) or "")) > 10:   # before int(): 5,000 digits would raise
        return PAST_SLURM
    low, high = int(m.group(2)), int(m.group(3) or m.group(2))
    if high > SLURM_MAX_COUNT:
        return PAST_SLURM
    if low > high:
        return "a range whose minimum is above its maximum"
    return None if low >= (0 if gpus else 1) else "zero, where Slurm needs at least 1"


@rule("sbatch-value", "an #SBATCH count, memory size or time that sbatch cannot read (1e400, nan, -1, 0 nodes, 4-2)")
def sbatch_value(ctx: LintContext) -> Iterable[Finding]:
    for opt in ctx.script.options:   # every line: sbatch refuses the job on any of them, not only the last
        why = unreadable(opt.name, opt.value)
        if why is not None:
            example = {"time": "--time=01:00:00", "nodes": "--nodes=2", "gres": "--gres=gpu:4",
                       "mem": "--mem=32G", "mem-per-cpu": "--mem-per-cpu=4G", "mem-per-gpu": "--mem-per-gpu=32G"
                       }.get(opt.name, f"--{opt.name}=4")
            yield finding("sbatch-value", ERROR, opt.line,
                          f"--{opt.name}={opt.value or ''}: {why}; sbatch refuses the job",
                          f"write it as sbatch reads it, e.g. #SBATCH {example}")
