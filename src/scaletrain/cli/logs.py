"""``scaletrain logs RUN [--follow] [--rank N]``: the job's output across its requeued runs."""

from __future__ import annotations

import argparse
import sys

from scaletrain.cli.args import count, text


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``logs`` verb."""
    parser = subparsers.add_parser("logs", help="a run's output, every requeued run",
                                   description="Print the job's output files from its run folder.")
    parser.add_argument("run", metavar="RUN", type=text(), help="the run folder")
    parser.add_argument("--follow", action="store_true", help="keep printing new output until the job ends")
    parser.add_argument("--rank", type=count(low=0, high=1_000_000), metavar="N",
                        help="only the lines of rank N (prefixed [rank N] or N:)")
    parser.set_defaults(func=run_logs)


def _note(text: str) -> None:
    from scaletrain.errors import printable

    print(f"scaletrain: {printable(text)}", file=sys.stderr, flush=True)


def run_logs(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain logs``."""
    from scaletrain.jobs import logs, runfolder, status

    if not args.follow:
        for line in logs.read_lines(args.run, rank=args.rank, on_note=_note):
            sys.stdout.write(line)
        return 0
    job = runfolder.open_run(args.run).job_id

    def finished() -> bool:
        # Slurm not answering raises (the wait loop retries and says so); only an answer ends it
        return job is None or status.ended(status.job_state(job))

    try:
        logs.follow(args.run, sys.stdout, rank=args.rank, finished=finished, on_note=_note)
    except KeyboardInterrupt:
        return 0
    return 0
