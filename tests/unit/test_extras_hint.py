"""Install hints name what works for this installation (a clone is not told to fetch a published copy)."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from scaletrain import extras


class _Dist:
    def __init__(self, direct: dict | None) -> None:
        self._direct = direct

    def read_text(self, name: str) -> str | None:
        return json.dumps(self._direct) if self._direct is not None and name == "direct_url.json" else None


@pytest.fixture(autouse=True)
def _fresh_cache():
    extras.installed_from_clone.cache_clear()
    yield
    extras.installed_from_clone.cache_clear()


@pytest.mark.parametrize("direct", [{"url": "file:///home/u/scaletrain", "dir_info": {"editable": True}},
                                    {"url": "file:///home/u/scaletrain", "dir_info": {}}])
def test_a_clone_is_told_the_packages_and_the_editable_form(monkeypatch, direct):
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(direct))
    hint = extras.install_hint("monitor", "tensorboard")
    assert hint.startswith("pip install tensorboard") and "pip install -e '.[monitor]'" in hint
    assert "'scaletrain[monitor]'" not in hint


def test_an_index_install_is_told_the_extra(monkeypatch):
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(None))
    assert extras.install_hint("report") == "pip install 'scaletrain[report]' (or pip install matplotlib)"


def test_a_source_tree_without_metadata_counts_as_a_clone(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "distribution", missing)
    assert "-e '.[monitor]'" in extras.install_hint("monitor")


def test_every_extra_named_here_exists_in_pyproject():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    declared = project["optional-dependencies"]
    for extra, packages in extras.EXTRAS.items():
        names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in declared[extra]}
        assert set(packages) == names, extra
