"""Cluster profiles: what a cluster offers and how a job asks for it, loaded from TOML data files.

A profile is data, not code: one small TOML file per cluster in ``clusters/profiles/``. The user
may shadow or add profiles in ``$SCALETRAIN_CLUSTERS_DIR`` (or ``~/.config/scaletrain/clusters``)
and pass any file with ``--profile FILE``. Values the seed documents state are copied from them;
the rest come from the centres' public documentation, cited in each file's ``sources``.

Lookup order for a name: the user directory first (so a site can correct a shipped value), then
the shipped files. Loading never imports torch; only the ``local`` profile looks at this machine
(its core count, when the file declares ``cores_per_node = 0``).
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

# the data types and their fields' declarations live in clusters/model.py; schema.py derives the
# file's keys from them. This module loads the files; importable from here as before
from scaletrain.clusters.model import (  # noqa: F401 - re-exported
    GPU_REQUESTS,
    MEM_REQUESTS,
    ClusterProfile,
    Partition,
    format_time,
    parse_time,
)
from scaletrain.contract.environ import CLUSTERS_DIR_VAR
from scaletrain.errors import ProfileError, UsageError
from scaletrain.fileio import read_user_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# --------------------------------------------------------------------------- locating files

def _shipped_dir() -> Path:
    return Path(str(resources.files("scaletrain.clusters").joinpath("profiles")))


def user_dir() -> Path:
    """The user's profile directory: ``$SCALETRAIN_CLUSTERS_DIR`` or ~/.config/scaletrain/clusters."""
    env = os.environ.get(CLUSTERS_DIR_VAR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "scaletrain" / "clusters"


def _profile_files() -> dict[str, Path]:
    """name -> file; user files shadow shipped ones of the same name."""
    found: dict[str, Path] = {}
    for folder in (_shipped_dir(), user_dir()):
        if folder.is_dir():
            for f in sorted(folder.glob("*.toml")):
                found[f.stem] = f
    return found


def list_profiles() -> list[str]:
    """Names of every known profile (shipped and the user's), sorted."""
    return sorted(_profile_files())


def load_profile(name_or_path: str) -> ClusterProfile:
    """Load a profile by name (user dir, then shipped) or from a ``.toml`` file path.

    Raises ProfileError (exit 2) naming the known profiles when the name is unknown, or saying
    which field is wrong when the file is malformed.
    """
    candidate = Path(name_or_path).expanduser()
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        try:
            found = candidate.exists()  # a pipe or device is refused by _load_file, by name
        except OSError:                 # a name the file system refuses (too long): not found either
            found = False
        if not found:
            raise ProfileError(f"profile file {name_or_path!r} not found",
                               "give an existing .toml file, or a cluster name: "
                               + ", ".join(list_profiles()))
        return _load_file(candidate)
    files = _profile_files()
    key = name_or_path.strip().lower()
    if key not in files:
        known = ", ".join(sorted(files))
        raise ProfileError(f"unknown cluster {name_or_path!r} (known: {known})",
                           "pick one of the known clusters, run 'scaletrain clusters probe' on an "
                           "unknown one, or pass --profile FILE")
    return _load_file(files[key])


PROFILE_MAX_BYTES = 1 << 20   # a profile is a few KiB; a bigger file is not one


def _load_file(path: Path) -> ClusterProfile:
    """A profile file read by the rules of every user file (``fileio.read_user_file``: a
    regular file, bounded) and parsed; a ProfileError (exit 2) for anything else."""
    hint = "give a cluster profile: a TOML file like the shipped ones ('scaletrain clusters show NAME')"
    try:
        data = tomllib.loads(read_user_file(path, what="a cluster profile", hint=hint,
                                            limit=PROFILE_MAX_BYTES).decode("utf-8"))
    except UsageError as exc:
        raise ProfileError(f"cannot read profile {exc.message}", exc.hint) from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"profile {path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                           hint) from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile {path} is not valid TOML: {exc}", "fix the TOML syntax") from None
    except RecursionError:     # tomllib recurses once per level of nested arrays and tables
        raise ProfileError(f"profile {path} nests arrays or tables too deeply to be a profile",
                           hint) from None
    return profile_from_dict(data, path=str(path), default_name=path.stem)


# TOML's integers are signed 64-bit (the spec: one that cannot be held "MUST" be an error); tomllib
# reads 10**400 anyway, and a field that turns it into a float raised OverflowError.
TOML_INT = 2**63 - 1


def _check_integers(data: dict[str, Any], path: str) -> None:
    """ProfileError naming the field when ``data`` holds an integer TOML cannot (past 64 bits)."""
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        key, value = todo.pop()
        if isinstance(value, dict):
            todo += [(f"{key}.{k}" if key else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            todo += [(f"{key}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, int) and not -TOML_INT - 1 <= value <= TOML_INT:
            shown = str(value)
            raise ProfileError(f"profile {path or '(inline)'}: field {key!r} = {shown[:12]}... ({len(shown)} digits) "
                               "is out of range: TOML integers are 64-bit",
                               "fix the profile file (see the shipped ones in scaletrain/clusters/profiles)")


def profile_from_dict(data: dict[str, Any], *, path: str = "", default_name: str = "") -> ClusterProfile:
    """Build and validate a ClusterProfile from parsed TOML (the rules: ``clusters/schema.py``)."""
    from scaletrain.clusters.schema import build_profile

    _check_integers(data, path)
    return build_profile(data, path=path, default_name=default_name)




def profile_to_dict(profile: ClusterProfile) -> dict[str, Any]:
    """A JSON-friendly dict of the profile (partitions as dicts, lists for tuples, map keys as strings)."""
    from dataclasses import asdict

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        return [plain(v) for v in value] if isinstance(value, (tuple, list)) else value

    return dict(plain(asdict(profile)))


__all__ = [
    "Partition", "ClusterProfile", "load_profile", "list_profiles", "profile_from_dict",
    "profile_to_dict", "parse_time", "format_time", "user_dir",
]
