"""A cluster profile's field is declared once, in clusters/model.py: its type, default, meaning
(``doc``) and the shape of its value (``check``), a setting of the one vocabulary (scaletrain.settings). The file's schema is derived from those
declarations; these tests fail when a field's name is written down a second time elsewhere in the
profile's code (a hand-kept key list, a check that names the field by a string)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from scaletrain.clusters import schema
from scaletrain.clusters.model import ClusterProfile, Partition
from scaletrain.errors import ProfileError
from scaletrain.settings import Spec

CLUSTERS = Path(schema.__file__).parent
FIELDS = {f.name for cls in (ClusterProfile, Partition) for f in dataclasses.fields(cls)}


def test_the_schema_is_the_dataclass_fields() -> None:
    # only what the loader sets itself (the file's path, a partition's name: its table's key) is not a key
    assert schema.keys(ClusterProfile) == {f.name for f in dataclasses.fields(ClusterProfile)} - {"path"}
    assert schema.keys(Partition) == {f.name for f in dataclasses.fields(Partition)} - {"name"}


@pytest.mark.parametrize("cls", [ClusterProfile, Partition])
def test_every_field_is_declared_with_its_meaning(cls: type) -> None:
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        assert isinstance(spec, Spec) and spec.doc, f"{cls.__name__}.{f.name} is not declared with model.fact(doc, ...)"


@pytest.mark.parametrize("module", ["schema.py", "profile.py"])
def test_no_field_name_is_spelt_outside_the_model(module: str) -> None:
    tree = ast.parse((CLUSTERS / module).read_text(encoding="utf-8"))
    spelt = sorted({node.value for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and node.value in FIELDS})
    assert spelt == [], f"clusters/{module} names profile fields {spelt}: declare them in clusters/model.py"


def test_a_check_declared_on_a_field_is_the_one_that_runs() -> None:
    base = {"name": "x", "gpus_per_node": 4, "cores_per_node": 8, "mem_per_node_gb": 64}
    assert schema.build_profile(base).gpu_request_accepts == ("gres",)   # 'absent': gpu_request's
    with pytest.raises(ProfileError, match="profile x: python must be one command word"):
        schema.build_profile({**base, "python": "a b"})
    with pytest.raises(ProfileError, match=r"partitions.g.max_gpus must be a whole number from 0 to 100,000, got -1"):
        schema.build_profile({**base, "partitions": {"g": {"max_gpus": -1}}})
    with pytest.raises(ProfileError, match="unknown field"):
        schema.build_profile({**base, "path": "/elsewhere.toml"})       # the loader's, not the file's
