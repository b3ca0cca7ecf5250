#!/usr/bin/env bash
# Make the host folder the compose stack bind-mounts (deploy/compose.yaml): STACK_DIR/outputs
# (the run folders) and STACK_DIR/tls (certificates). The containers run as TIDAL_UID
# (default 10001, the images' user): as root this chowns the two folders to it; as another
# user, run compose with TIDAL_UID=$(id -u) TIDAL_GID=$(id -g) (make up does) so the
# containers write as you. The tls folder is 0700: it holds every role's private key.
#   deploy/stack-dir.sh STACK_DIR
set -euo pipefail
dir="${1:?usage: deploy/stack-dir.sh STACK_DIR}"
mkdir -p "$dir/outputs" "$dir/tls"
chmod 0750 "$dir/outputs"
chmod 0700 "$dir/tls"
if [[ $(id -u) -eq 0 ]]; then
  chown "${TIDAL_UID:-10001}:${TIDAL_GID:-10001}" "$dir/outputs" "$dir/tls"
fi
echo "stack dir: $dir (outputs/, tls/)"
