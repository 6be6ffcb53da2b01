#!/usr/bin/env bash
# Stop what up.sh started in state dir S: cancel its jobs, stop its daemons by their PID files
# (never by name), remove its /etc/hosts line. Safe to run twice or after a failed up.sh.
S=${S:?set S to the state directory given to up.sh}
export PATH="$PATH:/usr/sbin:/sbin"
export SLURM_CONF=$S/etc/slurm.conf
if [ -f "$S/slurmctld.pid" ] && kill -0 "$(cat "$S/slurmctld.pid")" 2>/dev/null; then
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null || true)
  if [ -n "$jobs" ]; then
    timeout 10 scancel --full $jobs 2>/dev/null || true
    for t in $(seq 1 40); do [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && break; sleep 0.25; done
  fi
fi
pids=""
for f in "$S"/slurmd-*.pid "$S/slurmctld.pid" "$S/munged.pid" "$S/munge/munged.pid"; do
  [ -f "$f" ] || continue
  p=$(cat "$f"); [ -n "$p" ] && kill "$p" 2>/dev/null && pids="$pids $p"
  rm -f "$f"
done
alive=""
for t in $(seq 1 40); do
  alive=""; for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
  [ -z "$alive" ] && break; sleep 0.25
done
for p in $alive; do kill -9 "$p" 2>/dev/null; done
# remove only our marked line; other runs' lines stay
if grep -qF "# scaletrain-slurm-harness $S" /etc/hosts 2>/dev/null; then
  grep -vF "# scaletrain-slurm-harness $S" /etc/hosts > "$S/hosts.new" || true
  cat "$S/hosts.new" > /etc/hosts   # rewrite in place: /etc/hosts may be a bind mount
  rm -f "$S/hosts.new"
fi
true
