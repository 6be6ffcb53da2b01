"""Crash safety: a process SIGKILLed at any moment of ``save()`` never leaves a partial
checkpoint that ``load_latest`` would return; the previous checkpoint always loads whole.

``ckpt_crash_worker.py`` saves steps 1, 2, 3, ... (every tensor filled with its step) until
killed. 24 single-process trials with random delays (the kill lands in torch.save, fsync,
the rename, the marker, retention...; one worker forks a child per trial so torch is
imported once) and 2 trials of a 2-rank zero3 job (DCP shards), both ranks killed at random
moments. After each kill a fresh load must return a committed step whose every tensor equals
that step, and no partial folder of the dead writer may be left behind.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workers import launcher_cmd, worker_env

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("ckpt_crash_worker.py")
TRIALS = 24


def test_sigkill_during_save_single_process(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(WORKER), "--trials", str(TRIALS), "--root",
                           str(tmp_path), "--out", str(out)], env=worker_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == TRIALS
    bad = [r for r in results if not r["ok"]]
    assert not bad, bad
    # the kills landed after different numbers of saves, not all at one point
    assert len({r["step"] for r in results}) > 3, results


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_sigkill_during_save_two_ranks_zero3(tmp_path):
    rng = random.Random(7)
    for trial in range(2):
        directory = tmp_path / f"t{trial}"
        cmd = [*launcher_cmd(2), str(WORKER), "--dir", str(directory), "--strategy", "zero3"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=worker_env())
        try:
            pids: list[int] = []
            deadline = time.monotonic() + 240
            while len(pids) < 2 and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                if "ready " in line:
                    pids.append(int(line.rsplit("ready ", 1)[1].split()[0]))
            assert len(pids) == 2, "the job never committed its first checkpoint"
            time.sleep(rng.uniform(0.0, 1.0))
            for pid in pids:  # the ranks die at slightly different moments, as on a node
                _kill(pid)
                time.sleep(rng.uniform(0.0, 0.05))
            proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                _kill(proc.pid)
                proc.communicate(timeout=60)
        check = subprocess.run(
            [sys.executable, "-c",
             "import json, sys; from pathlib import Path; import ckpt_crash_worker as w; "
             "print(json.dumps(w.verify(Path(sys.argv[1]), 600)))", str(directory)],
            env=worker_env({"PYTHONPATH": os.pathsep.join([str(WORKER.parent),
                                                           worker_env()["PYTHONPATH"]])}),
            capture_output=True, text=True, timeout=300)
        assert check.returncode == 0, check.stderr[-3000:]
        result = json.loads(check.stdout.strip().splitlines()[-1])
        assert result["ok"], result
