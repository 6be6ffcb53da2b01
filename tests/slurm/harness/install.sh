#!/usr/bin/env bash
# Install Slurm (slurmctld, slurmd, slurm-client) and munge from Debian's packages, for the
# integration tests in tests/slurm. Idempotent: returns at once when everything is there.
# Not root, or no apt-get: prints why and exits 0 (the Slurm tests then skip with a reason).
#   WITH_MPI=1  also installs openmpi-bin/libopenmpi-dev (must happen BEFORE slurmd starts,
#               because slurmd loads libpmix at start). Off by default: the tests do not use MPI.
set -euo pipefail
need=()
for cmd in slurmctld slurmd sbatch munged; do
  command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin" command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd")
done
if [ "${WITH_MPI:-0}" = 1 ] && ! command -v mpirun >/dev/null 2>&1; then need+=(mpirun); fi
if [ ${#need[@]} -eq 0 ]; then
  echo "slurm harness: Slurm and munge already installed"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "slurm harness: missing ${need[*]} and not root; not installing (Slurm tests will skip)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "slurm harness: missing ${need[*]} and no apt-get; not installing (Slurm tests will skip)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "slurm harness: installing slurmctld slurmd slurm-client munge from Debian's packages"
apt-get -o DPkg::Lock::Timeout=300 update -qq
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
if [ "${WITH_MPI:-0}" = 1 ]; then
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null
fi
echo "slurm harness: installed $(dpkg-query -W -f "slurm \${Version}" slurmctld 2>/dev/null)"
