# Sourced by the scripts that keep venvs for the tests (test_torch_range.sh, test_venv.sh,
# frameworks_env.sh): the one way such a venv is built, found and kept.
#
# A venv lives in the cache (${SCALETRAIN_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain-ci}),
# named by what went into it (the caller's key). It counts only when complete: built in a
# temporary folder beside its final name and renamed into place after its last package is in, so
# an interrupted build is never used, and a kill part-way leaves only a .build-* folder that a
# later run removes. The build's whole log is kept as NAME.failed when it fails (the cause of a
# long build is far above its last lines).

# cached_venv DIR BUILD [ARGS...]: make sure DIR is a complete venv. When it is not, run
# `BUILD TMP ARGS...` (its output to TMP/build.log) on a fresh temporary folder TMP beside DIR,
# and rename TMP to DIR when BUILD succeeds. Returns 0 when DIR is complete, else BUILD's status
# (the log then in DIR.failed).
cached_venv() {
  local dir=$1 build=$2 parent tmp rc
  shift 2
  [ -f "$dir/.complete" ] && return 0
  parent=${dir%/*}
  mkdir -p "$parent" || return 1
  [ -d "$dir" ] && rm -rf -- "$dir"   # ours, and never completed
  # what an interrupted build left: builds take minutes, not hours
  find "$parent" -maxdepth 1 -name ".build-*" -mmin +240 -exec rm -rf -- {} + 2>/dev/null
  tmp=$(mktemp -d "$parent/.build-${dir##*/}-XXXXXX") || return 1
  "$build" "$tmp" "$@" >>"$tmp/build.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    # a venv's scripts (bin/activate, pip's shebangs) name the folder it was made in: the final one
    grep -rlI -- "$tmp" "$tmp/bin" "$tmp/pyvenv.cfg" 2>/dev/null | xargs -r sed -i "s|$tmp|$dir|g"
    if touch "$tmp/.complete" && mv -T "$tmp" "$dir" 2>/dev/null; then
      rm -f -- "$dir.failed"
      return 0
    fi
    if [ -f "$dir/.complete" ]; then   # another run finished the same venv meanwhile
      rm -rf -- "$tmp"
      return 0
    fi
    rc=1
  fi
  cp -- "$tmp/build.log" "$dir.failed" 2>/dev/null
  rm -rf -- "$tmp"
  return $rc
}
