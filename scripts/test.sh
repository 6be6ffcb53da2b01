#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, make Slurm available, run pytest.
#   tier 1 (unit) and tier 2 (multi-process, gloo on CPU) always run;
#   tier 3 (real Slurm) starts a throw-away cluster from tests/slurm/harness and stops it by PID.
#   Tiers 2 and 3 run from a copy of the tree in a folder named scaletrain (see below).
#   Then, from a user's venv on a Python without torch, the tests whose outcome depends on how
#   scaletrain is installed (scripts/test_venv.sh), and the torch range: tiers 1 and 2's
#   launch/strategy/checkpoint tests and the README's example on the releases the centres ship
#   (scripts/test_torch_range.sh).
#   Slurm is installed from Debian's packages when missing and we are root; otherwise those tests skip with a reason.
#   SCALETRAIN_TORCH_RANGE=skip leaves the torch range out (a quicker local run; CI never sets it).
#
# Nothing here relies on what an earlier run or step left behind: each build installs its own
# build requirements (constraints/build.txt), every cached venv is named by what went into it, and
# a build that failed is built again by the next run. The builds the tiers need later (the framework
# venvs, DeepSpeed's CPU op, the user's venv, the torch range's venvs) run in the background while
# the unit tier and the multi-process tests that need none of them run; the tests that need them
# (marked `built`) run once they are done. The run ends with a table of where the time went.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/test_steps.sh
PY=${PYTHON:-python3}
CACHE=${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci}
copy_root=""
trap 'rc=$?; time_table; rm -rf "$STEPS_LOG" ${copy_root:+"$copy_root"}; exit $rc' EXIT
bash scripts/test_costs.sh "$PY" "$CACHE" "$#" >&2

step "install scaletrain with the test extras (scripts/install.sh test)" bash scripts/install.sh test
if [ -x tests/slurm/harness/install.sh ]; then
  # WITH_MPI=1: Open MPI too (before any slurmd starts: slurmd loads libpmix at start), for the
  # mpirun and srun --mpi=pmix tests and Horovod's build
  step "Slurm, munge and Open MPI from Debian's packages (when missing, as root)" \
    env WITH_MPI=1 bash tests/slurm/harness/install.sh \
    || _say "Slurm could not be installed; Slurm tests will skip"
fi
# Chromium renders the HTML scaling report in one test; Debian's package, only as root with apt
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  step "Debian's chromium (the HTML report test)" bash -c 'apt-get -o DPkg::Lock::Timeout=300 update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium >/dev/null' \
    || _say "chromium could not be installed; the HTML render test will skip"
fi
# The builds below that run without build isolation (DeepSpeed here) use this Python's setuptools:
# the pinned one, whatever the Python came with
step "build requirements into $PY (constraints/build.txt)" \
  "$PY" -m pip install -q --disable-pip-version-check -c constraints/build.txt setuptools wheel \
  || _say "the build requirements could not be installed; DeepSpeed's install will say why"
if command -v mpicc >/dev/null 2>&1 && ! "$PY" -c "import mpi4py" >/dev/null 2>&1; then
  step "mpi4py (built against Open MPI)" "$PY" -m pip install -q mpi4py \
    || _say "mpi4py could not be installed; MPI tests will skip"
fi
# DeepSpeed checks the ZeRO configs scaletrain writes with its own config class; it installs on a
# CPU machine from its source package (no ops compiled), and the tests fall back to a field check
if ! "$PY" -c "import deepspeed" >/dev/null 2>&1; then
  step "DeepSpeed (source package, no ops)" \
    env DS_BUILD_OPS=0 "$PY" -m pip install -q --no-build-isolation -c constraints/build.txt "deepspeed==0.19.8" \
    || _say "deepspeed could not be installed; its config check falls back to fields"
