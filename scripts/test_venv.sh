#!/usr/bin/env bash
# The tests whose outcome depends on how scaletrain is installed, run from a virtual environment
# the way most users install it (`python3 -m venv`, then `pip install`), not from the system Python
# CI's main run uses. From a venv, `python -m venv --system-site-packages` sees the *base* Python's
# packages, not the venv's: the tests of `env create` and of jobs using the venv it makes (issue:
# they passed in the system Python and failed in every venv) must hold there too.
#
# The venv is cached like the torch-range venvs (${SCALETRAIN_CI_CACHE:-~/.cache/scaletrain-ci}),
# keyed by the CPU pin, the packages and this Python, built and kept as scripts/cached_venv.sh does. scaletrain itself is installed into it afresh on every run (not editable: a
# user's `pip install .`), from the tree this script is in.
# Usage: scripts/test_venv.sh [PYTEST ARGS...]   (default: the tests named in TESTS below)
#        scripts/test_venv.sh --venv-only        build (or find) the venv, print its path, run nothing
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cached_venv.sh
PY=${PYTHON:-python3}
CACHE=${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci}
PACKAGES=(numpy crc32c pytest hypothesis setuptools wheel)
# plus the checkpoint tests: the venv's base is another Python build (Debian's 3.11 pickles an
# enum member as getattr(EnumClass, NAME) in DCP's metadata, which the allow-list once refused)
TESTS=(tests/unit/test_envs.py tests/unit/test_submit_path.py tests/slurm/test_slurm_env.py
       tests/unit/test_checkpoint_single.py tests/unit/test_checkpoint_hostile.py)
say() { echo "scaletrain tests: $*" >&2; }

# The venv's base: a Python without torch, as a user's usually is (the system's python3 when it has
# none); from a base with torch the tests would pass with or without the venv case handled.
BASE=$PY
for cand in ${SCALETRAIN_VENV_BASE:-} /usr/bin/python3 /usr/local/bin/python3 "$PY"; do
  [ -x "$(command -v "$cand" 2>/dev/null)" ] || continue
  if "$cand" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1 \
     && ! "$cand" -c 'import torch' >/dev/null 2>&1; then BASE=$cand; break; fi
done
if "$BASE" -c 'import torch' >/dev/null 2>&1; then
  say "every Python here has torch: the venv's base ($BASE) has it too, so the tests below cannot tell a venv from the system Python"
fi
key=$({ grep -v '^#' constraints/cpu.txt constraints/build.txt; echo "${PACKAGES[*]}"; command -v "$BASE"; "$BASE" -c 'import sys; print(sys.version, sys.base_prefix)'; } \
      | sha256sum | cut -c1-12)
venv="$CACHE/user-venv-$key"
# make_user_venv TMP: a venv on BASE with the CPU pin's torch and PACKAGES
make_user_venv() {
  local extra=()
  if ! command -v nvidia-smi >/dev/null 2>&1 && ! command -v rocm-smi >/dev/null 2>&1; then
    mapfile -t extra < <("$PY" scripts/torch_index.py)
  fi
  "$BASE" -m venv "$1" \
    && PIP_CONSTRAINT="$PWD/constraints/cpu.txt $PWD/constraints/build.txt" "$1/bin/python" -m pip install -q \
         --disable-pip-version-check "${extra[@]}" torch "${PACKAGES[@]}"
}
if [ ! -f "$venv/.complete" ]; then
  start=$(date +%s)
  say "a user's venv for the install-dependent tests: building $venv on $BASE (torch from constraints/cpu.txt, ~1 GB)"
  if ! cached_venv "$venv" make_user_venv; then
    say "the user's venv could not be built; last lines of pip ($venv.failed):"
    tail -n 15 "$venv.failed" >&2 2>/dev/null
    exit 1
  fi
  say "the user's venv: built in $(( $(date +%s) - start )) s"
else
  say "the user's venv: reused ($venv)"
fi
if [ "${1:-}" = --venv-only ]; then echo "$venv"; exit 0; fi
# this tree's scaletrain, installed as a user installs it (no PYTHONPATH from here on)
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
       --force-reinstall . >"$venv/scaletrain-install.log" 2>&1; then
  say "scaletrain could not be installed into the user's venv:"; tail -n 15 "$venv/scaletrain-install.log" >&2
  exit 1
fi
[ $# -gt 0 ] || set -- "${TESTS[@]}"
env -u PYTHONPATH "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
rc=$?
say "the install-dependent tests from a user's venv: exit $rc"
exit $rc
