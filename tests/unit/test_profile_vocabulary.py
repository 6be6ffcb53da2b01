"""A cluster profile's fields are settings of the one vocabulary (scaletrain.settings): one kind of
check, one cap on counts, one control-character rule, and every number checked by it.

A profile ``fact`` is a setting with the TOML file's options; a refusal is the settings' one line
(a ``SettingError``) that is also the ``ProfileError`` callers catch, naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

import scaletrain
from scaletrain import settings
from scaletrain.clusters.model import ClusterProfile, Partition
from scaletrain.clusters.schema import build_profile
from scaletrain.errors import ProfileError

SRC = Path(scaletrain.__file__).parent
BASE = {"name": "x", "gpus_per_node": 4, "cores_per_node": 32, "mem_per_node_gb": 256.0,
        "partitions": {"gpu": {"max_nodes": 2}}}


def _numbers(cls: type) -> list[tuple[str, type]]:
    """The fields of ``cls`` a file sets as a number, or a list of numbers: (name, int, float or list)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        kinds = set(typing.get_args(hint)) - {type(None)} or {hint}
        if typing.get_origin(hint) is tuple and int in kinds:
            out.append((f.name, list))
        elif kinds & {int, float} and getattr(f.metadata["toml"], "file", f.metadata["toml"]):
            out.append((f.name, float if float in kinds else int))
    return out


NUMBERS = [("", name, kind) for name, kind in _numbers(ClusterProfile)] + \
          [("partitions.gpu.", name, kind) for name, kind in _numbers(Partition)]


def _with(prefix: str, name: str, value: object) -> dict:
    data = {**BASE, "partitions": {"gpu": dict(BASE["partitions"]["gpu"])}}
    (data["partitions"]["gpu"] if prefix else data)[name] = value
    return data


@pytest.mark.parametrize("prefix, name, kind", NUMBERS, ids=[p + n for p, n, _ in NUMBERS])
def test_every_profile_number_is_checked_by_the_settings(prefix: str, name: str, kind: type) -> None:
    bad = {float: float("nan"), int: 10**6, list: [10**6]}[kind]   # 10^6: above any count's cap
    with pytest.raises(settings.SettingError) as info:
        build_profile(_with(prefix, name, bad), path="x.toml")
    assert isinstance(info.value, ProfileError)                       # what callers of the loader catch
    assert info.value.message.startswith(f"profile x.toml: {prefix}{name} must be ")
    assert "\n" not in info.value.message


def test_one_cap_on_counts() -> None:
    """The settings' MAX_COUNT bounds a profile's counts as it bounds a request's (it was 10^7 there)."""
    build_profile(_with("partitions.gpu.", "max_nodes", settings.MAX_COUNT), path="x.toml")
    with pytest.raises(ProfileError, match=f"max_nodes must be a whole number from 0 to {settings.MAX_COUNT:,}"):
        build_profile(_with("partitions.gpu.", "max_nodes", settings.MAX_COUNT + 1), path="x.toml")
    with pytest.raises(ProfileError, match="cores_per_node must be a whole number"):
        build_profile(_with("", "cores_per_node", 200_000), path="x.toml")


@pytest.mark.parametrize("cls", [ClusterProfile, Partition])
def test_every_fact_is_a_setting(cls: type) -> None:
    for f in dataclasses.fields(cls):
        spec = f.metadata["setting"]
        assert isinstance(spec, settings.Spec) and spec.doc and callable(spec.check), f.name


def test_one_control_character_rule() -> None:
    """The control characters no value may hold are declared once, in scaletrain.settings."""
    declared = [path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")
                if re.search(r"\[\\x00-\\x1f\\x7f-\\x9f\]", path.read_text(encoding="utf-8"))]
    assert declared == ["settings.py"]
    with pytest.raises(ProfileError, match="description must be one line of text"):
        build_profile({**BASE, "description": "two\nlines"}, path="x.toml")
