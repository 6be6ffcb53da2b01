"""A worker that starts helpers the way real programs do: a child that ignores SIGTERM, a
daemon (double fork + setsid), and a plain subprocess; it writes their PIDs, then fails or
hangs as asked (argv[1]: "fail", "hang" or "ok"; argv[2]: the folder for the PID files)."""

import os
import signal
import subprocess
import sys
import time

mode, folder = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", "0")
pids = []
child = os.fork()
if child == 0:  # ignores TERM, lives on
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
    os._exit(0)
pids.append(child)
first = os.fork()
if first == 0:  # the classic daemon
    os.setsid()
    second = os.fork()
    if second:
        with open(os.path.join(folder, f"daemon-{rank}"), "w") as fh:
            fh.write(str(second))
        os._exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
    os._exit(0)
os.waitpid(first, 0)
pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid)
with open(os.path.join(folder, f"pids-{rank}"), "w") as fh:
    fh.write(" ".join(map(str, pids)))
if mode == "fail" and rank == "1":
    sys.exit(3)
if mode == "hang":
    time.sleep(600)
