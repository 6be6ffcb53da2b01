"""``scaletrain submit``: ``plan`` plus one ``sbatch --parsable`` call, from a run folder.

The script is written into the run folder first (``--run-dir``, default
``./runs/<timestamp>-<name>/``) and sbatch is called from there, so the job's output file, the
script and the job id all end up together. Every submission gets its own folder: the default
name gains ``-2``, ``-3``... when taken (two submits in one second), and a ``--run-dir`` that
already holds a ``job.sh`` or ``job_id`` is refused rather than overwritten (its job may still be
running). Files are written whole or not at all. The job itself runs in the folder the user
submitted from (``#SBATCH --chdir``), with the training script's path made absolute, so the
program and the relative paths it is given resolve as they did on the command line. Before sbatch, the check
(``scaletrain.envs.check``) reads the program, runs the job's set-up and ``--setup`` lines on this login node and
asks its Python for scaletrain, the launcher's package and the program's imports: a job that would stop at its
first line is refused with the fix; ``--no-check`` skips it and says what it skipped. ``--dry-run`` stops before
sbatch and always writes the run folder and the script; it prints the check's outcome, and its exit code says
which: 0 checked (or skipped on request), 5 not checked here (``scaletrain.errors.EXIT_NOT_CHECKED``: off the
cluster, no ``module`` command), else the refusal's own code (2 or 3). Each outcome is also one comment line of
``job.sh``. The verb is a thin layer over the library's submit path
(``scaletrain.jobs.submit``), which ``scaletrain.submit()`` uses too. ``--wait`` follows the job with ``scontrol show job`` until it ends, prints its output
file and exits with the job's exit code.

Ctrl-C during ``--wait`` stops *following* the job, not the job: it keeps its place in the queue
or keeps running (queue time is precious, and an interrupted terminal is not a decision to
cancel). The message says how to cancel it (``scancel ID``). Exit code 130.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from scaletrain.contract.files import JOB_SCRIPT
from scaletrain.errors import EXIT_NOT_CHECKED, UsageError, printable
from scaletrain.fileio import open_regular

if TYPE_CHECKING:
    from scaletrain.jobs.submit import Prepared

EXAMPLES = """\
examples:
  scaletrain submit --cluster roihu --gpus 8 --account project_123 -- train.py --epochs 10
  scaletrain submit --cluster lumi --nodes 2 --account project_465000123 --dry-run -- train.py  # write only
  scaletrain submit --profile my.toml --nodes 2 --account project_123 --wait -- train.py  # follow it

The script goes to --run-dir (a new or empty folder; default ./runs/<timestamp>-<name>/),
sbatch runs from there, and the job id is printed on stdout. With --wait, Ctrl-C stops following the job but does NOT
cancel it (use 'scancel ID').

Before sbatch the program is read, the job's set-up and --setup lines run here and its Python is
asked for what the program imports whatever happens (--no-check skips it). --dry-run always writes
the folder and exits 0 when checked, 5 when the check cannot run here (off the cluster: no
'module'), 2 or 3 when it would refuse the job.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``submit`` verb: every ``plan`` flag plus the submission flags."""
    from scaletrain.cli.plan import add_plan_arguments

    from scaletrain.cli.args import text

    parser = subparsers.add_parser(
        "submit", help="write a Slurm script into a run folder and submit it with sbatch",
        description="Plan a job like 'scaletrain plan', write the script into a run folder and "
                    "submit it with 'sbatch --parsable'; prints the job id.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_arguments(parser)
    for action in parser._actions:  # plan's output flags: accepted (same parser) but refused
        if {"--output", "--json"} & set(action.option_strings):
            action.help = argparse.SUPPRESS
    group = parser.add_argument_group("submission")
    group.add_argument("--run-dir", type=text(), metavar="DIR",
                       help="folder for the script, job id and output (default: "
                            "./runs/<timestamp>-<name>/)")
    group.add_argument("--dry-run", action="store_true",
                       help="write the script into the run folder and stop before sbatch; says what the check "
                            "found (exit 0 checked, 5 not checked here, 2/3 would fail)")
    group.add_argument("--no-check", action="store_true",
                       help="skip the check before sbatch (the job's set-up and imports, asked on this login "
                            "node); says what it skipped")
    group.add_argument("--wait", action="store_true",
                       help="follow the job to its end, print its output file and exit with the "
                            "job's exit code (Ctrl-C stops following; the job keeps running)")
    parser.set_defaults(func=run_submit)


def _open_output(path: str, wait_s: float = 5.0) -> IO[bytes] | str:
    """The job's output file, opened by the run folders' rules (a pipe is refused), or why not;
    a shared file system may show it a moment after the job ends."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return open_regular(path)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                return "not found"
            time.sleep(0.2)
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"


