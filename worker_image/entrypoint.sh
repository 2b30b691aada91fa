#!/bin/sh
# Worker container entrypoint: installs the job's public key and the job's sshd host key from the
# mounted Secret, then runs sshd in the foreground (-D), logging to stderr (-e), as the
# container's (unprivileged) user. Settings, all optional:
#   SSHD_PORT            port to listen on (default 2222; the launcher's SUPERVISOR_SSH_PORT)
#   SSH_AUTHORIZED_KEYS  the mounted public key (default /etc/edl/ssh/authorized_keys)
#   SSH_HOST_KEY         the mounted host key (default /etc/edl/ssh/host-key), the one the
#                        launcher pins (SUPERVISOR_SSH_KNOWN_HOSTS_FILE). Missing: this worker
#                        makes a key of its own, which a launcher that pins refuses (said here).
#   SSH_RUNTIME_DIR      where authorized_keys, the host key and the pid file go ($HOME/.ssh)
#   SSHD_CONFIG          sshd's configuration (default /etc/ssh/sshd_config)
# Arguments are passed on to sshd (e.g. -o LogLevel=DEBUG).
set -eu
port=${SSHD_PORT:-2222}
keys=${SSH_AUTHORIZED_KEYS:-/etc/edl/ssh/authorized_keys}
hostkey=${SSH_HOST_KEY:-/etc/edl/ssh/host-key}
dir=${SSH_RUNTIME_DIR:-$HOME/.ssh}
if [ ! -s "$keys" ]; then
  echo "worker-entrypoint: no public key at $keys: mount the job's ssh Secret there" \
       "(manifests/README.md)" >&2
  exit 1
fi
umask 077
mkdir -p "$dir"
cp "$keys" "$dir/authorized_keys"
if [ -s "$hostkey" ]; then
  # A copy: sshd refuses a host key that group or others may read (the Secret's mode is 0440).
  cp "$hostkey" "$dir/ssh_host_ed25519_key"
elif [ ! -f "$dir/ssh_host_ed25519_key" ]; then
  echo "worker-entrypoint: no host key at $hostkey: using one of this worker's own, which a" \
       "launcher with SUPERVISOR_SSH_KNOWN_HOSTS_FILE refuses (Host key verification failed)" >&2
  ssh-keygen -q -t ed25519 -N "" -f "$dir/ssh_host_ed25519_key" </dev/null
fi
exec /usr/sbin/sshd -D -e -f "${SSHD_CONFIG:-/etc/ssh/sshd_config}" -p "$port" \
  -h "$dir/ssh_host_ed25519_key" -o "AuthorizedKeysFile=$dir/authorized_keys" \
  -o "PidFile=$dir/sshd.pid" "$@"
