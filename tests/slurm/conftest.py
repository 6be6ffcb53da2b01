"""Tier 3: a throw-away 2-node Slurm cluster on this machine, started once per test session.

``slurm_cluster`` starts it with tests/slurm/harness/up.sh in a fresh state directory under /tmp
(own slurm.conf, own munged socket, free ports) and always stops it with down.sh, which kills the
daemons by their PID files. Tests never put SLURM_CONF into this process's environment: they pass
``cluster.env()`` to the subprocesses they start (the hygiene fixture fails environment leaks).

Every test here is skipped, with the reason, when Slurm cannot run: not root (slurmd must be),
Slurm not installed and not installable, or the daemons do not come up.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "harness"
REPO = HERE.parent.parent
SBIN_PATH = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])
NODES = 2
GPUS_PER_NODE = 2
CPUS_PER_NODE = 8


def _free_port_base(count: int) -> int:
    """A port P such that P..P+count are free now (slurmctld on P, slurmd n_i on P+i)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65000:
            continue
        try:
            socks = []
            for port in range(base, base + count + 1):
                s = socket.socket()
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range for the test cluster")


@dataclass(frozen=True, kw_only=True)
class SlurmCluster:
    """A running test cluster: its state directory and slurm.conf."""

    state_dir: Path
    conf: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess that uses this cluster (jobs inherit it via sbatch).

        No launcher variables from outside; this interpreter's directory first on PATH, so the
        job's ``python3``/``scaletrain`` is the one that has scaletrain and torch installed.
        """
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "TORCHELASTIC_"))
               and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                             "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"}}
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", ""), SBIN_PATH])
        env["SLURM_CONF"] = str(self.conf)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO / "src"), env.get("PYTHONPATH", "")] if p)
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        if extra:
            env.update(extra)
        return env

    def run(self, *argv: str, timeout: float = 60, cwd: str | Path | None = None,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command against the cluster; output captured as text."""
        return subprocess.run(list(argv), env=self.env(extra_env), capture_output=True, text=True,
                              timeout=timeout, cwd=cwd or REPO)

    def scaletrain(self, *args: str, timeout: float = 120, cwd: str | Path | None = None,
                   extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``python -m scaletrain ARGS`` with this interpreter, against the cluster."""
        return self.run(sys.executable, "-m", "scaletrain", *args, timeout=timeout, cwd=cwd,
                        extra_env=extra_env)


def _why_not() -> str | None:
    """Why Slurm cannot run here (None when it can, after installing it if needed)."""
    if not sys.platform.startswith("linux"):
        return "the local Slurm cluster needs Linux"
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd runs jobs as any user)"
    path = os.pathsep.join([os.environ.get("PATH", ""), SBIN_PATH])
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "munged") if not shutil.which(c, path=path)]
    if missing:
        subprocess.run(["bash", str(HARNESS / "install.sh")], capture_output=True, timeout=600)
        missing = [c for c in missing if not shutil.which(c, path=path)]
    if missing:
        return f"Slurm is not installed and could not be installed (missing {', '.join(missing)})"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """Start the 2-node cluster for the session; stop it by PID afterwards, whatever happened."""
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    state = Path(tempfile.mkdtemp(prefix="scaletrain-slurm-", dir="/tmp"))
    env = {**os.environ, "S": str(state), "PORT_BASE": str(_free_port_base(NODES)),
           "NODES": str(NODES), "GPUS": str(GPUS_PER_NODE), "CPUS": str(CPUS_PER_NODE),
           "PATH": os.pathsep.join([os.environ.get("PATH", ""), SBIN_PATH])}
    try:
        up = subprocess.run(["bash", str(HARNESS / "up.sh")], env=env, capture_output=True,
                            text=True, timeout=90)
        if up.returncode != 0:
            tail = " | ".join((up.stdout + up.stderr).strip().splitlines()[-6:])
            pytest.skip(f"the local Slurm cluster did not start: {tail}")
        yield SlurmCluster(state_dir=state, conf=state / "etc" / "slurm.conf")
    finally:
        subprocess.run(["bash", str(HARNESS / "down.sh")], env=env, capture_output=True,
                       text=True, timeout=60)
        if not os.environ.get("SCALETRAIN_KEEP_SLURM_STATE"):  # set it to read the daemons' logs
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def probed_profile(slurm_cluster, tmp_path_factory) -> Path:
    """``scaletrain clusters probe`` of the test cluster, saved as ``<clusters dir>/ci.toml``.

    Jobs find the profile by name through ``SCALETRAIN_CLUSTERS_DIR`` (pass
    ``{"SCALETRAIN_CLUSTERS_DIR": str(path.parent)}`` as extra_env); ``--profile path`` works too.
    """
    folder = tmp_path_factory.mktemp("clusters")
    path = folder / "ci.toml"
    proc = slurm_cluster.scaletrain("clusters", "probe", "--output", str(path), "--name", "ci")
    if proc.returncode != 0:
        pytest.fail(f"clusters probe failed ({proc.returncode}): {proc.stderr.strip()}")
    return path
