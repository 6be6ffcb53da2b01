"""``python -m scaletrain.doctor``: the ``scaletrain doctor`` verb as a module, for launchers.

``scaletrain run --nproc-per-node 2 -m scaletrain.doctor`` runs the checks on every worker.
"""

from __future__ import annotations

import sys

from scaletrain.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["doctor", *sys.argv[1:]]))
