"""``scaletrain cancel RUN [--save]``: end the job now, or let it checkpoint and stop (no requeue)."""

from __future__ import annotations

import argparse
import sys

from scaletrain.cli.args import count, text


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``cancel`` verb."""
    parser = subparsers.add_parser("cancel", help="stop a run's job (--save: checkpoint first, no requeue)",
                                   description="Cancel the job of a run folder. With --save the program "
                                               "saves a checkpoint at its next step, writes stop.json and "
                                               "ends; the job is not requeued.")
    parser.add_argument("run", metavar="RUN", type=text(), help="the run folder")
    parser.add_argument("--save", action="store_true",
                        help="ask the job to checkpoint and stop (needs scaletrain.init() and a Checkpointer)")
    parser.add_argument("--wait", type=count(low=1, high=86400), default=300, metavar="S",
                        help="with --save, seconds to wait for the job to end (default 300)")
    parser.set_defaults(func=run_cancel)


def run_cancel(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain cancel``."""
    from scaletrain.errors import printable
    from scaletrain.jobs.cancel import cancel

    result = cancel(args.run, save=args.save, wait_s=args.wait,
                    log=lambda line: print(printable(line), file=sys.stderr, flush=True))
    print(f"scaletrain: {printable(result.message())}")     # stop.json is the program's text: shown, not obeyed
    return 0
