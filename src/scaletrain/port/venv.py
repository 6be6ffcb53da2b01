"""The packages the old script's own venv installed, so that the new job's venv installs them too.

The Alliance's guides build a venv in the job (``virtualenv --no-download $SLURM_TMPDIR/env``,
``pip install torch torchvision --no-index``), on every node through ``srun ... bash << EOF``
or on the batch node as plain lines. The new script builds its own (the target profile's
``python_env_lines``) or uses ``--venv``; what it must keep is the package list: the program
imports torchvision. Only what can be carried exactly is: package names (with ``==version``)
and options that change nothing but where pip looks or how much it prints. Anything else is a
``NotCarried`` with the reason, and ``port`` refuses with ``--venv`` as the fix. Pure.
"""

from __future__ import annotations

import os
import re

from scaletrain.lint.shell import split_commands
from scaletrain.lint.words import Command
from scaletrain.plan.request import WHEEL_RE

# a here-document (or a line) that builds a Python environment
ENV_BUILD = re.compile(r"\b(virtualenv|venv|conda|pip3?\s+install)\b")
# pip options that change only where pip looks (the new job's venv uses the centre's wheelhouse
# with its own options) or how it reports; every other option is not carried
_PIP_FLAGS = {"--no-index", "--no-download", "--upgrade", "-U", "--quiet", "-q", "--no-cache-dir",
              "--disable-pip-version-check", "--prefer-binary"}
# the venv has these already: upgrading them changes no import of the program
_TOOLS = {"pip", "setuptools", "wheel"}


class NotCarried(Exception):
    """A step of the old environment's build that port cannot carry (the message says which)."""


def _python_module(words: list[str]) -> str | None:
    """``python -m NAME ...`` -> NAME."""
    if words and os.path.basename(words[0]).startswith("python") and len(words) > 2 and words[1] == "-m":
        return words[2]
    return None


def _pip_args(words: list[str]) -> list[str] | None:
    """The words after ``install`` of ``pip install`` / ``python -m pip install``, else None."""
    if words and os.path.basename(words[0]) in ("pip", "pip3") and words[1:2] == ["install"]:
        return words[2:]
    if _python_module(words) == "pip" and words[3:4] == ["install"]:
        return words[4:]
    return None


def is_env_command(cmd: Command) -> bool:
    """True for a line that creates a venv or installs packages into it."""
    words = cmd.argv
    first = os.path.basename(words[0]) if words else ""
    return first == "virtualenv" or _python_module(words) in ("venv", "virtualenv") or _pip_args(words) is not None


def command_packages(cmd: Command) -> tuple[str, ...]:
    """What one venv command installs (nothing for the venv's creation); NotCarried otherwise."""
    args = _pip_args(cmd.argv)
    if args is None:
        return ()
    out: list[str] = []
    for word, arg in zip(cmd.words[-len(args):] if args else [], args):
        if word.expansions or "$" in word.raw or "`" in word.raw:
            raise NotCarried(f"'{arg}' is read from the old job's shell")
        if arg.startswith("-"):
            if arg not in _PIP_FLAGS:
                raise NotCarried(f"pip option {arg} (a requirements file, an index or a folder of the old "
                                 "cluster's)")
            continue
        if not WHEEL_RE.fullmatch(arg):
            raise NotCarried(f"'{arg}' is not a package name port can carry")
        if arg.split("[")[0].split("==")[0].lower() not in _TOOLS:
            out.append(arg)
    return tuple(out)


def heredoc_packages(body: str, first_line: int) -> tuple[str, ...]:
    """The packages a venv-building here-document installs; NotCarried for any line that does
    more than create, activate or fill a venv (or load a module, which the target does its own way)."""
    out: list[str] = []
    for cmd in split_commands(body, first_line):
        words = cmd.argv
        first = words[0] if words else ""
        if cmd.heredocs or cmd.assignments or not words:
            raise NotCarried(f"line {cmd.line} of the here-document sets values or feeds a program")
        if first in ("source", ".") and len(words) == 2 and words[1].endswith("/activate"):
            continue
        if first in ("module", "deactivate"):
            continue
        if not is_env_command(cmd):
            raise NotCarried(f"line {cmd.line} of the here-document ({' '.join(words)[:60]}) is not a venv step")
        out += command_packages(cmd)
    return tuple(dict.fromkeys(out))
