#!/usr/bin/env bash
# The supported torch range in CI (docs/torch-support.md): on the oldest torch scaletrain supports,
# the newest the package index offers, LUMI's container release 2.7.1 and JUPITER's 2.9.1 (PINS
# below), and on 2.8.0 when named (constraints/torch-2.8.0.txt), each in a venv of its own, run
#   1. the unit tier - on the two ends only (torch-oldest.txt, torch-newest.txt),
#   2. on the ends, the multi-process launch, --emulate, strategy, FSDP2-mean and checkpoint tests
#      (MULTIPROC); between them, the tests where those releases differed (BETWEEN),
#   3. the README's example: scaletrain run --nproc-per-node 2 examples/cifar10_cnn.py --epochs 1.
# The venvs live outside the tree, in ${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci},
# one per pin (named by the torch and a hash of the pin, the packages and this Python), built and
# kept as scripts/cached_venv.sh does for every test venv (an interrupted build is never used).
# Install and tier times go to the log. Exit status: non-zero when any step failed on any torch.
# Releases run side by side in SCALETRAIN_RANGE_LANES lanes (default 1; scripts/test.sh uses 2),
# each release's output shown whole when it ends. With SCALETRAIN_RANGE_WIDEN_AT=FILE, one lane
# until FILE exists, then all of them (scripts/test.sh starts the range beside the multi-process
# tier, which leaves about half of the CPUs idle, and widens it when that tier ends).
# Usage: scripts/test_torch_range.sh [--venvs-only | --plan] [CONSTRAINTS_FILE ...]   (default: PINS)
#   --venvs-only: build (or find) the venvs and print their paths; run no test.
#   --plan: say for each pin whether its venv is reused or would be built (and its cost); build nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cached_venv.sh
PY=${PYTHON:-python3}
CACHE=${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci}
TIER_TIMEOUT_S=${SCALETRAIN_RANGE_TIMEOUT_S:-2400}
LANES=${SCALETRAIN_RANGE_LANES:-1}   # releases run side by side (scripts/test.sh: 2)
WIDEN_AT=${SCALETRAIN_RANGE_WIDEN_AT:-}   # one lane until this file exists
case $LANES in ''|*[!0-9]*|0) echo "SCALETRAIN_RANGE_LANES must be a whole number of at least 1, not '$LANES'" >&2; exit 2 ;; esac
# What the selected tests import (mypy, accelerate, lightning, tensorboard are not installed:
# the tests that need them skip with a reason, and they do not depend on the torch release).
PACKAGES=(numpy crc32c pytest hypothesis)
# The releases CI runs by default: the two ends, and between them the centres' releases
# (constraints/torch-2.7.1.txt, LUMI's container; torch-2.9.1.txt, JUPITER's and EasyBuild's
# module); torch-2.8.0.txt when named. docs/torch-support.md has each one's venv build time and size.
# (The two ends first: in two lanes each end is followed by a short release between them.)
PINS=(constraints/torch-oldest.txt constraints/torch-newest.txt constraints/torch-2.7.1.txt
      constraints/torch-2.9.1.txt)
# Between the ends (2.7.1 and 2.9.1 by default; 2.8.0 when named): the tests where those
# releases differed - FSDP2's reduction (zero3/hsdp summed over gloo on 2.7/2.8), the pipeline
# schedule probe (1F1B hangs on 2.7.1, every schedule aborts over gloo on 2.9.1), --emulate's
# environment - and the example. The whole multi-process set waits on the strategy tests'
# pipeline cases gating on the probe.
BETWEEN=(tests/multiproc/test_fsdp_mean.py tests/multiproc/test_emulate_exports.py
         tests/unit/test_pipeline_probe.py)
