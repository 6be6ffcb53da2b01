#!/usr/bin/env bash
# The frameworks the centres' guides teach besides torch's own, each in a venv of its own for the
# tests that train with the real package (docs/bring-your-script.md):
#   horovod     PyPI's horovod (HOROVOD_VERSION) with PyTorch, MPI and Gloo, built against the torch
#               of this Python (pip's own build needs torch at build time: no build isolation);
#   tensorflow  tensorflow-cpu from the package index (TF_PACKAGE).
# Both venvs see this Python's packages (torch, pytest, scaletrain's own dependencies) and add only
# their framework, so the main environment is never changed. When this Python is itself a venv's (a
# user's), `python -m venv --system-site-packages` links the *base* interpreter's packages, not this
# venv's: a .pth file in the new venv names this Python's site-packages too (link_parent).
#
# Horovod 0.28.1 (its last release) sets C++14 for its PyTorch extension; torch >= 2.1's headers
# stop with "#error C++17 or later compatible compiler is required to use PyTorch." The build
# here takes PyPI's source package and raises that line to C++17, and the top-level one that the
# bundled Gloo is compiled with (HOROVOD_PATCHES below): with Gloo at C++14, its store.cc defines
# Store::kDefaultTimeout out of line while C++17's http_store.cc holds it as an inline variable,
# and the link stops with "multiple definition of gloo::rendezvous::Store::kDefaultTimeout"
# (Horovod builds a C++17 Gloo the same way for a C++17 TensorFlow: its compatible17_gloo). The
# build log says so and keeps pip's output. The build runs without build isolation (it needs torch
# at build time), so its own build requirements (constraints/build.txt: a setuptools with
# bdist_wheel) go into its venv first, never taken from what an earlier step left in this Python.
#
# Venvs live in ${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci}, named by the
# framework and a hash of all that went in (package, build flags, patch, build requirements, this
# Python, the environment it runs in and its torch, and for Horovod the compilers and MPI found),
# built and kept as scripts/cached_venv.sh does for every test venv. A build that failed leaves
# its whole log in NAME-KEY.failed (the tests' reason quotes its first error line). A failure is
# never final: the next run builds again (and a changed input gives a new key anyway).
#
# Usage: scripts/frameworks_env.sh [horovod|tensorflow ...]      build what is missing (default: both)
#        scripts/frameworks_env.sh --find NAME                   print the venv's path (exit 0), or why
#                                                                there is none (exit 1); builds nothing
#        scripts/frameworks_env.sh --can-build NAME              exit 0 when this machine has what NAME's
#                                                                build needs, else print what it lacks (exit 1)
# Environment: FRAMEWORKS_BUILD_JOBS (make's -j for Horovod's C++, default 1); HOROVOD_SDIST, a local
# copy of horovod==HOROVOD_VERSION's source package to build instead of PyPI's (a site without PyPI).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cached_venv.sh
PY=${PYTHON:-python3}
CACHE=${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci}
HOROVOD_VERSION=0.28.1
BUILD_PINS=$PWD/constraints/build.txt
TF_PACKAGE=tensorflow-cpu==2.21.0
HOROVOD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1
               HOROVOD_WITHOUT_MXNET=1)
# the changes to PyPI's source, "FILE:SED": C++17 for the PyTorch extension (torch >= 2.1 needs
# it) and for the rest, the Gloo it links included (one C++ standard on both sides of the link)
HOROVOD_PATCHES=('horovod/torch/CMakeLists.txt:s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/'
                 'CMakeLists.txt:s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/')

say() { echo "scaletrain frameworks: $*" >&2; }
now() { date +%s; }

# key NAME: a hash of what the venv is made of
key() {
  {
    case $1 in
      horovod) echo "horovod==$HOROVOD_VERSION ${HOROVOD_FLAGS[*]} ${HOROVOD_PATCHES[*]}"
               grep -v '^#' "$BUILD_PINS"
               if [ -n "${HOROVOD_SDIST:-}" ]; then sha256sum < "$HOROVOD_SDIST"; fi
               tools ;;
      tensorflow) echo "$TF_PACKAGE" ;;
    esac
    # the Python, the environment it runs in (a venv's packages are linked in) and its torch
    "$PY" -c 'import sys, sysconfig; print(sys.version, sys.prefix, sysconfig.get_paths()["purelib"])'
    "$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "torch none"
  } | sha256sum | cut -c1-12
}

