#!/usr/bin/env bash
# The training stack of the images (the launcher Dockerfile's `training` stage, which the worker
# image starts FROM, and the TensorFlow trainer, trainer_tf_image/Dockerfile), one image layer
# per step so that rarely changing layers stay cached:
#   build-training-venv.sh torch DEST       a virtualenv at DEST with torch (TORCH_VERSION,
#                                           default pyproject.toml's pin, from TORCH_INDEX_URL,
#                                           default a CPU-only wheel index) and numpy
#   build-training-venv.sh tensorflow DEST  a virtualenv at DEST with tensorflow-cpu (TF_VERSION)
#   build-training-venv.sh horovod DEST [torch|tensorflow]
#                                           Horovod 0.28.1 (CPU-only, Gloo + the framework,
#                                           torch by default) into DEST, checked with
#                                           `horovodrun --check-build`
# Where pip finds packages: by default PyPI, and Horovod is compiled from its sdist exactly as
# `make setup` does (scripts/build-horovod.sh; the compilers are installed for the build and
# removed in the same step). With a wheelhouse (pip's own PIP_FIND_LINKS and PIP_NO_INDEX=1, as
# `python -m localcluster images` passes them), every package comes from it, Horovod included
# (the wheel `make setup` built for that framework): nothing is compiled and PyPI is never asked.
set -euo pipefail
usage="usage: build-training-venv.sh torch|tensorflow|horovod DEST [torch|tensorflow]"
step=${1:?$usage}
dest=${2:?$usage}
framework=${3:-torch}
torch_version=${TORCH_VERSION:-2.13.0}
torch_index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
horovod_version=0.28.1
here=$(cd "$(dirname "$0")" && pwd)
pip=("$dest/bin/python" -m pip install --no-cache-dir --disable-pip-version-check)
wheelhouse=0
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -n "${PIP_NO_INDEX:-}" ]; then wheelhouse=1; fi

case $step in
torch)
  python3 -m venv "$dest"
  if [ $wheelhouse = 1 ]; then
    "${pip[@]}" "torch==$torch_version" "numpy>=1.26,<3"
  else
    "${pip[@]}" --index-url "$torch_index" "torch==$torch_version"
    "${pip[@]}" "numpy>=1.26,<3"
  fi
  ;;
tensorflow)
  python3 -m venv "$dest"
  "${pip[@]}" "tensorflow-cpu==${TF_VERSION:?TF_VERSION: the tensorflow-cpu version to install}"
  ;;
horovod)
  case $framework in
  torch)  # Horovod's build and runtime requirements; setuptools and wheel also build the supervisor.
    "${pip[@]}" "setuptools>=68" wheel cffi cloudpickle packaging psutil pyyaml
    shown='PyTorch' ;;
  tensorflow)  # its runtime requirements (psutil: the hook reads the connections with it)
    "${pip[@]}" cloudpickle packaging psutil pyyaml
    shown='TensorFlow' ;;
  *) echo "build-training-venv.sh: unknown framework '$framework' (accepted: torch, tensorflow)" >&2
    exit 2 ;;
  esac
  if [ $wheelhouse = 1 ]; then
    "${pip[@]}" --only-binary horovod "horovod==$horovod_version"
  else
    compilers=(g++ cmake make)
    apt-get update
    apt-get install -y --no-install-recommends "${compilers[@]}"
    "${pip[@]}" "setuptools>=68" wheel cffi
    cache=$(mktemp -d)
    wheel=$(ES_CACHE=$cache "$here/build-horovod.sh" "$dest/bin/python" "$framework" | tail -1)
    "${pip[@]}" "$wheel"
    rm -rf "$cache"
    apt-get purge -y --auto-remove "${compilers[@]}"
    rm -rf /var/lib/apt/lists/*
  fi
  check=$("$dest/bin/horovodrun" --check-build)
  if [[ "$check" != *"[X] $shown"* ]] || [[ "$check" != *'[X] Gloo'* ]]; then
    echo "horovodrun --check-build lacks $shown or Gloo:" >&2
    echo "$check" >&2
    exit 1
  fi
  ;;
*)
  echo "build-training-venv.sh: unknown step '$step' (accepted: torch, tensorflow, horovod)" >&2
  exit 2
  ;;
esac
