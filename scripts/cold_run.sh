#!/usr/bin/env bash
# The README's test command as a new machine runs it, to rehearse CI's first run anywhere:
#   - a clean clone of this checkout's HEAD (what CI checks out; uncommitted changes are not in it),
#     with ../shared beside it when this checkout has one;
#   - a Python that has never run it: a new venv on BASE (only what `python -m venv` puts there),
#     activated as a user activates one (CI's system Python has a few more packages, never fewer);
#   - empty caches: the test venvs (SCALETRAIN_CI_CACHE), pip's, and every other XDG cache;
# then prints where the time went (each install, build and tier: scripts/test.sh's table), the
# total, and the disk each part took. As root the system packages (Slurm, Open MPI, Chromium) are
# installed when missing, as on a new machine; remove them first for a fully cold run (README).
#
# Usage: scripts/cold_run.sh [--base PYTHON] [--work DIR] [--keep | --warm DIR] [-- TEST.SH ARGS...]
#   --base PYTHON  the interpreter the venv is made from (default: python3's own base interpreter);
#                  for a user's rehearsal on Debian, /usr/bin/python3 (PEP 668: venvs only)
#   --work DIR     where the clone, venv and caches go (default: a new folder under $TMPDIR or /tmp)
#   --keep         keep them afterwards (default: removed, all but the log)
#   --warm DIR     run again in a folder an earlier --keep run left (its venv and caches, a new
#                  clone): CI's time on a machine that has run it before
# Environment: SCALETRAIN_TORCH_RANGE=skip and SCALETRAIN_HOROVOD=skip pass through to the run.
# Exit status: the test command's.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
base="" work="" keep=0 warm=0
while [ $# -gt 0 ]; do
  case $1 in
    --base) base=${2:?--base needs a Python}; shift 2 ;;
    --work) work=${2:?--work needs a folder}; shift 2 ;;
    --keep) keep=1; shift ;;
    --warm) work=${2:?--warm needs the folder of a --keep run}; warm=1; keep=1; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "cold run: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
say() { echo "cold run: $*" >&2; }
if [ -z "$base" ]; then
  base=$(python3 -c 'import sys; print(getattr(sys, "_base_executable", sys.executable) if sys.prefix != sys.base_prefix else sys.executable)') \
    || { say "no python3 on PATH (--base PYTHON)"; exit 2; }
fi
"$base" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
  || { say "$base is not a Python >= 3.10 with venv (--base PYTHON)"; exit 2; }
if [ $warm = 1 ]; then
  [ -x "$work/venv/bin/python" ] && [ -d "$work/cache" ] || { say "$work is not the folder of a --keep run"; exit 2; }
  rm -rf -- "$work/checkout"
elif [ -z "$work" ]; then work=$(mktemp -d "${TMPDIR:-/tmp}/st-cold-XXXXXX") || exit 1
elif [ -e "$work" ] && [ -n "$(ls -A "$work" 2>/dev/null)" ]; then say "$work is not empty"; exit 2
else mkdir -p "$work" || exit 1; fi
log="$work/cold-run.log"
[ $warm = 1 ] && log="$work/warm-run.log"
[ -n "$(git -C "$here" status --porcelain 2>/dev/null)" ] && say "this checkout has uncommitted changes: the clone has HEAD only"

# the machine, before: what the run will add system-wide
packages_before=$(dpkg-query -W -f '${Installed-Size}\n' 2>/dev/null | awk '{s += $1} END {print s + 0}')
git clone -q --no-hardlinks "$here" "$work/checkout/scaletrain" || { say "could not clone $here"; exit 1; }
[ -d "$here/../shared" ] && ln -s "$(cd "$here/../shared" && pwd)" "$work/checkout/shared"
if [ $warm = 0 ]; then
  "$base" -m venv "$work/venv" || { say "could not make a venv on $base"; exit 1; }
  mkdir -p "$work/cache" "$work/pip-cache" "$work/xdg-cache"
fi
say "clone $work/checkout/scaletrain at $(git -C "$here" rev-parse --short HEAD), venv on $base ($("$base" --version 2>&1)), as $(id -un)"
say "log: $log"

start=$(date +%s)
(
  cd "$work/checkout/scaletrain" || exit 1
  unset PYTHONPATH PYTHON TORCH_EXTENSIONS_DIR SCALETRAIN_CI_CACHE
  export VIRTUAL_ENV="$work/venv" PATH="$work/venv/bin:$PATH" PIP_CACHE_DIR="$work/pip-cache" \
         XDG_CACHE_HOME="$work/xdg-cache" SCALETRAIN_CI_CACHE="$work/cache"
  # CI's command exactly; a selection of tests through scripts/test.sh
  if [ $# -eq 0 ] && [ -f .ci/run ]; then bash .ci/run; else bash scripts/test.sh "$@"; fi
) >"$log" 2>&1
rc=$?
total=$(( $(date +%s) - start ))

size() { du -sh "$1" 2>/dev/null | cut -f1; }
packages_after=$(dpkg-query -W -f '${Installed-Size}\n' 2>/dev/null | awk '{s += $1} END {print s + 0}')
echo
grep -E "^scaletrain tests: (where the time went|  )" "$log" | sed -n '/where the time went/,$p'
echo
echo "cold run: $([ $warm = 1 ] && echo "warm (again in $work)" || echo cold): exit $rc after $(( total / 60 )) min $(( total % 60 )) s ($(id -un), venv on $base)"
echo "cold run: disk: the venv $(size "$work/venv"), the test venvs and builds $(size "$work/cache"), pip's cache $(size "$work/pip-cache"), other caches $(size "$work/xdg-cache"), the clone $(size "$work/checkout/scaletrain"), system packages added $(( (packages_after - packages_before) / 1024 )) MB"
# each pytest run's last line, and the torch range's summary
grep -E "[0-9]+ (passed|failed|errors?|skipped)(,.*)? in [0-9.]+s|scaletrain tests: range: " "$log" | sed 's/^/cold run: /'
if [ $keep = 0 ]; then
  kept="${TMPDIR:-/tmp}/st-cold-run-$(date +%Y%m%d-%H%M%S).log"
  cp "$log" "$kept" && say "the whole log: $kept"
  rm -rf -- "$work"
else
  say "kept: $work (the whole log: $log)"
fi
exit $rc
