#!/bin/sh
# Worker container entrypoint: installs the job's public key from the mounted Secret, makes this
# worker's own host key, then runs sshd in the foreground (-D), logging to stderr (-e), as the
# container's (unprivileged) user. Settings, all optional:
#   SSHD_PORT            port to listen on (default 2222; the launcher's SUPERVISOR_SSH_PORT)
#   SSH_AUTHORIZED_KEYS  the mounted public key (default /etc/edl/ssh/authorized_keys)
#   SSH_RUNTIME_DIR      where authorized_keys, the host key and the pid file go ($HOME/.ssh)
#   SSHD_CONFIG          sshd's configuration (default /etc/ssh/sshd_config)
# Arguments are passed on to sshd (e.g. -o LogLevel=DEBUG).
set -eu
port=${SSHD_PORT:-2222}
keys=${SSH_AUTHORIZED_KEYS:-/etc/edl/ssh/authorized_keys}
dir=${SSH_RUNTIME_DIR:-$HOME/.ssh}
if [ ! -s "$keys" ]; then
  echo "worker-entrypoint: no public key at $keys: mount the job's ssh Secret there" \
       "(manifests/README.md)" >&2
  exit 1
fi
umask 077
mkdir -p "$dir"
cp "$keys" "$dir/authorized_keys"
if [ ! -f "$dir/ssh_host_ed25519_key" ]; then
  ssh-keygen -q -t ed25519 -N "" -f "$dir/ssh_host_ed25519_key" </dev/null
fi
exec /usr/sbin/sshd -D -e -f "${SSHD_CONFIG:-/etc/ssh/sshd_config}" -p "$port" \
  -h "$dir/ssh_host_ed25519_key" -o "AuthorizedKeysFile=$dir/authorized_keys" \
  -o "PidFile=$dir/sshd.pid" "$@"
