#!/usr/bin/env bash
# Builds a CPU-only Horovod 0.28.1 wheel (Gloo; no MPI, MXNet, CUDA) against the framework
# installed in the given Python: PyTorch (the default) or TensorFlow (with its Keras), and caches
# it under $ES_CACHE/wheels/horovod-<ver>-<framework><version>-<pytag>/. Prints the wheel path on
# the last line.
#
# 0.28.1 needs two fixes for torch >= 2.1 (see shared notes, horovod PR #3998):
#   - CMAKE_CXX_STANDARD 14 -> 17 (torch headers: "#error C++17 or later"; TensorFlow >= 2.10's
#     headers need it as well);
#   - PyPI's torch is a CUDA build; without a CUDA toolkit horovod/torch/CMakeLists.txt would
#     call add_cuda() and fail, so that branch is disabled for this CPU-only build.
# Usage: build-horovod.sh PYTHON [torch|tensorflow]
set -euo pipefail
py=${1:?usage: build-horovod.sh PYTHON [torch|tensorflow]}
framework=${2:-torch}
HOROVOD_VERSION=0.28.1
cache=${ES_CACHE:-$HOME/.cache/elastic-supervisor}

for tool in g++ cmake make; do
  command -v $tool >/dev/null || { echo "build-horovod: $tool not found (needed to build Horovod)" >&2; exit 1; }
done
case $framework in
torch)
  key=$("$py" -c 'import sys, torch; v = torch.__version__.split("+")[0]; print("torch%s-cp%d%d" % (v, *sys.version_info[:2]))')
  frameworks=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1)
  ;;
tensorflow)
  key=$("$py" -c 'import sys, tensorflow as tf; print("tf%s-cp%d%d" % (tf.__version__, *sys.version_info[:2]))')
  frameworks=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1)
  ;;
*)
  echo "build-horovod: unknown framework '$framework' (accepted: torch, tensorflow)" >&2
  exit 2
  ;;
esac
dest="$cache/wheels/horovod-$HOROVOD_VERSION-$key"
found=("$dest"/horovod-*.whl)  # a glob, not `ls | head -1` (SIGPIPE under pipefail)
existing=""
[ -e "${found[0]}" ] && existing=${found[0]}
if [ -n "$existing" ]; then
  echo "horovod wheel cached: $existing" >&2
  echo "$existing"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work" >&2
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"

patch_line() {  # file, exact old line, new line: fail loudly if the sdist changed
  grep -qF -- "$2" "$1" || { echo "build-horovod: expected '$2' in $1, sdist differs" >&2; exit 1; }
  OLD="$2" NEW="$3" "$py" - "$1" <<'PY'
import os, sys
path = sys.argv[1]
text = open(path).read().replace(os.environ["OLD"], os.environ["NEW"])
open(path, "w").write(text)
PY
}
patch_line "$src/CMakeLists.txt" "set(CMAKE_CXX_STANDARD 14)" "set(CMAKE_CXX_STANDARD 17)"
patch_line "$src/horovod/torch/CMakeLists.txt" "set(CMAKE_CXX_STANDARD 14)" "set(CMAKE_CXX_STANDARD 17)"
patch_line "$src/horovod/torch/CMakeLists.txt" "elseif (Pytorch_CUDA AND NOT HAVE_CUDA)" \
  "elseif (Pytorch_CUDA AND NOT HAVE_CUDA AND HOROVOD_BUILD_TORCH_CUDA_OPS)"  # never set here

echo "building horovod $HOROVOD_VERSION ($key), CPU-only, Gloo + $framework (2-10 min on 2 cores)" >&2
mkdir -p "$dest.partial"
env -u CUDA_HOME -u CUDA_PATH \
  "${frameworks[@]}" HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
  CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
  "$py" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$dest.partial" "$src" >&2
rm -rf "$dest"; mv "$dest.partial" "$dest"
ls "$dest"/horovod-*.whl
