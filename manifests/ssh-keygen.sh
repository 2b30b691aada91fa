#!/bin/sh
# Writes the job's secrets for the Secret elastic-supervisor-ssh: an ssh key pair (ed25519, no
# passphrase), DIR/id_ed25519 (the launcher's identity) and DIR/id_ed25519.pub (the workers'
# authorized_keys), DIR/hook.key, the hook channel's key (64 hex digits; the launcher and
# every worker read it, SUPERVISOR_HOOK_KEY_FILE), and the workers' sshd host key
# DIR/host_ed25519 with DIR/known_hosts, the line that pins it for the launcher's ssh
# (SUPERVISOR_SSH_KNOWN_HOSTS_FILE: every worker of the job shows this one key, whatever its
# address). Idempotent: what exists is kept. DIR
# defaults to manifests/base/ssh (ignored by git and by the image build context).
# Usage: manifests/ssh-keygen.sh [DIR]
set -eu
dir=${1:-$(dirname "$0")/base/ssh}
mkdir -p "$dir"
chmod 700 "$dir"
if [ -f "$dir/id_ed25519" ] && [ -f "$dir/id_ed25519.pub" ]; then
  echo "ssh key pair exists: $dir/id_ed25519"
else
  rm -f "$dir/id_ed25519" "$dir/id_ed25519.pub"
  ssh-keygen -q -t ed25519 -N '' -C elastic-supervisor -f "$dir/id_ed25519" </dev/null
  echo "ssh key pair written: $dir/id_ed25519"
fi
if [ -s "$dir/hook.key" ]; then
  echo "hook key exists: $dir/hook.key"
else
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$dir/hook.key.tmp")
  mv "$dir/hook.key.tmp" "$dir/hook.key"
  echo "hook key written: $dir/hook.key"
fi
if [ -f "$dir/host_ed25519" ] && [ -f "$dir/host_ed25519.pub" ]; then
  echo "ssh host key exists: $dir/host_ed25519"
else
  rm -f "$dir/host_ed25519" "$dir/host_ed25519.pub"
  ssh-keygen -q -t ed25519 -N '' -C elastic-supervisor-workers -f "$dir/host_ed25519" </dev/null
  echo "ssh host key written: $dir/host_ed25519"
fi
# Every host name (pod IPs change with each replacement), this key only. Written each time, from
# the host key that is there.
(umask 022 && printf '* %s\n' "$(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" >"$dir/known_hosts.tmp")
mv "$dir/known_hosts.tmp" "$dir/known_hosts"
