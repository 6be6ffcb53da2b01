"""The ``scaletrain`` command: a few verbs, each in its own module under ``scaletrain.cli``.

Every verb module exposes ``register(subparsers)``, which adds its sub-parser and sets
``func`` (a callable ``(argparse.Namespace) -> int``) as the parser default. Nothing here
imports torch: a verb that trains imports it inside its ``func``.

Errors from the library (``ScaletrainError``) are rendered once, here, as one line plus a
hint, with the error's exit code and no traceback.
"""

from __future__ import annotations

from typing import Any

import argparse
import difflib
import errno
import importlib
import os
import sys
from typing import Sequence

from scaletrain._version import __version__
from scaletrain.cli.args import check_utf8
from scaletrain.errors import ScaletrainError, UsageError

# Order is the order shown in --help. Values are module paths so that adding a verb is one line.
VERBS: dict[str, str] = {
    "run": "scaletrain.cli.run",
    "plan": "scaletrain.cli.plan",
    "submit": "scaletrain.cli.submit",
    "status": "scaletrain.cli.status",
    "logs": "scaletrain.cli.logs",
    "cancel": "scaletrain.cli.cancel",
    "report": "scaletrain.cli.report",
    "lint": "scaletrain.cli.lint",
    "port": "scaletrain.cli.port",
    "clusters": "scaletrain.cli.clusters",
    "env": "scaletrain.cli.env",
    "doctor": "scaletrain.cli.doctor",
    "bench": "scaletrain.cli.bench",
}

EPILOG = """\
examples:
  scaletrain run --nproc-per-node 2 train.py --epochs 3      # 2 local processes (CPU: gloo)
  scaletrain plan --cluster roihu --gpus 8 --account project_123 -- train.py  # print a Slurm script
  scaletrain submit --cluster roihu --gpus 4 --account project_123 -- train.py
  scaletrain status --watch                                   # the runs submitted from here
  scaletrain cancel runs/20261125-010203-train --save         # checkpoint, stop, no requeue
  scaletrain report runs/20261125-010203-train                # what the GPUs did (HTML + text)
  scaletrain lint job.sh --cluster lumi                       # check an existing batch script
  scaletrain port old_puhti.sh --cluster roihu                # the same job on another cluster
  scaletrain clusters                                         # list known clusters
"""


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting.

    Prefix matching is off for every verb: with it, ``--mem 64G`` was silently read as
    ``--mem-per-gpu 64G``; a flag is spelt in full or refused.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = f"see '{self.prog} --help'"
        if message.startswith(_UNRECOGNIZED):
            meant = _did_you_mean(message[len(_UNRECOGNIZED):].split(), self._flags())
            if meant:
                hint = f"did you mean {' '.join(meant)}? ({hint})"
        raise UsageError(message, hint)

    def _flags(self) -> set[str]:
        """Every ``--flag`` of this parser and of the verbs registered under it."""
        flags = {o for action in self._actions for o in action.option_strings}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for verb in action.choices.values():
                    flags |= {o for a in verb._actions for o in a.option_strings}
        return {f for f in flags if f.startswith("--")}


_UNRECOGNIZED = "unrecognized arguments: "


def _did_you_mean(words: list[str], flags: set[str]) -> list[str]:
    """The flag each unknown ``--word`` most likely meant: torchrun's spelling with ``_``
    (``--nproc_per_node``), the start of one flag (``--nproc``), or a close spelling."""
    meant: list[str] = []
    for word in words:
        if not word.startswith("--"):
            continue
        name = word.split("=", 1)[0].replace("_", "-")
        starts = sorted(f for f in flags if f.startswith(name))
        if name in flags:
            guess = [name]
        elif 0 < len(starts) <= 2:
            guess = starts
        else:
            guess = difflib.get_close_matches(name, sorted(flags), n=1, cutoff=0.75)
        meant.extend(g for g in guess if g not in meant)
    return meant


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every verb registered, or only ``verb``'s (its module alone is
    imported: ``scaletrain run`` starts its workers without building the other verbs' parsers)."""
    parser = _Parser(
        prog="scaletrain",
        description="Take a PyTorch training program from one GPU to many GPUs and Slurm nodes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"scaletrain {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for name, module_name in VERBS.items():
        if verb is None or name == verb:
            importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the verb, and return the exit code (errors rendered on stderr)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        check_utf8(args_list)
        # a known verb first: build its parser only (top-level --help and mistakes get them all)
        parser = build_parser(args_list[0] if args_list and args_list[0] in VERBS else None)
        args = parser.parse_args(args_list)
        args._argv = tuple(args_list)  # the exact command, for generated scripts' provenance
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        code = int(args.func(args) or 0)
        # what is still buffered is written here, inside the handlers below: a reader that went
        # away then ends quietly instead of in Python's exit-time flush (exit 120, a message)
        sys.stdout.flush()
        return code
    except ScaletrainError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("scaletrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (scaletrain plan ... | head): stop quietly, like cat does
        _silence_stdout()
        return 1
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        if exc.filename is not None:    # a named file's (a read's, too): not the output's
            print(f"scaletrain: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 1
        _silence_stdout()
        print(f"scaletrain: error: cannot write the output: {exc.strerror}", file=sys.stderr)
        return 1


# Failures of the terminal/pipe/disk that stdout goes to: the user's environment, not a bug.
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPIPE}


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's exit-time flush does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def entry() -> None:
    """Console-script entry point."""
    from scaletrain.launch import lean

    lean.leave(main())  # sys.exit, minus the interpreter's teardown after `scaletrain run`
