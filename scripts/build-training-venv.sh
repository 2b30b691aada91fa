#!/usr/bin/env bash
# The launcher image's build step (its `build` stage, on the Debian-based python image; the
# worker image copies the result): a virtualenv at DEST with the training stack: torch
# (TORCH_VERSION, default pyproject.toml's pin, from TORCH_INDEX_URL, default a CPU-only wheel
# index), numpy, and Horovod 0.28.1 built from its sdist exactly as `make setup` does
# (scripts/build-horovod.sh: CPU-only, Gloo + PyTorch), checked with `horovodrun --check-build`.
# The compilers it installs stay in that stage. Usage: build-training-venv.sh DEST
set -euo pipefail
dest=${1:?usage: build-training-venv.sh DEST}
torch_version=${TORCH_VERSION:-2.13.0}
torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
here=$(cd "$(dirname "$0")" && pwd)

apt-get update
apt-get install -y --no-install-recommends g++ cmake make
rm -rf /var/lib/apt/lists/*

python3 -m venv "$dest"
pip=("$dest/bin/python" -m pip install --no-cache-dir --disable-pip-version-check)
"${pip[@]}" --index-url "$torch_index" "torch==$torch_version"
# Horovod is built without build isolation: its build and runtime requirements come first.
"${pip[@]}" "numpy>=1.26,<3" setuptools wheel cffi cloudpickle packaging psutil pyyaml
cache=$(mktemp -d)
wheel=$(ES_CACHE=$cache "$here/build-horovod.sh" "$dest/bin/python" | tail -1)
"${pip[@]}" "$wheel"
rm -rf "$cache"
check=$("$dest/bin/horovodrun" --check-build)
if ! grep -q '\[X\] PyTorch' <<<"$check" || ! grep -q '\[X\] Gloo' <<<"$check"; then
  echo "horovodrun --check-build lacks PyTorch or Gloo:" >&2
  echo "$check" >&2
  exit 1
fi