# Multi-process tests that meet the torch APIs which differ inside the range: the launcher's
# config, its signal handling (SIGTERM forwarded to the workers), --emulate's environment,
# DDP/FSDP/ZeRO/pipeline strategies (each one's smallest step; zero3 and hsdp against one
# process, where FSDP2's reduction differed between releases: test_fsdp_mean.py) and DCP
# checkpoints. The rest of tier 2 exercises scaletrain's own code the same way on any torch.
# (The example's own test stays in tier 2 only: the example step below trains on each torch.
# test_parallel_equivalence.py stays there too for now: it has no skip for 2.6's missing FSDP2
# on the CPU. The helper test deselected checks the test harness's retry, not torch.)
MULTIPROC=(tests/multiproc/test_launch_contract.py tests/multiproc/test_launch_failure.py
           tests/multiproc/test_preempt_multiproc.py tests/multiproc/test_strategy_interface.py
           tests/multiproc/test_checkpoint_multiproc.py tests/multiproc/test_emulate_exports.py
           tests/multiproc/test_fsdp_mean.py
           --deselect tests/multiproc/test_launch_failure.py::test_workers_helper_reruns_a_native_crash_once)
venvs_only=0 plan_only=0
if [ "${1:-}" = --venvs-only ]; then venvs_only=1; shift; fi
if [ "${1:-}" = --plan ]; then plan_only=1; shift; fi
pins=("$@")
[ ${#pins[@]} -gt 0 ] || pins=("${PINS[@]}")

say() { echo "scaletrain tests: $*" >&2; }
now() { date +%s; }

# venv_for PIN: the venv for the pin (built when missing), its path on stdout; non-zero if it failed.
venv_for() {
  local pin version key dir start
  pin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
  version=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$pin" | head -n 1)
  if [ -z "$version" ]; then
    say "$pin pins no torch (a line torch==X.Y.Z)"; return 1
  fi
  # the venv is made by "$PY" -m venv: on PY's base interpreter (PY may itself be a venv's)
  key=$({ grep -v '^#' "$pin"; echo "${PACKAGES[*]}"; "$PY" -c 'import sys; print(sys.version, sys.base_prefix)'; } | sha256sum | cut -c1-12)
  dir="$CACHE/torch-$version-$key"
  if [ $plan_only = 1 ]; then   # what a run would do, before it downloads anything
    if [ -f "$dir/.complete" ]; then echo "torch $version: venv reused ($dir)"
    else echo "torch $version: venv to build, ~5 GB download and disk (a CUDA build on a CPU machine), 3-5 min"; fi
    return 0
  fi
  if [ -f "$dir/.complete" ]; then
    say "torch $version: venv reused ($dir), install 0 s"
    echo "$dir"; return 0
  fi
  start=$(now)
  if cached_venv "$dir" make_torch_venv "$pin"; then
    say "torch $version: venv built in $(( $(now) - start )) s ($dir)"
    echo "$dir"; return 0
  fi
  say "torch $version: the venv could not be built ($(( $(now) - start )) s); last lines of pip ($dir.failed):"
  tail -n 15 "$dir.failed" >&2 2>/dev/null
  return 1
}

# make_torch_venv TMP PIN: a venv in TMP with the pin's torch and PACKAGES
make_torch_venv() {
  local extra=()
  if ! command -v nvidia-smi >/dev/null 2>&1 && ! command -v rocm-smi >/dev/null 2>&1; then
    mapfile -t extra < <("$PY" scripts/torch_index.py)   # PyTorch's CPU wheels when reachable
  fi
  # PIP_CONSTRAINT names the pin alone: it replaces any constraints file of the machine's own pip
  # configuration (which may cap torch below the newest release the index offers).
  "$PY" -m venv "$1" \
    && PIP_CONSTRAINT="$2" "$1/bin/python" -m pip install -q --disable-pip-version-check \
         "${extra[@]}" torch "${PACKAGES[@]}"
}

# tier NAME VENV VERSION ARGS...: pytest ARGS on the venv's Python; no test collected is a failure.
tier() {
  local name=$1 venv=$2 version=$3 start rc
  shift 3
  start=$(now)
  PYTHONPATH="$PWD/src" timeout "$TIER_TIMEOUT_S" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
  rc=$?
  [ $rc -eq 5 ] && say "torch $version: $name collected no tests"
  say "torch $version: $name $(( $(now) - start )) s, exit $rc"
  return $rc
}

# example VENV VERSION: the README's example trains one epoch on 2 processes.
example() {
  local venv=$1 version=$2 start rc out
  start=$(now)
  out=$(PYTHONPATH="$PWD/src" timeout 600 "$venv/bin/python" -m scaletrain run --nproc-per-node 2 \
          examples/cifar10_cnn.py --epochs 1 2>&1)
  rc=$?
  if [ $rc -eq 0 ] && ! grep -q "epoch 1/1 loss" <<<"$out"; then
    say "torch $version: the example printed no epoch line"; rc=1
  fi
  [ $rc -eq 0 ] || tail -n 30 <<<"$out" >&2
  say "torch $version: example (scaletrain run --nproc-per-node 2 examples/cifar10_cnn.py --epochs 1) $(( $(now) - start )) s, exit $rc"
  return $rc
}

# run_pin PIN: a release's venv, tiers and example; its summary line on stdout; non-zero when any failed
run_pin() {
  local pin=$1 venv version results rc tests status=0
  if ! venv=$(venv_for "$pin"); then
    echo "$pin: no venv"; return 1
  fi
  version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) || version="?"
  results=""
  case "$(basename "$pin")" in
    torch-oldest.txt|torch-newest.txt)   # an end of the range: the unit tier too
      say "torch $version ($pin): unit tier, multi-process tests, example"
      tier "unit tier" "$venv" "$version" tests/unit >&2; rc=$?; results+=" unit=$rc"; [ $rc -eq 0 ] || status=1 ;;
    *) say "torch $version ($pin): the tests where releases differed, example (the rest runs on the ends)" ;;
  esac
  case "$(basename "$pin")" in
    torch-oldest.txt|torch-newest.txt) tests=("${MULTIPROC[@]}") ;;
    *) tests=("${BETWEEN[@]}") ;;
  esac
  tier "multi-process tests" "$venv" "$version" "${tests[@]}" >&2; rc=$?; results+=" multiproc=$rc"; [ $rc -eq 0 ] || status=1
  example "$venv" "$version"; rc=$?; results+=" example=$rc"; [ $rc -eq 0 ] || status=1
  echo "torch $version:$results"
  return $status
}