fi
if "$PY" -c "import deepspeed" >/dev/null 2>&1; then
  # DeepSpeed on a CPU compiles its shared-memory collectives (deepspeed_shm_comm, C++) at a
  # program's first init_distributed (240 s on a loaded 2-core machine, inside a timed test): built
  # once, in its own folder per DeepSpeed, torch and Python, exported to every test, so another
  # install cannot invalidate it mid-run. The key is the last line printed: DeepSpeed prints a
  # dated warning on stdout at import.
  ds_key=$("$PY" -c 'import sys, deepspeed, torch; print(f"ds{deepspeed.__version__}-torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null | tail -n 1) \
    && export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$CACHE/torch-extensions/$ds_key}"
fi

# builds_for_tier2: what the tests marked `built` need - the guides' TensorFlow (tensorflow-cpu) and
# Horovod (built from PyPI's source against this Python's torch) venvs, and DeepSpeed's CPU op.
# Built here, they are required: a framework test fails, naming the build's cause, when its venv is
# missing (FRAMEWORKS_REQUIRED). SCALETRAIN_HOROVOD=skip leaves Horovod out (its tests skip), as
# does a machine without cmake, a C++ compiler or Open MPI's mpicc (its tests say what is missing).
frameworks=(tensorflow)
if [ "${SCALETRAIN_HOROVOD:-}" != skip ] && bash scripts/frameworks_env.sh --can-build horovod >/dev/null; then
  frameworks+=(horovod)
fi
export FRAMEWORKS_REQUIRED="${frameworks[*]}"
builds_for_tier2() {
  local rc=0
  FRAMEWORKS_BUILD_JOBS=${JOBS:-1} bash scripts/frameworks_env.sh "${frameworks[@]}" \
    || { echo "a framework venv could not be built; its tests fail with the cause"; rc=1; }
  if [ -n "${TORCH_EXTENSIONS_DIR:-}" ]; then
    echo "DeepSpeed's CPU collectives op (built the first time only; $TORCH_EXTENSIONS_DIR)"
    MAX_JOBS=${JOBS:-1} "$PY" -c 'from deepspeed.accelerator import get_accelerator as g
b = g().create_op_builder("ShareMemCommBuilder")
b is None or not b.is_compatible() or b.load()' >/dev/null 2>&1 \
      || echo "DeepSpeed's shared-memory op did not build; the first DeepSpeed test will"
  fi
  return $rc
}

if [ $# -gt 0 ]; then   # a selection of tests: what they may need, then the selection, here, as given
  JOBS=$(nproc) step "framework venvs and DeepSpeed's op" builds_for_tier2 || true
  step "pytest $*" "$PY" -m pytest -q -p no:cacheprovider "$@"
  exit $?
fi

# venvs_for_later: the user's venv and the torch range's venvs (downloads and unpacking, mostly),
# after the builds above: beside a tier there is one build at a time
venvs_for_later() {
  local rc=0
  while ! ended builds; do sleep 2; done
  bash scripts/test_venv.sh --venv-only || rc=1
  if [ "${SCALETRAIN_TORCH_RANGE:-}" != skip ]; then
    bash scripts/test_torch_range.sh --venvs-only >/dev/null || rc=1
  fi
  return $rc
}
background builds "framework venvs and DeepSpeed's op" builds_for_tier2
background venvs "the user's venv and the torch range's venvs" venvs_for_later

# A clone is a folder named scaletrain by default, and CI's checkout is named otherwise: the unit
# tier runs here, the multi-process and Slurm tiers from a copy of the tree in a folder named
# scaletrain (its own src first on PYTHONPATH), so no test or message that depends on the
# folder's name can pass by accident. Moving tiers adds no test time (the copy takes ~1 s).
copy_root=$(mktemp -d "${TMPDIR:-/tmp}/st-suite-XXXXXX")
named="$copy_root/scaletrain"
mkdir "$named"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # what git tracks, and new files it does not ignore (a change under test); not runs/, .hypothesis/
  git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null \
    | tar -xf - -C "$named"
else
  tar --exclude=./.git --exclude=.mypy_cache --exclude=__pycache__ --exclude='*.egg-info' -cf - . \
    | tar -xf - -C "$named"
fi
# tiers23 pending|ready PYTEST_ARGS...: while the builds are pending, a test that asks for a
# framework venv without the `built` mark fails saying so (tests/helpers.py)
tiers23() {
  local pending=$1
  shift
  (cd "$named" && PYTHONPATH="$named/src${PYTHONPATH:+:$PYTHONPATH}" SCALETRAIN_TEST_BUILDS_PENDING=$pending \
    "$PY" -m pytest -q -p no:cacheprovider --durations=25 "$@" tests/multiproc tests/slurm)
}
status=0
step "unit tier (tests/unit)" "$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/unit || status=1
# The supported torch range: the unit tier, the launch/strategy/checkpoint tests and the example
# again on the releases the centres ship, each in its own venv. It starts once its venvs are
# there, one release at a time beside the multi-process and Slurm tiers (which wait on processes
# and on Slurm, and leave about half of 2 CPUs idle), then two at a time once they have ended.
range_widen="$STEPS_LOG/range-widen"
range_run() {
  while ! ended venvs; do sleep 2; done
  env SCALETRAIN_RANGE_LANES="${SCALETRAIN_RANGE_LANES:-2}" SCALETRAIN_RANGE_WIDEN_AT="$range_widen" \
    bash -c 'cd "$1" && bash scripts/test_torch_range.sh' _ "$named"
}
if [ "${SCALETRAIN_TORCH_RANGE:-}" = skip ]; then
  _say "the torch range skipped (SCALETRAIN_TORCH_RANGE=skip)"
else
  background range "the torch range (scripts/test_torch_range.sh; one release at a time beside the tiers, then two)" range_run
fi
step "multi-process and Slurm tiers: the tests that need no build (from $named)" \
  tiers23 pending -m "not built" || status=1
await builds || true   # a failed build fails the tests that need it, with its cause
step "multi-process and Slurm tiers: the tests that need the builds (-m built)" tiers23 ready -m built || status=1
unset FRAMEWORKS_REQUIRED   # built for this Python's torch; the Pythons below have no framework venv
await venvs || true    # a venv that could not be built: the step that needs it says so
# How a user installs: a venv on a Python without torch, scaletrain pip-installed into it
step "the install-dependent tests from a user's venv (scripts/test_venv.sh)" \
  bash -c 'cd "$1" && bash scripts/test_venv.sh' _ "$named" || status=1
touch "$range_widen"   # the tiers have ended: the range may take both CPUs
if [ "${SCALETRAIN_TORCH_RANGE:-}" != skip ]; then
  await range || status=1
fi
exit "$status"
