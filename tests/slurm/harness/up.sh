#!/usr/bin/env bash
# Start a throw-away Slurm cluster on this machine for the integration tests (run as root).
# Modelled on ../shared/reference/slurm-local-cluster (multi mode): NODES slurmd's named n1..nN,
# all on 127.0.0.1 with distinct ports (Debian's Slurm is built with MULTIPLE_SLURMD), each
# declaring CPUS cpus and GPUS fake GPUs (GRES over mknod'd device files; tasks get
# CUDA_VISIBLE_DEVICES but there is no real GPU).
#
# Everything lives in the state dir S (required, unique per run): slurm.conf, logs, spool,
# PID files, and a private munged on its own socket, so two runs never share daemons.
# Node names are added to /etc/hosts with a marker line that down.sh removes again.
#
# Env: S (state dir, required)  CPUS (8)  GPUS (2)  NODES (2)  PORT_BASE (6817: slurmctld;
#      slurmd n_i listens on PORT_BASE+i)
# Prints SLURM_CONF=<path> on success; exits non-zero (with the log tail) when nodes never get idle.
set -euo pipefail
: "${S:?set S to a fresh state directory}"
CPUS=${CPUS:-8}; GPUS=${GPUS:-2}; NODES=${NODES:-2}; PORT_BASE=${PORT_BASE:-6817}
export PATH="$PATH:/usr/sbin:/sbin"
mkdir -p "$S"
chmod 755 "$S"   # munged (user munge) must reach its socket dir below
S=$(cd "$S" && pwd)
CONF=$S/etc/slurm.conf
mkdir -p "$S/etc" "$S/ctld" "$S/log" "$S/fakedev" "$S/munge"
chown munge:munge "$S/munge"; chmod 755 "$S/munge"  # munged wants o+x on its socket dir
SOCK=$S/munge/munge.socket.2
NAMES=$(seq -f 'n%g' 1 "$NODES")
cat > "$CONF" <<CONFEOF
# scaletrain integration-test cluster (tests/slurm/harness/up.sh); state in $S
ClusterName=scaletrain-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# our own munged socket; requeued jobs become eligible after cred_expire+1 s (default 120 s)
AuthInfo=cred_expire=10,socket=$SOCK
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$S/log/jobcomp.txt
ReturnToService=2
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/d/%n
TmpFS=$S/tmp/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
SlurmctldPort=$PORT_BASE
SlurmdPort=$((PORT_BASE + 100))
# declare more CPUs than the machine has (2 cores in CI)
SlurmdParameters=config_overrides
MessageTimeout=10
KillWait=5
InactiveLimit=0
# no slurmdbd: finished jobs stay visible to 'scontrol show job' for 5 minutes
MinJobAge=300
CONFEOF
: > "$S/etc/gres.conf"
GRES=""
if [ "$GPUS" -gt 0 ]; then
  echo "GresTypes=gpu" >> "$CONF"; echo "AutoDetect=off" >> "$S/etc/gres.conf"
  for g in $(seq 0 $((GPUS-1))); do [ -e "$S/fakedev/nvidia$g" ] || mknod "$S/fakedev/nvidia$g" c 195 "$g"; done
  GRES="Gres=gpu:$GPUS"
fi
i=0
for n in $NAMES; do
  i=$((i+1)); mkdir -p "$S/d/$n" "$S/tmp/$n"
  echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_BASE+i)) CPUs=$CPUS RealMemory=4000 $GRES State=UNKNOWN" >> "$CONF"
  [ "$GPUS" -gt 0 ] && echo "NodeName=$n Name=gpu File=$S/fakedev/nvidia[0-$((GPUS-1))]" >> "$S/etc/gres.conf"
done
cat >> "$CONF" <<CONFEOF
PartitionName=debug Nodes=ALL Default=YES MaxTime=02:00:00 State=UP
PartitionName=long Nodes=ALL MaxTime=1-00:00:00 MaxNodes=2 OverSubscribe=EXCLUSIVE State=UP
CONFEOF
: > "$S/etc/plugstack.conf"
# node names must resolve: the first one is MASTER_ADDR. One marked line, removed by down.sh.
if ! grep -qF "# scaletrain-slurm-harness $S" /etc/hosts; then
  echo "127.0.0.1 $(echo $NAMES) # scaletrain-slurm-harness $S" >> /etc/hosts
fi
export SLURM_CONF=$CONF
[ -s /etc/munge/munge.key ] || { /usr/sbin/mungekey --create 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 2>/dev/null;
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
su -s /bin/sh munge -c "/usr/sbin/munged --socket=$SOCK --pid-file=$S/munge/munged.pid --log-file=$S/munge/munged.log --seed-file=$S/munge/munged.seed"
for t in $(seq 1 40); do [ -s "$S/munge/munged.pid" ] && break; sleep 0.1; done
cp "$S/munge/munged.pid" "$S/munged.pid"
slurmctld
for n in $NAMES; do slurmd -N "$n"; done
want=$(echo $NAMES | wc -w)
for t in $(seq 1 120); do
  [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -ge "$want" ] && break; sleep 0.25
done
if [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -lt "$want" ]; then
  echo "slurm harness: nodes not idle after 30 s" >&2
  sinfo -N -o '%N %T %c %G' >&2 || true
  tail -n 20 "$S/log/slurmctld.log" "$S"/log/slurmd-*.log >&2 || true
  exit 1
fi
echo "SLURM_CONF=$CONF"
