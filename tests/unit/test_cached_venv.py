"""scripts/cached_venv.sh, the one way the test scripts build and keep their venvs: a venv counts
only when complete, a failed build leaves its whole log and nothing else, and a finished one names
its final folder, not the temporary one it was built in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from workers import REPO

SCRIPT = REPO / "scripts" / "cached_venv.sh"
# a stand-in build: a bin/ script naming the folder it was made in, as venv's activate does
BUILD = """
build() {
  mkdir -p "$1/bin" && echo "VIRTUAL_ENV=$1" > "$1/bin/activate" && echo "building in $1"
  echo "$2" >> "$CALLS"
  [ "$2" = ok ]
}
"""


def _run(cache: Path, name: str, arg: str) -> subprocess.CompletedProcess:
    script = f"source {SCRIPT}\n{BUILD}\ncached_venv {cache / name} build {arg}\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "CALLS": str(cache / "calls")})


def test_a_built_venv_is_renamed_into_place_and_names_its_final_folder(tmp_path: Path) -> None:
    proc = _run(tmp_path, "v-1", "ok")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    venv = tmp_path / "v-1"
    assert (venv / ".complete").is_file()
    assert (venv / "bin" / "activate").read_text() == f"VIRTUAL_ENV={venv}\n"
    assert "building in" in (venv / "build.log").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls", "v-1"]   # no .build-* left
    # complete: reused, not built again
    assert _run(tmp_path, "v-1", "ok").returncode == 0
    assert (tmp_path / "calls").read_text() == "ok\n"


def test_a_failed_build_leaves_its_whole_log_and_no_venv(tmp_path: Path) -> None:
    proc = _run(tmp_path, "v-2", "fail")
    assert proc.returncode != 0
    assert not (tmp_path / "v-2").exists()
    assert "building in" in (tmp_path / "v-2.failed").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls", "v-2.failed"]
    # a later success clears the failure record
    assert _run(tmp_path, "v-2", "ok").returncode == 0 and not (tmp_path / "v-2.failed").exists()


def test_an_incomplete_folder_under_the_final_name_is_never_used(tmp_path: Path) -> None:
    (tmp_path / "v-3" / "bin").mkdir(parents=True)
    (tmp_path / "v-3" / "half-installed").write_text("")
    assert _run(tmp_path, "v-3", "ok").returncode == 0
    assert not (tmp_path / "v-3" / "half-installed").exists() and (tmp_path / "v-3" / ".complete").is_file()


def test_horovod_is_built_only_where_its_build_can_run(tmp_path: Path) -> None:
    """scripts/test.sh builds Horovod (and then requires its tests) only where cmake, a C++
    compiler and Open MPI's mpicc are on PATH; elsewhere its tests skip, naming what is missing."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sha256sum", "cut", "cat", "grep", "sed", "python3"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for stub in ("cmake", "c++"):
        (bin_dir / stub).write_text("#!/bin/sh\n")
        (bin_dir / stub).chmod(0o755)
    script = REPO / "scripts" / "frameworks_env.sh"
    env = {"PATH": str(bin_dir), "SCALETRAIN_CI_CACHE": str(tmp_path / "cache")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / "bash"), str(script), *args], capture_output=True, text=True,
                              timeout=60, env=env)

    cannot = run("--can-build", "horovod")
    assert cannot.returncode == 1 and "no mpicc on PATH" in cannot.stderr
    found = run("--find", "horovod")
    assert found.returncode == 1 and "cannot build one: no mpicc" in found.stderr
    (bin_dir / "mpicc").write_text("#!/bin/sh\n")
    (bin_dir / "mpicc").chmod(0o755)
    assert run("--can-build", "horovod").returncode == 0
    assert run("--can-build", "tensorflow").returncode == 0
