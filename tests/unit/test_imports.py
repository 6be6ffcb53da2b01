"""Import hygiene: `import scaletrain` and every CLI verb that does not train leave torch alone.

Each case runs in a fresh interpreter: it imports scaletrain or runs ``cli.main.main(argv)``
(``--help`` and ``--version`` exit through SystemExit), then prints whether torch (or any
``torch.*`` module) was imported and how long it took. Times are printed (``pytest -s``) and
reported in docs/benchmarks.md, not asserted: a timed assertion fails on a busy machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from workers import REPO, worker_env

PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
argv = json.loads(sys.argv[1])
code = 0
if argv is None:
    import scaletrain
else:
    from scaletrain.cli.main import main
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code or 0
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "numpy")
print(json.dumps({"heavy": heavy, "seconds": time.perf_counter() - t0, "code": code}))
"""

CASES = {
    "import scaletrain": None,
    "scaletrain --help": ["--help"],
    "scaletrain --version": ["--version"],
    "scaletrain run --help": ["run", "--help"],
    "scaletrain plan --help": ["plan", "--help"],
    "scaletrain submit --help": ["submit", "--help"],
    "scaletrain lint --help": ["lint", "--help"],
    "scaletrain status --help": ["status", "--help"],
    "scaletrain logs --help": ["logs", "--help"],
    "scaletrain cancel --help": ["cancel", "--help"],
    "scaletrain report --help": ["report", "--help"],
    "scaletrain clusters --help": ["clusters", "--help"],
    "scaletrain doctor --help": ["doctor", "--help"],
    "scaletrain bench --help": ["bench", "--help"],
}


@pytest.mark.parametrize("name", list(CASES))
def test_does_not_import_torch(name):
    argv = CASES[name]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], env=worker_env(),
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{name}: {result['seconds'] * 1000:.0f} ms (in-process, after interpreter start)")
    assert result["heavy"] == [], f"{name} imported {result['heavy'][:5]}"
    if argv is not None:
        assert result["code"] == 0