# tools: where Horovod's build programs are and the version each reports (in its key: Open MPI
# installed or upgraded after a failed build means another build)
tools() {
  local c
  for c in "${HOROVOD_NEEDS[@]}"; do
    echo "$c=$(command -v "$c" 2>/dev/null) $("$c" --version 2>/dev/null | head -n 1)"
  done
}

# cause LOG: the first line of a build log that says why it failed (a compiler's or linker's
# error, a killed process), else its last line
cause() {
  grep -m 1 -E "(^|: )(fatal )?error:|undefined reference|ld returned|Killed|make.*Error [0-9]+" "$1" \
    || grep -v '^\s*$' "$1" | tail -n 1
}

# HOROVOD_NEEDS: the programs Horovod's build runs (its CMake, a C++ compiler, Open MPI's wrapper)
HOROVOD_NEEDS=(cmake c++ mpicc)

# can_build NAME: 0 when this machine has the programs NAME's build needs; else what it lacks (stdout)
can_build() {
  local c lacking=()
  if [ "$1" = horovod ]; then
    for c in "${HOROVOD_NEEDS[@]}"; do command -v "$c" >/dev/null 2>&1 || lacking+=("$c"); done
  fi
  [ ${#lacking[@]} -eq 0 ] && return 0
  echo "${lacking[*]}"
  return 1
}

# find NAME: the complete venv's path on stdout; else why not (stderr) and exit 1
find_env() {
  local dir="$CACHE/frameworks-$1-$(key "$1")"
  if [ -f "$dir/.complete" ]; then echo "$dir"; return 0; fi
  if [ -f "$dir.failed" ]; then
    echo "$1 could not be built here: $(cause "$dir.failed") (log: $dir.failed)" >&2
  else
    local lacking
    if [ "$1" = horovod ] && ! lacking=$(can_build horovod); then
      echo "no horovod venv in $CACHE, and this machine cannot build one: no $lacking on PATH (Horovod's build needs cmake, a C++ compiler and Open MPI's mpicc: as root, WITH_MPI=1 tests/slurm/harness/install.sh installs Open MPI)" >&2
    elif [ "$1" = horovod ]; then
      echo "no horovod venv in $CACHE: scripts/test.sh builds it (about 5 min of C++ on 2 cores) unless SCALETRAIN_HOROVOD=skip; or run scripts/frameworks_env.sh horovod" >&2
    else
      echo "no $1 venv in $CACHE: run scripts/frameworks_env.sh $1" >&2
    fi
  fi
  return 1
}

# patch_horovod SRC LOG: HOROVOD_PATCHES applied; fails when a line to change is not there
patch_horovod() {
  local p file expr
  for p in "${HOROVOD_PATCHES[@]}"; do
    file=${p%%:*} expr=${p#*:}
    grep -qF -- "$(echo "$expr" | cut -d/ -f2)" "$1/$file" \
      || { echo "patch: nothing to change in $file ($expr)" >>"$2"; return 1; }
    sed -i "$expr" "$1/$file" && echo "patched $file: $expr" >>"$2" || return 1
  done
}

# install_horovod VENV LOG: PyPI's source package (or HOROVOD_SDIST), patched, built against the
# torch of this Python, with constraints/build.txt's build requirements installed in VENV first
install_horovod() {
  local venv=$1 log=$2 src
  "$venv/bin/python" -c 'import torch' >>"$log" 2>&1 \
    || { echo "no torch in $PY's environment: Horovod builds against it" >>"$log"; return 1; }
  echo "build requirements (constraints/build.txt): $(grep -v '^#' "$BUILD_PINS" | tr '\n' ' ')" >>"$log"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$BUILD_PINS" setuptools wheel >>"$log" 2>&1 \
    || { echo "the build requirements could not be installed" >>"$log"; return 1; }
  src=$(mktemp -d "$venv/.src-XXXXXX") || return 1
  if [ -n "${HOROVOD_SDIST:-}" ]; then
    cp -- "$HOROVOD_SDIST" "$src/horovod-$HOROVOD_VERSION.tar.gz"
  else
    "$venv/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$src" "horovod==$HOROVOD_VERSION" >>"$log" 2>&1
  fi \
    && tar -xzf "$src"/horovod-*.tar.gz -C "$src" \
    && patch_horovod "$src/horovod-$HOROVOD_VERSION" "$log" \
    && env "${HOROVOD_FLAGS[@]}" MAKEFLAGS="-j${FRAMEWORKS_BUILD_JOBS:-1}" \
         "$venv/bin/python" -m pip install -v --no-build-isolation --no-cache-dir \
         "$src/horovod-$HOROVOD_VERSION" >>"$log" 2>&1 \
    && "$venv/bin/python" -c 'import horovod.torch as hvd; assert hvd.mpi_built() and hvd.gloo_built()' >>"$log" 2>&1
  local rc=$?
  rm -rf -- "$src"
  return $rc
}

# link_parent VENV: when this Python runs in a venv, VENV sees that venv's packages too (after its
# own): --system-site-packages alone links only the base interpreter's
link_parent() {
  local paths site
  paths=$("$PY" -c 'import sys, sysconfig
if sys.prefix != sys.base_prefix:
    p = sysconfig.get_paths()
    print("\n".join(dict.fromkeys([p["purelib"], p["platlib"]])))') || return 1
  [ -n "$paths" ] || return 0
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  printf '%s\n' "$paths" > "$site/_scaletrain_parent_env.pth" || return 1
  echo "sees the packages of $PY's venv: $(echo "$paths" | tr '\n' ' ')"
}

# make_env TMP NAME: the venv for NAME made in TMP (output: the build log)
make_env() {
  "$PY" -m venv --system-site-packages "$1" && link_parent "$1" || return 1
  case $2 in
    horovod) install_horovod "$1" "$1/build.log" ;;
    tensorflow) "$1/bin/python" -m pip install -q --disable-pip-version-check "$TF_PACKAGE" \
                  && "$1/bin/python" -c 'import tensorflow' ;;
  esac
}

# build NAME: the venv for NAME, built when missing (after a failed build of an earlier run too)
build() {
  local name=$1 dir start
  dir="$CACHE/frameworks-$name-$(key "$name")"
  if [ -f "$dir/.complete" ]; then say "$name: venv reused ($dir)"; return 0; fi
  if [ -f "$dir.failed" ]; then say "$name: failed in an earlier run ($(cause "$dir.failed")); building again"; fi
  start=$(now)
  say "$name: building $dir (the log goes to $dir.failed if it fails)"
  if cached_venv "$dir" make_env "$name"; then
    say "$name: venv built in $(( $(now) - start )) s ($dir)"; return 0
  fi
  say "$name: could not be built ($(( $(now) - start )) s): $(cause "$dir.failed") (log: $dir.failed)"
  return 1
}

if [ "${1:-}" = --can-build ]; then
  [ $# -eq 2 ] || { say "usage: $0 --can-build horovod|tensorflow"; exit 2; }
  if lacking=$(can_build "$2"); then exit 0; fi
  echo "$lacking"   # what is missing, for scripts/test_costs.sh
  say "$2 cannot be built here: no $lacking on PATH"; exit 1
fi
if [ "${1:-}" = --find ]; then
  [ $# -eq 2 ] || { say "usage: $0 --find horovod|tensorflow"; exit 2; }
  find_env "$2"; exit $?
fi
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(tensorflow horovod)
status=0
for name in "${names[@]}"; do
  case $name in
    horovod|tensorflow) build "$name" || status=1 ;;
    *) say "unknown framework $name (horovod, tensorflow)"; status=2 ;;
  esac
done
exit $status
