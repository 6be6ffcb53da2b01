"""mypy on src/ and on a user's program (tests/typing/user_program.py), with the config in
pyproject.toml: public names keep their types through the lazy exports, and no expression in
the user program is ``Any``. Skipped where mypy is not installed (``pip install -e .[test]``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")


def _mypy(*targets: str, cache: Path) -> subprocess.CompletedProcess[str]:
    # torch is analysed too (its stubs type the public signatures): ~20 s of CPU when cold
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml",
                           "--cache-dir", str(cache), "--no-error-summary", *targets],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_src_and_user_program_type_check():
    out = _mypy("src/scaletrain", "tests/typing/user_program.py", "tests/typing/job_program.py",
                cache=REPO / ".mypy_cache")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_catches_a_public_name_that_lost_its_type(tmp_path):
    """Without the TYPE_CHECKING imports every lazy name is Any: the user program must fail."""
    pkg = tmp_path / "scaletrain"
    src = REPO / "src" / "scaletrain"
    for path in src.rglob("*.py"):
        target = pkg / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text()
        if path == src / "__init__.py":
            text = text.replace("if TYPE_CHECKING:", "if not TYPE_CHECKING:", 1)
        target.write_text(text)
    (pkg / "py.typed").write_text("")
    program = tmp_path / "user_program.py"
    program.write_text((REPO / "tests" / "typing" / "user_program.py").read_text())
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                          str(REPO / "pyproject.toml"), "--cache-dir",
                          str(REPO / ".mypy_cache"), "user_program.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "MYPYPATH": str(tmp_path)})
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'Expression has type "Any"' in out.stdout
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    # every error is in the user program, none in the package (by the file each names, not by a
    # word a path may hold: tmp_path may sit in a folder named scaletrain)
    assert errors and all(line.startswith("user_program.py:") for line in errors), out.stdout


def test_every_public_name_has_a_type(tmp_path):
    """mypy's revealed type of each name in ``scaletrain.__all__`` (and ``print``) is not ``Any``."""
    import scaletrain

    names = [n for n in scaletrain.__all__ if n != "__version__"] + ["print"]
    program = tmp_path / "public_names.py"
    program.write_text("import scaletrain\n" + "".join(f"reveal_type(scaletrain.{n})\n" for n in names))
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
                          "--cache-dir", str(REPO / ".mypy_cache"), "--no-error-summary",
                          str(program)],
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MYPYPATH": str(REPO / "src")})
    revealed = [line.split('Revealed type is "', 1)[1].rstrip('"')
                for line in out.stdout.splitlines() if "Revealed type is" in line]
    assert len(revealed) == len(names), out.stdout + out.stderr
    untyped = [n for n, kind in zip(names, revealed) if kind == "Any"]
    assert untyped == [], f"public names typed Any: {untyped}"
