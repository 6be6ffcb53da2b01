"""The hygiene fixture sees grandchildren: a daemon (double fork + setsid) left by a test is
reported and stopped, not silently reparented to init."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import alive
from workers import REPO, worker_env

_LEAKY = textwrap.dedent("""
    import os, time

    def test_leaves_a_daemon(tmp_path):
        if os.fork() == 0:
            os.setsid()
            if os.fork():
                os._exit(0)
            time.sleep(60)
            os._exit(0)
        os.wait()
        time.sleep(0.3)
""")


def test_a_daemon_left_by_a_test_fails_it(tmp_path):
    (tmp_path / "test_leaky.py").write_text(_LEAKY)
    env = worker_env()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "conftest", str(tmp_path / "test_leaky.py")],
                          env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO / "tests")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "hygiene: child processes leaked" in proc.stdout
    leaked = proc.stdout.split("child processes leaked: [", 1)[1].split("]", 1)[0]
    assert leaked and not any(alive(int(p)) for p in leaked.split(","))  # and it was stopped
