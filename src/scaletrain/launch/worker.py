"""``python -m scaletrain.launch.worker [-m] TARGET ARGS``: the command line of every worker
`scaletrain run` starts (as ``ps`` and py-spy show it, and as docs/benchmarks.md names it).

The entry's code runs inside the user's process, so it lives with the rest of that side in
:mod:`scaletrain.launch.inproc.worker`; this module only hands over to it. Its frames are
dropped from the user's tracebacks there, as that module's own are.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
        print("usage: python -m scaletrain.launch.worker [-m] TARGET [ARGS...]", file=sys.stderr)
        sys.exit(2)
    from scaletrain.launch.inproc.worker import main

    sys.exit(main(sys.argv[1:]))
