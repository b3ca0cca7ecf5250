#!/usr/bin/env bash
# Install Debian's SLURM daemons and munge (slurmctld, slurmd, slurm-client, munge) when
# one of their commands is missing and this is root; otherwise say why not and exit 0, so
# a caller's test skips with that reason instead of failing. Used by `make test` (the
# test extras stamp) and by tests/distributed/test_slurm_job.py when run on its own.
#
# The packages' own services are not started (RUNLEVEL=1 makes invoke-rc.d skip them on a
# machine without systemd): the tests start their own daemons on their own config in a
# temp folder, and the machine's /etc/slurm and /etc/munge stay as the packages left them.
set -euo pipefail
PACKAGES=(slurmctld slurmd slurm-client munge)
missing=()
for cmd in munged slurmctld slurmd sbatch scontrol; do
  command -v "$cmd" >/dev/null || [[ -x "/usr/sbin/$cmd" ]] || missing+=("$cmd")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "slurm packages: ${missing[*]} missing and not root: apt-get install ${PACKAGES[*]}" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "slurm packages: ${missing[*]} missing and no apt-get here" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive RUNLEVEL=1
# The package lists may be stale or absent on a fresh machine: update once and retry.
apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" \
  || { apt-get update -q && apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"; }
