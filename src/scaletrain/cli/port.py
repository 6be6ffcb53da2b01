"""``scaletrain port OLD.sh --cluster NAME``: the same job, planned again for another cluster.

The old script is read with lint's parser (``scaletrain.port.recover``), planned for the target
(``scaletrain.port.translate``) and printed (or written whole with ``-o``); every change and
everything that could not be carried goes to stderr. Imports no torch.
"""

from __future__ import annotations

import argparse
import os
import sys

EXAMPLES = """\
examples:
  scaletrain port old_puhti.sh --cluster roihu              # print the Roihu script
  scaletrain port old_puhti.sh --cluster roihu -o job.sh    # write it (the old file is never touched)
  scaletrain port lumi_module.sh --cluster lumi             # CSC's module script -> LUMI's container
  scaletrain port job.sh --from mahti --cluster roihu --account project_2001234
  scaletrain port old_puhti.sh                              # a retired system's script: to its successor

Kept word for word: the program and its arguments, exports, set-up commands before the launch.
Planned again: GPU type and request, partition (test stays test), CPUs and memory per GPU,
modules or container, the launch line. See docs/porting.md.
exit status: 0 ported, 2 bad input (file, cluster) or a job the target cannot run
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``port`` verb."""
    from scaletrain.cli.args import name, text

    p = subparsers.add_parser(
        "port", help="rewrite an existing batch script for another cluster (e.g. Puhti -> Roihu)",
        description="Read an existing Slurm batch script, recover the job it asks for, and print the "
                    "equivalent script for another cluster, with every change listed.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=text(), metavar="OLD.sh", help="the batch script to port")
    p.add_argument("--cluster", type=name, metavar="NAME",
                   help="the cluster to port to (default: the successor of the retired system the script is for)")
    p.add_argument("--profile", type=text(), metavar="FILE", help="a profile .toml file for the target")
    p.add_argument("--from", dest="source", type=name, metavar="NAME",
                   help="the cluster the script was written for (default: detected from its partition "
                        "and GPU type)")
    p.add_argument("--account", type=name, metavar="A", help="bill this project instead of the script's")
    p.add_argument("--venv", type=text(), metavar="DIR",
                   help="the job's Python environment on the target (e.g. made with 'scaletrain env create'), "
                        "instead of the venv the old script built")
    p.add_argument("--output", "-o", type=text(), metavar="FILE", help="write the new script to FILE (whole, or not at all)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """CLI body of ``scaletrain port``."""
    from scaletrain.slurm.submit import account_or_env
    from scaletrain.fileio import write_output
    from scaletrain.clusters.profile import load_profile
    from scaletrain.errors import UsageError
    from scaletrain.lint.engine import detect_cluster, read_script
    from scaletrain.lint.script import parse_script
    from scaletrain.plan.render import render_script
    from scaletrain.plan.summary import render_summary
    from scaletrain.port.recover import recover
    from scaletrain.port.translate import check_ported, port

    if args.output and os.path.realpath(os.path.expanduser(args.output)) == os.path.realpath(args.old):
        raise UsageError(f"-o {args.output} is the script being ported; keep the original",
                         "write the new script to another file, e.g. -o job-roihu.sh")
    text = read_script(args.old)
    source_name = args.source or detect_cluster(parse_script(text, args.old))[0]
    source = load_profile(source_name) if source_name else None
    if args.profile or args.cluster:
        target = load_profile(args.profile if args.profile else args.cluster)
    elif source is not None and source.successor:   # a retired system: its successor by default
        target = load_profile(source.successor)
    else:
        raise UsageError("port to which cluster? --cluster NAME is required",
                         "e.g. scaletrain port old.sh --cluster roihu (see 'scaletrain clusters')")
    old = recover(text, args.old)
    # --account, else the script's own, else sbatch's default ($SBATCH_ACCOUNT)
    account = args.account or old.sbatch.get("account") or account_or_env(None)
    ported = port(old, target, source, script_path=args.old, account=account, venv=args.venv)
    script = render_script(ported.plan)
    check_ported(script, ported.plan)   # port's own output passes lint, or nothing is written
    if args.output:
        write_output(args.output, script)
    else:
        sys.stdout.write(script)
        sys.stdout.flush()
    err = sys.stderr
    print(f"scaletrain port: {args.old} ({source.name if source else 'cluster not detected'}) -> "
          f"{target.name}", file=err)
    for line in ported.changes:
        print(f"  changed: {line}", file=err)
    for line in ported.lost:
        print(f"  not carried over: {line}", file=err)
    if not ported.lost:
        print("  not carried over: nothing", file=err)
    print(render_summary(ported.plan), file=err)
    if args.output:
        print(f"scaletrain: wrote {args.output}", file=err)
    return 0
