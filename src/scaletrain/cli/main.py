"""The ``scaletrain`` command: a few verbs, each in its own module under ``scaletrain.cli``.

Every verb module exposes ``register(subparsers)``, which adds its sub-parser and sets
``func`` (a callable ``(argparse.Namespace) -> int``) as the parser default. Nothing here
imports torch: a verb that trains imports it inside its ``func``.

Errors from the library (``ScaletrainError``) are rendered once, here, as one line plus a
hint, with the error's exit code and no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from scaletrain._version import __version__
from scaletrain.errors import ScaletrainError, UsageError

# Order is the order shown in --help. Values are module paths so that adding a verb is one line.
VERBS: dict[str, str] = {
    "run": "scaletrain.cli.run",
    "plan": "scaletrain.cli.plan",
    "submit": "scaletrain.cli.submit",
    "lint": "scaletrain.cli.lint",
    "clusters": "scaletrain.cli.clusters",
    "doctor": "scaletrain.cli.doctor",
    "bench": "scaletrain.cli.bench",
}

EPILOG = """\
examples:
  scaletrain run --nproc-per-node 2 train.py --epochs 3      # 2 local processes (CPU: gloo)
  scaletrain plan --cluster puhti --gpus 8 -- train.py        # print a Slurm script
  scaletrain submit --cluster mahti --gpus 4 --account project_123 -- train.py
  scaletrain lint job.sh --cluster lumi                       # check an existing batch script
  scaletrain clusters                                         # list known clusters
"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, f"see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every verb registered."""
    parser = _Parser(
        prog="scaletrain",
        description="Take a PyTorch training program from one GPU to many GPUs and Slurm nodes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"scaletrain {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for module_name in VERBS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a verb still being built must not break the others
            if exc.name != module_name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the verb, and return the exit code (errors rendered on stderr)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        args = parser.parse_args(args_list)
        args._argv = tuple(args_list)  # the exact command, for generated scripts' provenance
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except ScaletrainError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("scaletrain: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
