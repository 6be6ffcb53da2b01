"""A cluster profile cannot inject commands (issue 22 item 2), nor crash the tools (item 5).

Every field has a shape checked when the profile is loaded (clusters/model.py's facts, in the
settings' vocabulary); the renderer also keeps the one value that sat inside double quotes
(``master_addr_suffix``) outside them.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from scaletrain.clusters.profile import load_profile
from scaletrain.errors import ProfileError
from scaletrain.plan.planner import make_plan
from scaletrain.plan.render import render_script
from scaletrain.plan.request import JobRequest

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "scaletrain" / "clusters" / "profiles"


def _profile_file(tmp_path: Path, base: str, **fields: str) -> Path:
    """A copy of a shipped profile with ``fields`` (TOML text) set at the top level."""
    text = (SHIPPED / f"{base}.toml").read_text()
    for key, toml_value in fields.items():
        line = f"{key} = {toml_value}"
        text, n = re.subn(rf"(?m)^{key} = .*$", lambda _m: line, text, count=1)
        if n == 0:
            head, sep, rest = text.partition("\n[")
            text = f"{head}\n{line}\n{sep}{rest}"
    path = tmp_path / f"{base}-hostile.toml"
    path.write_text(text)
    return path


HOSTILE = [
    ("master_addr_suffix", '"$(touch /tmp/pwned)"'),
    ("master_addr_suffix", "\"i\\\"; touch /tmp/pwned; \\\"\""),
    ("scratch_var", '"$LOCAL_SCRATCH$(touch /tmp/pwned)"'),
    ("scratch_var", '"/tmp/x; touch /tmp/pwned"'),
    ("python", '"python3; touch /tmp/pwned"'),
    ("python", '"$(touch /tmp/pwned)"'),
    ("container", '"apptainer exec --nv $(touch /tmp/pwned)"'),
    ("exec_wrapper", '"x && touch /tmp/pwned"'),
    ("gres_type", '"v100\\n#SBATCH --wrap=x"'),
    ("name", '"x\\ntouch /tmp/pwned"'),
    ("setup_lines", '["module load x\\ntouch /tmp/pwned"]'),
    ("mem_per_gpu_gb", "nan"),
    ("mem_per_gpu_gb", "inf"),
    ("mem_per_node_gb", "-inf"),
    ("gpu_memory_gb", "nan"),
    ("gpus_per_node", "99999999999999999"),
]


@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[f"{f}={v}" for f, v in HOSTILE])
def test_a_hostile_profile_value_is_refused_on_load(tmp_path: Path, field: str, value: str) -> None:
    path = _profile_file(tmp_path, "puhti", **{field: value})
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert field in info.value.message and "\n" not in info.value.message and info.value.hint


def test_env_names_are_checked_on_load(tmp_path: Path) -> None:
    text = (SHIPPED / "lumi.toml").read_text().replace("\n[env]\n", '\n[env]\n"A;touch x" = "hsn"\n', 1)
    assert '"A;touch x"' in text
    path = tmp_path / "lumi-env.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match="env"):
        load_profile(str(path))


def test_a_legitimate_profile_still_loads(tmp_path: Path) -> None:
    path = _profile_file(tmp_path, "puhti", master_addr_suffix='"-ib0.cluster"', scratch_var='"${TMPDIR}"',
                         python='"/appl/soft/ai/bin/python3.11"', container='"apptainer exec --nv -B /scratch"')
    prof = load_profile(str(path))
    assert (prof.master_addr_suffix, prof.scratch_var, prof.python) == ("-ib0.cluster", "${TMPDIR}",
                                                                         "/appl/soft/ai/bin/python3.11")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_suffix_is_rendered_outside_the_double_quotes(tmp_path: Path) -> None:
    # even a profile built by hand (no loader, no validation) cannot run a command through it
    marker = tmp_path / "pwned"
    prof = dataclasses.replace(load_profile("juwels-booster"), master_addr_suffix=f"$(touch {marker})")
    text = render_script(make_plan(JobRequest(cluster="juwels-booster", gpus=8, account="p",
                                              script="train.py"), prof))
    (line,) = [ln for ln in text.splitlines() if ln.startswith("MASTER_ADDR=")]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/bash\necho nodeA\n")
    (fake / "scontrol").chmod(0o755)
    out = subprocess.run(["bash", "-c", f'{line}; printf %s "$MASTER_ADDR"'], capture_output=True, text=True,
                         env={"PATH": f"{fake}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "nodeA"}, timeout=30)
    assert not marker.exists()
    assert out.stdout == f"nodeA$(touch {marker})"


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_plan_with_a_nan_profile_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    # it was a ValueError traceback ("cannot convert float NaN to integer") from the memory request
    import sys
    path = _profile_file(tmp_path, "puhti", mem_per_gpu_gb=value)
    r = subprocess.run([sys.executable, "-m", "scaletrain", "plan", "--profile", str(path), "--gpus", "4",
                        "--account", "p", "train.py"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "mem_per_gpu_gb" in r.stderr
