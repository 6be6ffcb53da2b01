"""``scaletrain lint FILE...``: check existing Slurm batch scripts. Imports no torch."""

from __future__ import annotations

import argparse
import os
import sys

EXAMPLES = """\
examples:
  scaletrain lint job.sh                       # cluster detected from --partition + GPU type
  scaletrain lint job.sh --cluster puhti       # an old Puhti script: lint says Puhti is retired, how to port
  scaletrain lint *.sh --format json           # machine-readable findings
  scaletrain lint job.sh --profile mycluster.toml

output: FILE:LINE: error|warning RULE-ID message HINT: fix
exit status: 0 no errors (warnings allowed), 1 errors found, 2 bad input (file, cluster)
files: regular files of at most 4 MiB (a bigger one is refused, not cut)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``lint`` verb."""
    from scaletrain.cli.args import name, text
    from scaletrain.contract.environ import CLUSTER_VAR

    p = subparsers.add_parser(
        "lint", help="check Slurm batch scripts for launch and resource mistakes",
        description="Check existing Slurm batch scripts (anyone's) against Slurm's rules, the "
                    "launchers' rules and the cluster's limits.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=text(), metavar="FILE", help="batch script(s) to check")
    p.add_argument("--cluster", type=name, metavar="NAME",
                   help=f"cluster profile to check against (default: detected, or ${CLUSTER_VAR})")
    p.add_argument("--profile", type=text(), metavar="FILE", help="a cluster profile file instead of a named cluster")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Lint every file; print findings on stdout and a summary on stderr."""
    from scaletrain.lint.engine import lint_file, read_script
    from scaletrain.lint.report import format_json, format_summary, format_text

    for path in args.files:        # bad input stops before any output: one line, exit 2
        read_script(path)
    results = [lint_file(path, cluster=args.cluster, profile_path=args.profile, env=os.environ)
               for path in args.files]
    if args.format == "json":
        sys.stdout.write(format_json(results))
    else:
        sys.stdout.write(format_text(results))
        print(format_summary(results), file=sys.stderr)
    return 1 if any(r.errors for r in results) else 0
