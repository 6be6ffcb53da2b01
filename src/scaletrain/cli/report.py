"""``scaletrain report RUN``: what the job did with what it was billed for (HTML page + text)."""

from __future__ import annotations

import argparse
import sys

from scaletrain.cli.args import text


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` verb."""
    parser = subparsers.add_parser("report", help="a run's report: throughput, GPU use, requeues (HTML + text)",
                                   description="Summarise a run folder (or a Monitor folder) as text and "
                                               "write an HTML page with its charts.")
    parser.add_argument("run", metavar="RUN", type=text(), help="the run folder or the Monitor's folder")
    parser.add_argument("-o", "--output", type=text(), metavar="FILE",
                        help="where the HTML page goes (default RUN/report.html)")
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain report``."""
    from scaletrain.jobs import report, report_page

    rep = report.build(args.run)
    page = report_page.write(rep, args.output)
    sys.stdout.write(report_page.render_text(rep))
    print(f"scaletrain: wrote {page}", file=sys.stderr)
    return 0
