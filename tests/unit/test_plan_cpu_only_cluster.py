"""A Slurm profile with ``gpus_per_node = 0`` (issue 39, item 7): the summary and the script agree.

The summary said "1 node x 4 A100 = 4 GPUs" and "(4 used)" while the script requested no GPU.
A CPU-only cluster (``gpu_vendor = "none"``) now plans processes said to be without GPUs in
the header, the summary and the #SBATCH lines alike; a profile that says its nodes have no GPU
but names a GPU vendor contradicts itself and is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import run_cli

from scaletrain.clusters.profile import _shipped_dir, load_profile
from scaletrain.errors import ProfileError


def _cpu_only(tmp_path: Path, vendor: str) -> Path:
    text = (_shipped_dir() / "narval.toml").read_text()
    text, n = re.subn(r"(?m)^gpus_per_node = \d+", "gpus_per_node = 0", text)
    text, m = re.subn(r'(?m)^gpu_vendor = "\w+"', f'gpu_vendor = "{vendor}"', text)
    assert (n, m) == (1, 1)
    path = tmp_path / "cpuonly.toml"
    path.write_text(text)
    return path


def test_no_gpus_per_node_with_a_gpu_vendor_is_refused(tmp_path):
    with pytest.raises(ProfileError, match="gpus_per_node = 0 says the nodes have no GPU, but "
                                           "gpu_vendor is 'nvidia'"):
        load_profile(str(_cpu_only(tmp_path, "nvidia")))


def test_the_summary_and_the_script_agree_on_no_gpus(tmp_path, capsys):
    profile = _cpu_only(tmp_path, "none")
    rc, script, err = run_cli(capsys, "plan", "--profile", str(profile), "--gpus", "4",
                              "--cpus-per-gpu", "8", "--account", "def-x", "--", "train.py")
    assert rc == 0, err
    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert sbatch and not any(re.search(r"gpu|gres", line) for line in sbatch)
    assert "# job: 1 node without GPUs, 4 processes" in script
    assert "1 node without GPUs (the script requests none: a CPU-only cluster), 4 processes" in err
    assert "per process: no GPU, 8 CPU cores" in err
    assert "-> 0 GPU-hours billed\n" in err
    assert not re.search(r"\b[1-9]\d* (A100 = \d+ )?GPUs?\b|\d used\)", err), err
