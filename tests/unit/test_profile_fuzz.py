"""Random and hostile values in every cluster profile field (issue 22): refused in one line, or
rendered into a script that runs no command the value carried.

A shipped profile's parsed TOML gets one or two fields replaced by a value hypothesis draws:
command substitutions, quotes and separators around random text, control characters, numbers
that are nan, inf, negative or huge, and values of the wrong type. Then either loading refuses it
with a one-line ProfileError, or the plan renders a script that passes ``bash -n`` and, run with
fake Slurm commands, never creates the marker file the value tried to create.

``setup_lines``, ``container_setup_lines`` and ``python_env_lines`` are shell code by design
(docs/clusters.md) and are not fuzzed for injection here; they must still be one line each.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaletrain.clusters.profile import profile_from_dict
from scaletrain.errors import ProfileError, ScaletrainError
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import render_script
from scaletrain.plan.request import JobRequest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash not installed")
SHIPPED = Path(__file__).resolve().parents[2] / "src" / "scaletrain" / "clusters" / "profiles"
BASES = {name: tomllib.loads((SHIPPED / f"{name}.toml").read_text()) for name in ("puhti", "juwels-booster", "lumi")}

TEXT_FIELDS = ["name", "master_addr_suffix", "scratch_var", "python", "container", "exec_wrapper", "gres_type",
               "scratch_gres", "gpu_model", "description", "site", "default_time"]
NUMBER_FIELDS = ["gpus_per_node", "cores_per_node", "mem_per_node_gb", "gpu_memory_gb", "mem_per_gpu_gb",
                 "max_mem_per_gpu_gb", "max_cores_per_gpu", "scratch_max_gb", "intra_node_gbps"]
MARK = "@MARK@"   # replaced by the marker file's path
INJECT = [f"$(touch {MARK})", f"`touch {MARK}`", f"; touch {MARK}", f"\"; touch {MARK}; \"", f"'; touch {MARK}; '",
          f"\ntouch {MARK}\n", f"$(touch${{IFS}}{MARK})", f"&& touch {MARK}", f"| touch {MARK}", f"${{X:-$(touch {MARK})}}"]

_text = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)
_hostile_text = st.builds(lambda a, inj, b: a + inj + b, _text, st.sampled_from(INJECT), _text)
_number = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10 ** 30), 10 ** 30),
                    st.sampled_from([float("nan"), float("inf"), -1, 0, 10 ** 20]))
_wrong_type = st.one_of(st.booleans(), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                          st.integers(), max_size=2))
_change = st.one_of(
    st.tuples(st.sampled_from(TEXT_FIELDS), st.one_of(_hostile_text, _text, _wrong_type)),
    st.tuples(st.sampled_from(NUMBER_FIELDS), st.one_of(_number, _hostile_text, _wrong_type)),
    st.tuples(st.just("env"), st.dictionaries(st.one_of(_text, _hostile_text), st.one_of(_text, _hostile_text),
                                              max_size=2)),
    st.tuples(st.just("container_binds"), st.lists(st.one_of(_text, _hostile_text), max_size=2)),
    st.tuples(st.just("partitions"), st.dictionaries(st.one_of(_text, _hostile_text), st.just({}), min_size=1,
                                                     max_size=1)),
)

FAKES = {
    "srun": '#!/bin/bash\nwhile [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done\nexec "$@"\n',
    "scontrol": "#!/bin/bash\necho nodeA\n",
}
NOOP = ("python", "python3", "torchrun", "accelerate", "deepspeed", "apptainer", "apptainer_wrapper",
        "singularity", "module", "virtualenv", "nvidia-smi", "sbatch", "pip")


def _fill(value: object, marker: str) -> object:
    if isinstance(value, str):
        return value.replace(MARK, marker)
    if isinstance(value, list):
        return [_fill(v, marker) for v in value]
    if isinstance(value, dict):
        return {_fill(k, marker): _fill(v, marker) for k, v in value.items()}   # type: ignore[misc]
    return value


def _run_script(text: str, tmp: Path) -> None:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in NOOP:
        FAKES.setdefault(name, "#!/bin/bash\nexit 0\n")
    for name, body in FAKES.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    script = tmp / "job.sh"
    script.write_text(text)
    syntax = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True, timeout=30)  # type: ignore[list-item]
    assert syntax.returncode == 0, syntax.stderr + text
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp), "SLURM_JOB_ID": "123456",
           "SLURM_JOB_NODELIST": "nodeA", "SLURM_CPUS_PER_TASK": "4", "SLURM_JOB_NUM_NODES": "1",
           "LOCAL_SCRATCH": str(tmp / "nvme"), "SLURM_TMPDIR": str(tmp / "tmpdir"), "TMPDIR": str(tmp)}
    subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp)  # type: ignore[list-item]


@settings(max_examples=50, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from(sorted(BASES)), changes=st.lists(_change, min_size=1, max_size=2),
       container=st.booleans(), stage=st.booleans())
def test_profile_field_fuzz(tmp_path_factory: pytest.TempPathFactory, base: str,
                            changes: list[tuple[str, object]], container: bool, stage: bool) -> None:
    tmp = tmp_path_factory.mktemp("prof")
    marker = tmp / "pwned"
    data = copy.deepcopy(BASES[base])
    for field, value in changes:
        data[field] = _fill(value, str(marker))
    try:
        profile = profile_from_dict(data, path="fuzz.toml", default_name=base)
    except ProfileError as exc:
        assert "\n" not in exc.message and exc.hint
        return
    for field, value in changes:   # what loads has its shape (clusters/model.py)
        if field in ("master_addr_suffix", "scratch_var", "python"):
            assert not any(c in str(getattr(profile, field) or "") for c in "$`;|&\"' \n(") or \
                (field == "scratch_var" and str(profile.scratch_var).startswith("$")), (field, value)
    gpus = max(1, profile.gpus_per_node)
    try:
        plan = make_plan(JobRequest(cluster=profile.name, gpus=gpus, account="p", script="train.py",
                                    container="/img/pt.sif" if container else None,
                                    stage_data="/data/set.tar" if stage else None), profile)
        text = render_script(plan)
    except ScaletrainError as exc:   # a plan this profile cannot make: said in one line
        assert "\n" not in exc.message
        return
    _run_script(text, tmp)
    assert not marker.exists(), (changes, text)
