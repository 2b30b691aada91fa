#!/bin/sh
# Worker container entrypoint: installs the job's public key and the job's sshd host key from the
# mounted Secret, then runs sshd in the foreground (-D), logging to stderr (-e), as the
# container's (unprivileged) user. Settings, all optional:
#   SSHD_PORT            port to listen on (default 2222; the launcher's SUPERVISOR_SSH_PORT)
#   SSH_AUTHORIZED_KEYS  the mounted public key (default /etc/edl/ssh/authorized_keys)
#   SSH_HOST_KEY         the mounted host key (default /etc/edl/ssh/host-key), the one the
#                        launcher pins for this worker's address: set by the supervisor to the
#                        key it made for this pod (SUPERVISOR_SSH_HOST_KEYS=worker). Missing:
#                        this worker makes a key of its own, which a launcher that pins refuses
#                        (said here).
#   SSH_RUNTIME_DIR      where authorized_keys, the host key and the pid file go ($HOME/.ssh)
#   SSHD_CONFIG          sshd's configuration (default /etc/ssh/sshd_config)
#   ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS  set by the supervisor in the workers it creates: on
#                        SIGTERM (an eviction, a drain, a graceful delete or node shutdown)
#                        hold sshd while training processes run here, at most this long:
#                        the supervisor takes this worker out of the host list and horovodrun
#                        lets it go at its next commit, so no step is lost. Unset or 0: sshd
#                        gets SIGTERM at once.
# Arguments are passed on to sshd (e.g. -o LogLevel=DEBUG).
set -eu
port=${SSHD_PORT:-2222}
keys=${SSH_AUTHORIZED_KEYS:-/etc/edl/ssh/authorized_keys}
hostkey=${SSH_HOST_KEY:-/etc/edl/ssh/host-key}
dir=${SSH_RUNTIME_DIR:-$HOME/.ssh}
hold=${ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS:-0}
case $hold in
  ''|*[!0-9]*)
    echo "worker-entrypoint: ELASTIC_SUPERVISOR_LEAVE_HOLD_SECONDS=$hold: expected whole" \
         "seconds (0: no hold)" >&2
    exit 2 ;;
esac
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
set -- /usr/sbin/sshd -D -e -f "${SSHD_CONFIG:-/etc/ssh/sshd_config}" -p "$port" \
  -h "$dir/ssh_host_ed25519_key" -o "AuthorizedKeysFile=$dir/authorized_keys" \
  -o "PidFile=$dir/sshd.pid" "$@"
if [ "$hold" -eq 0 ]; then
  exec "$@"
fi
term=
trap 'term=1' TERM INT
"$@" &
sshd=$!
rc=0
while [ -z "$term" ]; do
  wait "$sshd" || rc=$?
  if [ -z "$term" ] && ! kill -0 "$sshd" 2>/dev/null; then
    exit "$rc"  # sshd ended by itself
  fi
done
rc=0
# sshd's children are its sessions: horovodrun's, running the training processes.
if pgrep -P "$sshd" >/dev/null; then
  echo "worker-entrypoint: SIGTERM: holding until the training processes here end (horovodrun" \
       "lets this worker go at its next commit), at most ${hold}s" >&2
  ticks=$(( hold * 5 ))
  while pgrep -P "$sshd" >/dev/null && [ "$ticks" -gt 0 ]; do
    sleep 0.2
    ticks=$(( ticks - 1 ))
  done
  if pgrep -P "$sshd" >/dev/null; then
    echo "worker-entrypoint: training processes still run after ${hold}s: stopping" >&2
    rc=143
  else
    echo "worker-entrypoint: the training processes ended: stopping" >&2
  fi
fi
pkill -TERM -P "$sshd" 2>/dev/null || true  # its sessions (the container's end would)
kill -TERM "$sshd" 2>/dev/null || true
wait "$sshd" || true
exit "$rc"