def _copy_output(fh: IO[bytes]) -> str | None:
    """Stream the file to stdout a block at a time (a job's output may be gigabytes); the error of
    a read that failed part-way, or None. A write's error is stdout's and propagates."""
    from scaletrain.jobs.logs import pieces

    blocks = pieces(fh, whole_lines=False)
    while True:
        try:
            block = next(blocks)
        except StopIteration:
            return None
        except OSError as exc:
            return f"cannot read on ({exc.strerror or exc}); the rest is not shown"
        sys.stdout.write(block)


def run_submit(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain submit``: the flags to a request, then the library's submit path
    (``scaletrain.jobs.submit``); what is printed is all that is the CLI's own."""
    from scaletrain.cli.plan import request_from_args
    from scaletrain.jobs.submit import prepare, send
    from scaletrain.plan.summary import render_summary

    for flag, value in (("--output", getattr(args, "output", None)), ("--json", getattr(args, "json", False))):
        if value:
            raise UsageError(f"{flag} is a 'plan' option; submit writes the script into its run folder",
                             "use --run-dir DIR (and --dry-run to stop before sbatch), or 'scaletrain plan'")
    request = request_from_args(args)   # the flags are checked before any folder is made
    prepared = prepare(request, run_dir=getattr(args, "run_dir", None), check=not args.no_check,
                       dry_run=args.dry_run)
    print(render_summary(prepared.plan).rstrip("\n"), file=sys.stderr)
    for note in prepared.notes:
        print(f"scaletrain: note: {printable(note)}", file=sys.stderr)
    if args.dry_run:
        return _dry_run(prepared)
    if prepared.unasked:
        print(f"scaletrain: warning: {printable(prepared.unasked)}", file=sys.stderr)
    job_id = send(prepared)
    print(job_id, flush=True)
    print(f"scaletrain: submitted job {job_id} from {prepared.run_dir}", file=sys.stderr, flush=True)
    if not args.wait:
        return 0
    return _follow(job_id)


def _dry_run(prepared: Prepared) -> int:
    """The dry run's end: the check's outcome, where the script is, the exit code that says which."""
    refused = prepared.refused
    if refused is not None:   # the refusal submit would give, and the script it would have sent
        print(refused.render(), file=sys.stderr)
        code = refused.exit_code
    else:
        print(f"scaletrain: {printable(prepared.outcome)}", file=sys.stderr)
        code = EXIT_NOT_CHECKED if prepared.check and prepared.check.not_checked else 0
    print(f"scaletrain: dry run: wrote {prepared.script}; not submitted (submit it with: cd {prepared.run_dir} "
          f"&& sbatch {JOB_SCRIPT})", file=sys.stderr)
    print(prepared.script)
    return code


def _follow(job_id: str) -> int:
    """``--wait``: poll the job to its end, show its output, return its exit code."""
    from scaletrain.slurm import commands

    def show(info: commands.JobInfo) -> None:
        where = f" on {info.node_list}" if info.node_list and info.state == "RUNNING" else ""
        print(f"scaletrain: job {job_id} {info.state}{where}", file=sys.stderr, flush=True)

    def note(text: str) -> None:   # Slurm silent for a while, then answering again
        print(f"scaletrain: job {job_id}: {text}", file=sys.stderr, flush=True)

    try:
        info = commands.wait(job_id, poll=1.0, on_change=show, on_note=note)
    except KeyboardInterrupt:
        print(f"scaletrain: stopped following job {job_id}; it was NOT cancelled "
              f"(cancel it with: scancel {job_id})", file=sys.stderr)
        return 130
    for label, path in (("output", info.stdout),
                        ("error output", info.stderr if info.stderr != info.stdout else None)):
        # a job cancelled before it started has no node and never wrote its file
        if not path or path == "/dev/null":
            continue
        opened = _open_output(path, wait_s=5.0 if info.node_list else 0.0)
        if isinstance(opened, str):
            print(f"scaletrain: job {label} file {path} {opened}", file=sys.stderr)
            continue
        print(f"scaletrain: ---- {label} of job {job_id} ({path}) ----", file=sys.stderr, flush=True)
        with opened:
            failed = _copy_output(opened)
        sys.stdout.flush()
        if failed:
            print(f"scaletrain: job {label} file {path}: {failed}", file=sys.stderr)
    code = info.returncode
    reason = f", {info.reason}" if info.reason and info.reason != "None" else ""
    print(f"scaletrain: job {job_id} {info.state} (exit code {code}{reason})", file=sys.stderr)
    return code
