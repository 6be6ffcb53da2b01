#!/usr/bin/env bash
# Install scaletrain (editable) with the right torch.
#   - torch already installed (a GPU machine, a cluster module, a container): keep it.
#   - no torch and no NVIDIA/AMD GPU: pin the CPU wheel (constraints/cpu.txt); an unpinned
#     torch would pull several GB of CUDA packages.
#   - no torch but a GPU: let pip choose torch>=2.6 from the index.
# Usage: scripts/install.sh [EXTRAS]   e.g. scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
args=(-q -e "$spec")
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if ! command -v nvidia-smi >/dev/null 2>&1 && ! command -v rocm-smi >/dev/null 2>&1; then
    args+=(-c constraints/cpu.txt)
    # the public index's torch==2.13.0 is the CUDA build: add PyTorch's CPU index when reachable
    mapfile -t extra < <("$PY" scripts/torch_index.py)
    args+=("${extra[@]}")
  fi
fi
"$PY" -m pip install "${args[@]}"
