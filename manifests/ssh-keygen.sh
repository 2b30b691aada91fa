#!/bin/sh
# Writes the job's secrets for the Secret elastic-supervisor-ssh: an ssh key pair (ed25519, no
# passphrase), DIR/id_ed25519 (the launcher's identity) and DIR/id_ed25519.pub (the workers'
# authorized_keys), and DIR/hook.key, the hook channel's key (64 hex digits; the launcher and
# every worker read it, SUPERVISOR_HOOK_KEY_FILE). Idempotent: what exists is kept. DIR
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
