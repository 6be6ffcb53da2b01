"""``scaletrain port`` of an Alliance-style multi-node DDP script (tests/port_examples.py) runs on
the local Slurm cluster: its port passes ``bash -n`` and lint, and 4 ranks meet through
``--init_method``, all_reduce, and read the config the carried here-document wrote.

The old script builds a venv with torchvision in a here-document and the program imports it
(issue 38: the port installed torch only). The target here is the probed profile with the
Alliance's kind of job venv (``python_env_lines``), built from a folder of wheels the test makes:
a torchvision wheel of its own (there is no CPU torchvision on this machine), so the import works
in the job only when port carried the old venv's package list to the new job's pip.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from helpers import module_python
from port_examples import ALLIANCE_DDP, DDP_PROGRAM

VISION = "0.0.1+scaletrain.test"


def _wheel(folder: Path) -> None:
    """A minimal pure-Python wheel named torchvision (its module holds only __version__)."""
    dist = f"torchvision-{VISION}.dist-info"
    files = {"torchvision/__init__.py": f"__version__ = {VISION!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torchvision\nVersion: {VISION}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: scaletrain-tests\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"torchvision-{VISION}-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


def _with_job_venv(probed: Path, wheels: Path, out: Path) -> Path:
    """The probed profile, with a job venv like the Alliance's (one shared file system here: the
    batch node builds it once, in the job's folder) installing from ``wheels`` only. Its Python is
    the module stand-in (helpers.module_python): this interpreter, whose venv, when it is one,
    the job's venv sees as a module's site-packages."""
    text = probed.read_text()
    python = module_python(out.parent / "module")
    lines = ('python_env_lines = [\n'
             # without a pip of its own: this interpreter's pip and setuptools (torch's requirement) serve it
             f'  "{python} -m venv --system-site-packages --without-pip \\"$PWD/jobenv\\" && '
             f'\\"$PWD/jobenv/bin/python\\" -m pip install --no-index --find-links={wheels} --quiet @PACKAGES@",\n'
             '  "source \\"$PWD/jobenv/bin/activate\\"",\n]\n\n')
    head, sep, tables = text.partition("\n[")
    out.write_text(head + "\n" + lines + sep.lstrip("\n") + tables)
    return out


def test_ported_alliance_ddp_script_runs(slurm_cluster, probed_profile, tmp_path: Path) -> None:
    (tmp_path / "old.sh").write_text(ALLIANCE_DDP)
    (tmp_path / "ddp_job.py").write_text(DDP_PROGRAM)
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels")
    profile = _with_job_venv(probed_profile, tmp_path / "wheels", tmp_path / "ci.toml")
    proc = slurm_cluster.scaletrain("port", "old.sh", "--profile", str(profile), "-o", "job.sh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "job.sh").read_text()
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], capture_output=True).returncode == 0
    lint = slurm_cluster.scaletrain("lint", "--profile", str(profile), "job.sh", cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "<<" not in script and "$((SLURM_NTASKS_PER_NODE * SLURM_JOB_NUM_NODES))" in script
    assert "--quiet torch torchvision\n" in script      # the old venv's package, in the new job's
    run = slurm_cluster.run("sbatch", "--parsable", "--wait", "job.sh", cwd=tmp_path, timeout=300)
    outputs = list(tmp_path.glob("*.out"))
    text = "".join(p.read_text(errors="replace") for p in outputs)
    assert run.returncode == 0, run.stderr + text
    lines = sorted(ln for ln in text.splitlines() if ln.startswith("RANK "))
    assert lines == [f'RANK {r} WORLD 4 SUM 10 VISION {VISION} CFG nodes: 2 "from the here-document"'
                     for r in range(4)], text
