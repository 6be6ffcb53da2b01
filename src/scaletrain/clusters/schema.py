"""The profile file's schema, derived from the field declarations in ``clusters/model.py``.

``build_profile`` turns parsed TOML into a validated :class:`ClusterProfile`; every mistake is a
ProfileError naming the field. The keys a file may hold, the type each must have, its default and
the shape of its value are read from the dataclass fields (``model.fact``: a setting of
:mod:`scaletrain.settings` with the file's options), so a field is declared once and checked by the
one vocabulary; the rules between fields (a typed GPU request needs its GRES type, a
successor goes with a retirement date) are declared beside the fields too (``model.RULES``).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from scaletrain.clusters.model import FILE_STEM, RULES, ClusterProfile, Partition
from scaletrain.errors import ProfileError
from scaletrain.settings import check_value


def bad(path: str, what: str) -> ProfileError:
    """A mistake in the profile file at ``path``, said in ``what``."""
    return ProfileError(f"profile {path or '(inline)'}: {what}",
                        "fix the profile file (see the shipped ones in scaletrain/clusters/profiles)")


@functools.cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """The fields a profile file may set for ``cls``, each with its resolved type."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls) if f.metadata["toml"].file)


def keys(cls: type = ClusterProfile) -> frozenset[str]:
    """The keys a profile file (``cls=Partition``: a ``[partitions.NAME]`` table) may hold."""
    return frozenset(f.name for f, _ in _fields(cls))


def _typed(data: dict[str, Any], key: str, kind: type | tuple[type, ...], path: str,
           default: Any = ..., *, none_ok: bool = False) -> Any:
    if key not in data:
        if default is ...:
            raise bad(path, f"missing field {key!r}")
        return default
    value = data[key]
    if value is None and none_ok:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise bad(path, f"field {key!r} must be {getattr(kind, '__name__', kind)}, not a boolean")
    if not isinstance(value, kind):
        raise bad(path, f"field {key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _value(data: dict[str, Any], f: dataclasses.Field[Any], hint: Any, path: str, read: dict[str, Any]) -> Any:
    """Field ``f`` of the file's table ``data``, converted to the field's type ``hint``."""
    key, toml = f.name, f.metadata["toml"]
    if key not in data and toml.absent is not None and toml.absent != FILE_STEM:
        return toml.absent(read)
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = ...
    args = typing.get_args(hint)
    optional = isinstance(hint, types.UnionType) and type(None) in args
    kind = next(a for a in args if a is not type(None)) if optional else hint
    origin = typing.get_origin(kind) or kind
    if origin is tuple:
        items = _typed(data, key, list, path, list(default) if default is not ... else ...)
        return tuple(str(s) for s in items) if typing.get_args(kind)[0] is str else tuple(items)
    if origin is dict:
        table = _typed(data, key, dict, path, default, none_ok=optional)
        if kind == dict[str, Partition]:
            return _partitions(table, path)
        if kind == dict[int, tuple[int, ...]]:
            return _gpu_cpu_map(table, path)
        return {str(k): str(v) for k, v in table.items()}
    value = _typed(data, key, kind, path, default, none_ok=optional)
    if toml.read is not None:
        value = toml.read(value)
    return (value or None) if optional and kind is str else value


def _unknown(cls: type, data: dict[str, Any]) -> str:
    """The keys of ``data`` that ``cls`` does not have, or ""."""
    return ", ".join(sorted(set(data) - keys(cls)))


def _read(cls: type, data: dict[str, Any], path: str, **given: Any) -> dict[str, Any]:
    """The fields of ``cls`` read from the table ``data`` (its keys known), with ``given`` added."""
    read: dict[str, Any] = {}
    for f, hint in _fields(cls):
        read[f.name] = _value(data, f, hint, path, read)
    return {**read, **given}


def _partitions(table: dict[str, Any], path: str) -> dict[str, Partition]:
    """The profile's ``[partitions.NAME]`` tables, in file order."""
    partitions: dict[str, Partition] = {}
    for pname, pdata in table.items():
        if not isinstance(pdata, dict):
            raise bad(path, f"partition {pname!r} must be a table")
        if _unknown(Partition, pdata):
            raise bad(path, f"partition {pname!r}: unknown field(s) {_unknown(Partition, pdata)}")
        partitions[pname] = Partition(**_read(Partition, pdata, f"{path} [partitions.{pname}]", name=pname))
    return partitions


def _gpu_cpu_map(table: dict[str, Any] | None, path: str) -> dict[int, tuple[int, ...]] | None:
    """``gpu_cpu_map``: GPU index -> the cores next to it, or None when not given."""
    if not table:
        return None
    out: dict[int, tuple[int, ...]] = {}
    for key, cores in table.items():
        if not str(key).isdigit() or not isinstance(cores, list) or not all(isinstance(c, int) for c in cores):
            raise bad(path, f"gpu_cpu_map entry {key!r} must map a GPU index to a list of core numbers")
        out[int(key)] = tuple(cores)
    return out


def check_profile(profile: ClusterProfile) -> ClusterProfile:
    """``profile`` unchanged when every field has its declared shape and the fields agree; else
    ProfileError naming the file and the field (``ProfileSettingError``, the settings' one line)."""
    where = profile.path or profile.name or "(inline)"
    parts: list[tuple[ClusterProfile | Partition, str]] = [(profile, "")]
    parts += [(part, f"partitions.{n}.") for n, part in profile.partitions.items()]
    for obj, prefix in parts:
        for f in dataclasses.fields(obj):
            check_value(f.metadata["setting"], getattr(obj, f.name), f"profile {where}: {prefix}{f.name}",
                        name=f.name)
    for rule in RULES:
        wrong = rule(profile)
        if wrong:
            raise bad(profile.path, wrong)
    return profile


def build_profile(data: dict[str, Any], *, path: str = "", default_name: str = "") -> ClusterProfile:
    """Build and validate a ClusterProfile from parsed TOML (used by the loader and by probe)."""
    stem = {f.name: default_name for f, _ in _fields(ClusterProfile)
            if f.metadata["toml"].absent == FILE_STEM and default_name and f.name not in data}
    if _unknown(ClusterProfile, data):
        raise bad(path, f"unknown field(s) {_unknown(ClusterProfile, data)}")
    profile = ClusterProfile(**_read(ClusterProfile, {**stem, **data}, path), path=path)
    if not profile.name:
        raise bad(path, "missing field 'name'")
    return check_profile(profile)


__all__ = ["build_profile", "check_profile", "keys"]
