#!/usr/bin/env bash
# Install scaletrain (editable) with the right torch.
#   - torch already installed (a GPU machine, a cluster module, a container): keep it.
#   - no torch and no NVIDIA/AMD GPU: pin the CPU wheel (constraints/cpu.txt); an unpinned
#     torch would pull several GB of CUDA packages (where no CPU build can be had, it stops and
#     says the choice: scripts/torch_index.py).
#   - the system's Python of Debian or Ubuntu (PEP 668): stops, saying to make a venv first.
#   - no torch but a GPU: let pip choose torch>=2.6 from the index.
# Usage: scripts/install.sh [EXTRAS]   e.g. scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# PEP 668: outside a venv, Debian's and Ubuntu's Python refuse pip installs (externally managed)
if "$PY" -c 'import sys, sysconfig, os
sys.exit(0 if sys.prefix == sys.base_prefix and os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)' 2>/dev/null; then
  echo "scaletrain install: $PY is the system's Python, whose packages the OS manages (PEP 668); make a venv first: python3 -m venv ~/venvs/scaletrain && . ~/venvs/scaletrain/bin/activate, then run this again" >&2
  exit 2
fi
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
args=(-q -e "$spec")
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if ! command -v nvidia-smi >/dev/null 2>&1 && ! command -v rocm-smi >/dev/null 2>&1; then
    args+=(-c constraints/cpu.txt)
    # the public index's torch==2.13.0 is the CUDA build: add PyTorch's CPU index when reachable;
    # when neither it nor pip's own configuration has a CPU build, stop (torch_index.py says the choice)
    chosen=$("$PY" scripts/torch_index.py) || exit $?
    mapfile -t extra <<<"$chosen"
    [ -n "$chosen" ] && args+=("${extra[@]}")
  fi
fi
"$PY" -m pip install "${args[@]}"
