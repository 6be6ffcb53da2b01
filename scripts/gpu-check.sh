#!/usr/bin/env bash
# The GPU acceptance run in one command, on a bare GPU machine or a cluster's GPU node:
#   bash scripts/gpu-check.sh [OUT] [--only "STEP,STEP"]      (default OUT: gpu-check/)
# installs scaletrain (and torch for the card, via scripts/install.sh) plus pytest and the
# device-sampler library when they are missing, then runs benchmarks/gpu_check.py, which writes
# OUT/gpu_check.json and OUT/gpu_check.md. The whole run is bounded by 10 minutes; on a machine
# without a GPU every GPU step reports "skipped: no GPU". See docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-gpu-check}
shift || true  # the rest goes to gpu_check.py (e.g. --only "model vs torchtitan")
if ! "$PY" -c "import scaletrain, torch" >/dev/null 2>&1; then
  bash scripts/install.sh
fi
need=()
"$PY" -c "import pytest" >/dev/null 2>&1 || need+=(pytest)
if command -v nvidia-smi >/dev/null 2>&1 && ! "$PY" -c "import pynvml" >/dev/null 2>&1; then
  need+=(nvidia-ml-py)
fi
if [ ${#need[@]} -gt 0 ]; then
  "$PY" -m pip install -q "${need[@]}"
fi
# 570 s for the measurements leaves the install's time inside a 10-minute command slot
exec timeout 570 "$PY" benchmarks/gpu_check.py --out "$OUT" --budget-s 480 "$@"
