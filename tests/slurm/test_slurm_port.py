"""``scaletrain port`` of an Alliance-style multi-node DDP script (tests/port_examples.py) runs on
the local Slurm cluster: its port passes ``bash -n`` and lint, and 4 ranks meet through
``--init_method``, all_reduce, and read the config the carried here-document wrote.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from port_examples import ALLIANCE_DDP, DDP_PROGRAM

def test_ported_alliance_ddp_script_runs(slurm_cluster, probed_profile, tmp_path: Path) -> None:
    (tmp_path / "old.sh").write_text(ALLIANCE_DDP)
    (tmp_path / "ddp_job.py").write_text(DDP_PROGRAM)
    proc = slurm_cluster.scaletrain("port", "old.sh", "--profile", str(probed_profile), "-o", "job.sh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "job.sh").read_text()
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], capture_output=True).returncode == 0
    lint = slurm_cluster.scaletrain("lint", "--profile", str(probed_profile), "job.sh", cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "<<" not in script and "$((SLURM_NTASKS_PER_NODE * SLURM_JOB_NUM_NODES))" in script
    run = slurm_cluster.run("sbatch", "--parsable", "--wait", "job.sh", cwd=tmp_path, timeout=300)
    outputs = list(tmp_path.glob("*.out"))
    text = "".join(p.read_text(errors="replace") for p in outputs)
    assert run.returncode == 0, run.stderr + text
    lines = sorted(ln for ln in text.splitlines() if ln.startswith("RANK "))
    assert lines == [f'RANK {r} WORLD 4 SUM 10 CFG nodes: 2 "from the here-document"' for r in range(4)], text
