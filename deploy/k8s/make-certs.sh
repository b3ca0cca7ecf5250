#!/usr/bin/env bash
# Writes the run's CA and one certificate per role into deploy/k8s/base/tls/ (or $1), valid
# for the names the services dial inside the cluster: each Service's name and each
# inference replica's stable name inference-<i>.inference (i < REPLICAS, default 2, the
# StatefulSet's replicas), short names the pods' DNS search path resolves in any
# namespace. localhost/127.0.0.1/::1 are always included (the health probes and
# `kubectl port-forward` dial those). Existing files are kept (tidal certs never
# overwrites). kustomize's secretGenerator then puts ca.pem + <role>.pem + <role>.key
# into one Secret per role; ca.key and operator.key stay here: move ca.key somewhere
# safe, give operator.* to whoever runs `tidal client`.
#   PYTHON=.venv/bin/python deploy/k8s/make-certs.sh [OUT]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/base/tls}"
replicas="${REPLICAS:-2}"
hosts="orchestrator,inference,trainer,weightsync"
for ((i = 0; i < replicas; i++)); do
  hosts="$hosts,inference-$i.inference"
done
exec "${PYTHON:-python}" -m tidal.common.security.credentials --out "$out" --hosts "$hosts" --name tidal-k8s
