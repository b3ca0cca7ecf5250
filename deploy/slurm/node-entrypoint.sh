#!/usr/bin/env bash
# Start one node of the containerised SLURM cluster: munged with the cluster's one key,
# then slurmctld (`controller`) or slurmd (`compute`) in the foreground, as the
# container's main process (run with `docker run --init`, so a killed daemon ends the
# container and orphans are reaped).
#   /cluster-conf (read-only): slurm.conf and munge.key, the same on every node.
set -euo pipefail
role="${1:?usage: node-entrypoint.sh controller|compute}"
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
install -o munge -g munge -m 0400 /cluster-conf/munge.key /etc/munge/munge.key
install -m 0644 /cluster-conf/slurm.conf /etc/slurm/slurm.conf
install -d -m 0755 /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
runuser -u munge -- munged
case "$role" in
  controller) exec slurmctld -D -i ;;
  compute) exec slurmd -D ;;
  *) echo "node-entrypoint: unknown role $role (controller|compute)" >&2; exit 2 ;;
esac
