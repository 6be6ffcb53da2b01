"""``scaletrain status [RUN...] [--watch]``: the runs submitted from here, one line each."""

from __future__ import annotations

import argparse
import sys

from scaletrain.cli.args import count, text

EXAMPLES = """\
examples:
  scaletrain status                       # every folder under ./runs, newest first
  scaletrain status runs/20261125-0102-train --watch
Each line: Slurm's state, elapsed/limit, requeues, and when the program uses the Monitor or the
Checkpointer its step, samples/s, ETA, loss, latest checkpoint and stop.json.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``status`` verb."""
    parser = subparsers.add_parser("status", help="state and progress of submitted runs",
                                   description="Show each run folder's job state and training progress.",
                                   epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", metavar="RUN", type=text(), help="run folders (default: ./runs/*)")
    parser.add_argument("--watch", action="store_true",
                        help="refresh until every job has ended (in place on a terminal, a line per change otherwise)")
    parser.add_argument("--interval", type=count(low=1, high=3600), default=10, metavar="S",
                        help="seconds between refreshes with --watch (default 10)")
    parser.set_defaults(func=run_status)


def run_status(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain status``."""
    from pathlib import Path

    from scaletrain.errors import UsageError
    from scaletrain.jobs import runfolder, status

    paths = [Path(p) for p in args.runs] or runfolder.default_runs()
    if not paths:
        raise UsageError("no run folders under ./runs", "submit with 'scaletrain submit', or name RUN folders")
    if args.watch:
        try:
            status.watch(paths, interval=args.interval, out=sys.stdout, tty=sys.stdout.isatty())
        except KeyboardInterrupt:
            return 0
        return 0
    for row in status.collect(paths):
        print(status.format_row(row))
    return 0
