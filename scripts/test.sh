#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, make Slurm available, run pytest.
#   tier 1 (unit) and tier 2 (multi-process, gloo on CPU) always run;
#   tier 3 (real Slurm) starts a throw-away cluster from tests/slurm/harness and stops it by PID.
#   Tiers 2 and 3 run from a copy of the tree in a folder named scaletrain (see the end).
#   Then the torch range: tiers 1 and 2's launch/strategy/checkpoint tests and the README's example
#   on the oldest supported torch and on the newest available (scripts/test_torch_range.sh).
#   Slurm is installed from Debian's packages when missing and we are root; otherwise those tests skip with a reason.
#   Then, from a user's venv on a Python without torch, the tests whose outcome depends on how
#   scaletrain is installed (scripts/test_venv.sh).
#   SCALETRAIN_TORCH_RANGE=skip leaves the torch range out (a quicker local run; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CACHE=${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci}
if [ $# -eq 0 ]; then bash scripts/test_costs.sh "$PY" "$CACHE" >&2; fi
bash scripts/install.sh test
if [ -x tests/slurm/harness/install.sh ]; then
  # WITH_MPI=1: Open MPI too (before any slurmd starts: slurmd loads libpmix at start), for the
  # mpirun and srun --mpi=pmix tests
  WITH_MPI=1 bash tests/slurm/harness/install.sh || echo "scaletrain tests: Slurm could not be installed; Slurm tests will skip" >&2
fi
# The guides' TensorFlow (tensorflow-cpu, ~2 min once) and Horovod (built from PyPI's source against
# this Python's torch, ~5 min of C++ on 2 cores once), each in a venv of its own for the framework
# tests. Built here, they are required: a framework test fails, naming the build's cause, when its
# venv is missing (FRAMEWORKS_REQUIRED). SCALETRAIN_HOROVOD=skip leaves Horovod out (its tests skip).
frameworks=(tensorflow)
# Horovod where this machine can build it (cmake, a C++ compiler, Open MPI's mpicc); else its
# tests skip, saying what is missing (a user's machine without Open MPI, say)
if [ "${SCALETRAIN_HOROVOD:-}" != skip ] && bash scripts/frameworks_env.sh --can-build horovod; then
  frameworks+=(horovod)
fi
export FRAMEWORKS_REQUIRED="${frameworks[*]}"
FRAMEWORKS_BUILD_JOBS=$(nproc) bash scripts/frameworks_env.sh "${frameworks[@]}" \
  || echo "scaletrain tests: a framework venv could not be built; its tests fail with the cause" >&2
if command -v mpicc >/dev/null 2>&1 && ! "$PY" -c "import mpi4py" >/dev/null 2>&1; then
  "$PY" -m pip install -q mpi4py || echo "scaletrain tests: mpi4py could not be installed; MPI tests will skip" >&2
fi
# DeepSpeed checks the ZeRO configs scaletrain writes with its own config class; it installs on a
# CPU machine from its source package (no ops compiled), and the tests fall back to a field check
if ! "$PY" -c "import deepspeed" >/dev/null 2>&1; then
  { "$PY" -m pip install -q wheel && DS_BUILD_OPS=0 "$PY" -m pip install -q --no-build-isolation "deepspeed==0.19.8"; } \
    || echo "scaletrain tests: deepspeed could not be installed; its config check falls back to fields" >&2
fi
# DeepSpeed on a CPU compiles its shared-memory collectives (deepspeed_shm_comm, C++) at a program's
# first init_distributed, which DS_BUILD_OPS=0 leaves to that first use (240 s on a loaded 2-core
# machine, inside a timed test): build it here, once; torch caches it (a few seconds after)
if "$PY" -c "import deepspeed" >/dev/null 2>&1; then
  # its own folder per DeepSpeed, torch and Python, exported to every test: another install (a
  # different torch, a DeepSpeed upgrade) cannot invalidate it mid-run and make a test rebuild it.
  # The key is the last line printed: DeepSpeed prints a dated warning on stdout at import.
  ds_key=$("$PY" -c 'import sys, deepspeed, torch; print(f"ds{deepspeed.__version__}-torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null | tail -n 1) \
    && export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$CACHE/torch-extensions/$ds_key}"
  echo "scaletrain tests: DeepSpeed's CPU collectives op (built the first time only, ~4 min; ${TORCH_EXTENSIONS_DIR:-the default folder})" >&2
  "$PY" -c 'from deepspeed.accelerator import get_accelerator as g
b = g().create_op_builder("ShareMemCommBuilder")
b is None or not b.is_compatible() or b.load()' >/dev/null 2>&1 \
    || echo "scaletrain tests: DeepSpeed's shared-memory op did not build; the first DeepSpeed test will" >&2
fi
# Chromium renders the HTML scaling report in one test; Debian's package, only as root with apt
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "scaletrain tests: installing Debian's chromium (HTML report test)" >&2
  { apt-get -o DPkg::Lock::Timeout=300 update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium >/dev/null; } \
    || echo "scaletrain tests: chromium could not be installed; the HTML render test will skip" >&2
fi
if [ $# -gt 0 ]; then   # a selection of tests: run it here, as given
  exec "$PY" -m pytest -q -p no:cacheprovider "$@"
fi
# A clone is a folder named scaletrain by default, and CI's checkout is named otherwise: the unit
# tier runs here, the multi-process and Slurm tiers from a copy of the tree in a folder named
# scaletrain (its own src first on PYTHONPATH), so no test or message that depends on the
# folder's name can pass by accident. Moving tiers adds no test time (the copy takes ~1 s).
copy_root=$(mktemp -d "${TMPDIR:-/tmp}/st-suite-XXXXXX")
trap 'rm -rf "$copy_root"' EXIT
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
status=0
"$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/unit || status=$?
echo "scaletrain tests: multi-process and Slurm tiers from $named" >&2
(cd "$named" && PYTHONPATH="$named/src${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" -m pytest -q -p no:cacheprovider --durations=25 tests/multiproc tests/slurm) || status=$?
unset FRAMEWORKS_REQUIRED   # built for this Python's torch; the Pythons below have no framework venv
# How a user installs: a venv on a Python without torch, scaletrain pip-installed into it
echo "scaletrain tests: the install-dependent tests from a user's venv (scripts/test_venv.sh)" >&2
(cd "$named" && bash scripts/test_venv.sh) || status=$?
# The supported torch range: the unit tier, the launch/strategy/checkpoint tests and the example
# again on the releases the centres ship, each in its own venv
if [ "${SCALETRAIN_TORCH_RANGE:-}" = skip ]; then
  echo "scaletrain tests: the torch range skipped (SCALETRAIN_TORCH_RANGE=skip)" >&2
else
  echo "scaletrain tests: the torch range (scripts/test_torch_range.sh)" >&2
  (cd "$named" && bash scripts/test_torch_range.sh) || status=$?
fi
exit "$status"
