"""A job program without torch for the Slurm integration tests: print, sleep, exit with a code.

    exit_job.py CODE [SLEEP_SECONDS]
"""

import os
import sys
import time

code = int(sys.argv[1]) if len(sys.argv) > 1 else 0
print(f"exit_job rank {os.environ.get('SLURM_PROCID', '?')} exiting with {code}", flush=True)
if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
sys.exit(code)
