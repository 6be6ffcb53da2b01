# Sourced by scripts/test.sh: each step of a test run timed, some run in the background beside the
# tiers that do not need them, and at the end one table of where the time went.
#
#   step NAME CMD...        run CMD here; its time and exit status go to the table; returns its status
#   background ID NAME CMD...  start CMD in the background (its output to a log, shown when awaited)
#   await ID                wait for a background step, show its output, return its status
#   ended ID                true once a background step has ended
#   time_table              the table (printed by test.sh at exit)
#
# A background step's time is its own, from start to end; the table also says how long the run
# waited for it (0 when the tiers before it took longer). STEPS_LOG is where the logs go.

STEPS_START=$(date +%s)
STEPS_LOG=$(mktemp -d "${TMPDIR:-/tmp}/st-steps-XXXXXX")
STEP_ROWS=()
declare -A BG_PID=() BG_START=() BG_NAME=()

_say() { echo "scaletrain tests: $*" >&2; }

step() {
  local name=$1 start rc
  shift
  start=$(date +%s)
  _say "[$(( start - STEPS_START )) s] $name"
  set +e; "$@"; rc=$?; set -e
  STEP_ROWS+=("$name|$(( $(date +%s) - start ))|-|$rc")
  return $rc
}

background() {
  local id=$1 name=$2
  shift 2
  _say "[$(( $(date +%s) - STEPS_START )) s] $name: started in the background (its output when it is needed)"
  BG_START[$id]=$(date +%s)
  BG_NAME[$id]=$name
  # the step's own end time, so that its time in the table is its own and not the wait's
  ( set +e; "$@"; rc=$?; date +%s >"$STEPS_LOG/$id.end"; exit $rc ) >"$STEPS_LOG/$id.log" 2>&1 &
  BG_PID[$id]=$!
}

ended() { [ -f "$STEPS_LOG/$1.end" ]; }

await() {
  local id=$1 start rc end
  start=$(date +%s)
  set +e; wait "${BG_PID[$id]}"; rc=$?; set -e
  end=$(cat "$STEPS_LOG/$id.end" 2>/dev/null || date +%s)
  sed "s/^/  | /" "$STEPS_LOG/$id.log" >&2
  _say "[$(( $(date +%s) - STEPS_START )) s] ${BG_NAME[$id]}: done in $(( end - BG_START[$id] )) s, exit $rc"
  STEP_ROWS+=("${BG_NAME[$id]} (background)|$(( end - BG_START[$id] ))|$(( $(date +%s) - start ))|$rc")
  return $rc
}

time_table() {
  local row name secs waited rc
  _say "where the time went (wall-clock seconds; a background step's time overlaps the steps beside it):"
  printf 'scaletrain tests:   %-72s %7s %7s %5s\n' "step" "seconds" "waited" "exit" >&2
  for row in "${STEP_ROWS[@]}"; do
    IFS='|' read -r name secs waited rc <<<"$row"
    printf 'scaletrain tests:   %-72s %7s %7s %5s\n' "$name" "$secs" "$waited" "$rc" >&2
  done
  printf 'scaletrain tests:   %-72s %7s\n' "total" "$(( $(date +%s) - STEPS_START ))" >&2
}
