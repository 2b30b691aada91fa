#!/bin/sh
# Writes the job's ssh key pair (ed25519, no passphrase) for the Secret elastic-supervisor-ssh:
# DIR/id_ed25519 (the launcher's identity) and DIR/id_ed25519.pub (the workers' authorized_keys).
# Idempotent: an existing pair is kept. DIR defaults to manifests/base/ssh (ignored by git and
# by the image build context). Usage: manifests/ssh-keygen.sh [DIR]
set -eu
dir=${1:-$(dirname "$0")/base/ssh}
if [ -f "$dir/id_ed25519" ] && [ -f "$dir/id_ed25519.pub" ]; then
  echo "ssh key pair exists: $dir/id_ed25519"
  exit 0
fi
mkdir -p "$dir"
chmod 700 "$dir"
rm -f "$dir/id_ed25519" "$dir/id_ed25519.pub"
ssh-keygen -q -t ed25519 -N '' -C elastic-supervisor -f "$dir/id_ed25519" </dev/null
echo "ssh key pair written: $dir/id_ed25519"
