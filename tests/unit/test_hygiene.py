"""The hygiene fixture (tests/conftest.py) catches what a test leaves behind: here, a signal
handler, run in a throw-away pytest session with the same conftest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

LEAKY = '''
import signal


def test_leaves_a_handler():
    signal.signal(signal.SIGUSR2, lambda *_: None)


def test_restores_its_handler():
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    signal.signal(signal.SIGUSR2, previous)
'''


def test_a_leftover_signal_handler_fails_the_test(tmp_path):
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_leaky.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "signal handlers left installed: ['SIGUSR2']" in out.stdout
    # the leaky test passes, then errors in teardown; the tidy one is not blamed
    assert "2 passed, 1 error" in out.stdout
