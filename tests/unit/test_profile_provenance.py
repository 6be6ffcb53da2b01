"""The provenance and retirement fields of a profile file: parsed, checked, and used by plan."""

from __future__ import annotations

import pytest

from scaletrain.clusters.profile import _shipped_dir, load_profile
from scaletrain.clusters.schema import build_profile
from scaletrain.errors import PlanError, ProfileError
from scaletrain.plan.planner import make_plan
from scaletrain.plan.request import JobRequest
from scaletrain.plan.summary import notes

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _roihu(**changes) -> dict:
    data = tomllib.loads((_shipped_dir() / "roihu.toml").read_text())
    data.update(changes)
    return data


@pytest.mark.parametrize("changes, needle", [
    ({"unconfirmed": ["no colon here"]}, "unconfirmed must be a list of which each entry is 'FIELD: why"),
    ({"unconfirmed": ["gpu_speed: made up"]}, "'gpu_speed', which is not a profile field"),
    ({"facts": {"partitionz": "x"}}, "'partitionz', which is not a profile field"),
    ({"retired": "August 2026"}, "retired must be a date YYYY-MM-DD"),
    ({"successor": "fir"}, "successor goes with retired"),
    ({"software": "conda"}, "software must be one of 'module', 'container', got 'conda'"),
    ({"software": "container"}, "needs default_image"),
    ({"cpu_arch": "ppc64le"}, "cpu_arch must be one of 'x86_64', 'aarch64', got 'ppc64le'"),
    ({"gpus_per_billing_unit": 0}, "gpus_per_billing_unit must be a whole number from 1"),
])
def test_bad_provenance_fields_name_the_field(changes: dict, needle: str) -> None:
    with pytest.raises(ProfileError, match=needle.replace("(", r"\(")):
        build_profile(_roihu(**changes), path="roihu.toml")


def test_every_live_profile_cites_its_facts_and_the_date() -> None:
    for name in ("roihu", "jupiter", "lumi", "fir", "nibi", "rorqual", "trillium", "narval"):
        prof = load_profile(name)
        assert prof.checked >= "2026-11-27" and len(prof.facts) >= 6, name
        assert {"gpus_per_node", "gpu_request"} <= set(prof.facts), name
        for key in prof.unconfirmed_facts:
            assert key not in prof.facts, f"{name}: {key} both sourced and unconfirmed"


def test_lumi_module_on_request_warns_for_multi_node() -> None:
    lumi = load_profile("lumi")

    def said(**kw) -> tuple[str, ...]:
        return notes(make_plan(JobRequest(cluster="lumi", script="t.py", account="p", **kw), lumi))

    warning = "no longer works with the fast Slingshot network"
    assert any(warning in n for n in said(nodes=2, modules=("pytorch",)))
    assert not any(warning in n for n in said(nodes=1, modules=("pytorch",)))
    assert not any(warning in n for n in said(nodes=2, container="/img/pt.sif"))


def test_horovod_note_where_the_module_dropped_it() -> None:
    plan = make_plan(JobRequest(cluster="roihu", script="t.py", account="p", gpus=4, launcher="mpi"),
                     load_profile("roihu"))
    assert any("Horovod" in n and "removed from CSC's PyTorch modules with PyTorch 2.1" in n for n in notes(plan))


def test_retired_check_runs_before_anything_else() -> None:
    with pytest.raises(PlanError, match="graham was retired on 2025-09-01.*successor is nibi"):
        make_plan(JobRequest(cluster="graham", script="t.py", gpus=1), load_profile("graham"))


def test_submit_of_a_retired_system_is_exit_2_naming_the_successor(tmp_path, monkeypatch, capsys) -> None:
    from scaletrain.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["submit", "--cluster", "cedar", "--gpus", "1", "--account", "def-x", "--dry-run",
                 "--", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "scaletrain: error: cedar was retired on 2025-09-12 and runs no jobs; its successor is fir"
    assert "scaletrain port OLD.sh --cluster fir" in err[1] and not list(tmp_path.rglob("job.sh"))
