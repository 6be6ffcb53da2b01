#!/usr/bin/env bash
# What `scripts/test.sh` is about to install and build, where, and what it costs: printed before
# anything is downloaded, from what this machine already has (figures measured on a fresh 2-core
# machine, README "Set-up"). Usage: scripts/test_costs.sh PYTHON CACHE_DIR [SELECTED]
# SELECTED: the number of test paths given to scripts/test.sh (a selection builds no user or range venv).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=$1 CACHE=$2 SELECTED=${3:-0}
have() { "$PY" -c "import $1" >/dev/null 2>&1; }
line() { printf 'scaletrain tests:   %s\n' "$*"; }
echo "scaletrain tests: before it starts, what this run installs and builds, and where:"
where=$("$PY" -c 'import sys; print(sys.prefix)' 2>/dev/null)
if have torch && have pytest && have deepspeed; then
  line "into $where: nothing new (torch, the test extras and DeepSpeed are there)"
else
  line "into $where: scaletrain (editable), the test extras, torch's CPU wheel if missing, DeepSpeed, mpi4py: ~2 GB, ~8 min"
fi
as_root_with_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
if as_root_with_apt; then
  if command -v slurmctld >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then
    line "Debian packages: none new (Slurm, munge, Open MPI, Chromium are installed)"
  else
    line "Debian packages, system-wide: Slurm, munge, Open MPI, Chromium (69 packages, ~470 MB); README says how to remove them"
  fi
else
  line "Debian packages: none (not root, or no apt): the Slurm tests and the HTML render test will skip with the reason"
fi
# venv WHAT GLOB COST: WHAT reused when the cache holds a complete venv named GLOB, else what building it costs
venv() {
  if [ -d "$CACHE" ] && compgen -G "$CACHE/$2/.complete" >/dev/null; then line "$1: reused from $CACHE"
  else line "$1: $3"; fi
}
venv "TensorFlow's venv for the framework tests" "frameworks-tensorflow-*" "tensorflow-cpu, ~1.4 GB under $CACHE, ~2 min"
horovod="built from PyPI's source, ~100 MB under $CACHE, ~5-8 min of C++"
if [ "${SCALETRAIN_HOROVOD:-}" = skip ]; then
  line "Horovod's venv: skipped (SCALETRAIN_HOROVOD=skip); its tests skip"
elif lacking=$(bash scripts/frameworks_env.sh --can-build horovod 2>/dev/null); then
  venv "Horovod's venv for the framework tests" "frameworks-horovod-*" "$horovod"
elif [ "$lacking" = mpicc ] && as_root_with_apt && [ -x tests/slurm/harness/install.sh ]; then
  # the Slurm step installs Open MPI before the builds start
  line "Horovod's venv for the framework tests: $horovod, once Open MPI is installed (below)"
else
  line "Horovod's venv: not built, this machine lacks what its build needs (${lacking:-cmake, a C++ compiler, mpicc}); its tests skip"
fi
if [ "$SELECTED" != 0 ]; then
  line "(a selection of tests: no user's venv, no torch range)"
else
  venv "a user's venv for the install-dependent tests" "user-venv-*" "~1 GB under $CACHE, ~2-3 min"
  if [ "${SCALETRAIN_TORCH_RANGE:-}" = skip ]; then
    line "the torch range: skipped (SCALETRAIN_TORCH_RANGE=skip)"
  else
    bash scripts/test_torch_range.sh --plan 2>&1 | sed 's/^/scaletrain tests:   /'
    line "(the torch range's venvs stay in $CACHE for the next run; SCALETRAIN_TORCH_RANGE=skip leaves it out)"
  fi
fi
line "the venvs and DeepSpeed's op are built in the background while the first tiers run"
free=$(df -Pk "${CACHE%/*}" 2>/dev/null | awk 'NR==2 {printf "%.0f", $4/1048576}')
[ -n "$free" ] && line "free disk where the venvs go: ${free} GB"
exit 0