status=0
summary=()
if [ $plan_only = 1 ] || [ $venvs_only = 1 ]; then
  for pin in "${pins[@]}"; do
    if [ $plan_only = 1 ]; then venv_for "$pin"; continue; fi
    venv_for "$pin" || status=1
  done
  exit "$status"
fi
# Releases run side by side in LANES lanes (each release's steps in order within its lane): a
# release's unit tier is one process, so on 2 cores two releases take little more than one. Each
# release's output is shown whole when it ends.
logs=$(mktemp -d "${TMPDIR:-/tmp}/st-range-XXXXXX")
trap 'rm -rf "$logs"' EXIT
declare -A lane_pin=()
lanes_now() {   # one lane until WIDEN_AT exists, LANES after
  if [ -n "$WIDEN_AT" ] && [ ! -e "$WIDEN_AT" ]; then echo 1; else echo "$LANES"; fi
}
finish_ended() {   # show and keep each release that has ended (its rc file written); 0 if any had
  local pid rc any=1
  for pid in "${!lane_pin[@]}"; do
    # ended: its rc file written, or the lane itself gone (killed before it could write one)
    [ -f "$logs/$pid.rc" ] || [[ "$(ps -o stat= -p "$pid" 2>/dev/null || echo Z)" == Z* ]] || continue
    wait "$pid" 2>/dev/null
    rc=$(cat "$logs/$pid.rc" 2>/dev/null || echo 1)
    cat "$logs/$pid.log" >&2
    summary+=("$(cat "$logs/$pid.summary" 2>/dev/null || echo "${lane_pin[$pid]}: no summary")")
    [ "$rc" = 0 ] || status=1
    unset "lane_pin[$pid]"
    any=0
  done
  return $any
}
for pin in "${pins[@]}"; do
  while [ ${#lane_pin[@]} -ge "$(lanes_now)" ]; do finish_ended || sleep 2; done
  ( run_pin "$pin" >"$logs/$BASHPID.summary" 2>"$logs/$BASHPID.log"; echo $? >"$logs/$BASHPID.rc" ) &
  lane_pin[$!]=$pin
done
while [ ${#lane_pin[@]} -gt 0 ]; do finish_ended || sleep 2; done
for line in "${summary[@]}"; do say "range: $line"; done
exit "$status"
