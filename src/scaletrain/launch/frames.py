"""Whose code a traceback frame runs - ours, torch's or the user's - by where the packages are.

A frame is ours when its file lies inside the folder the imported ``scaletrain`` package was
loaded from (symlinks resolved), torch's when it lies inside the imported ``torch``'s. Never
by a word in the path: a clone of this project is a folder named ``scaletrain`` by default,
and users keep their own programs in folders named ``scaletrain`` or ``torch``; a word match
would take their frames for ours and drop "the script line that raised it" from messages.

Nothing here imports torch (a package not imported yet is found where an import would load it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from functools import lru_cache


# this file is scaletrain/launch/frames.py: our package is two folders up, imported or not
_OURS = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def package_dir(name: str) -> str | None:
    """The real folder of package ``name``: the imported one, else the one an import would load
    (found without importing it); None when there is none."""
    if name == "scaletrain":
        return _OURS
    path = getattr(sys.modules.get(name), "__file__", None)
    if not path:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        path = spec.origin if spec is not None else None
    return os.path.dirname(os.path.realpath(path)) if path else None


def is_within(path: str, folder: str | None) -> bool:
    """True when file ``path`` (symlinks resolved) lies inside ``folder``."""
    if not folder or not path or path.startswith("<"):  # "<frozen runpy>", "<string>"
        return False
    real = os.path.realpath(path)
    return real == folder or real.startswith(folder.rstrip(os.sep) + os.sep)


def in_package(path: str, name: str, *sub: str) -> bool:
    """True when ``path`` is a file of the imported package ``name`` (or of its ``sub`` folder)."""
    base = package_dir(name)
    return base is not None and is_within(path, os.path.join(base, *sub))


def is_user_frame(path: str) -> bool:
    """True when ``path`` belongs neither to scaletrain nor to torch: the user's own code."""
    return not in_package(path, "scaletrain") and not in_package(path, "torch")


@lru_cache(maxsize=1)
def _installed() -> tuple[str, ...]:
    """The real folders of this Python's installation: its standard library and the folders
    packages are installed into."""
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.realpath(paths[key]) for key in
                         ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)}))


def is_program_file(path: str) -> bool:
    """True when a traceback's file is the program's own: not a pseudo-file (``<frozen os>``,
    ``<string>``), not scaletrain's or torch's, not in Python's standard library or an
    installed package (this Python's folders, or any ``site-packages``/``dist-packages``)."""
    if not path or path.startswith("<") or not is_user_frame(path):
        return False
    parts = os.path.realpath(path).split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return False
    return not any(is_within(path, folder) for folder in _installed())


def short_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else as it is.

    A location such as ``../../tmp/x/train.py:12`` is harder to find than the absolute path it
    stands for, so paths outside the working directory stay absolute.
    """
    try:
        rel = os.path.relpath(path)
    except ValueError:   # another drive (Windows)
        return path
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel
