#!/usr/bin/env bash
# The TensorFlow trainer's training stack (trainer_tf_image/Dockerfile), one image layer per step
# so that the heavy TensorFlow layer stays cached:
#   build-venv.sh tensorflow DEST  a virtualenv at DEST with tensorflow-cpu (TF_VERSION)
#   build-venv.sh horovod DEST     Horovod 0.28.1 (CPU-only, Gloo + TensorFlow and its Keras)
#                                  into DEST, checked with `horovodrun --check-build`
# With a wheelhouse (pip's own PIP_FIND_LINKS and PIP_NO_INDEX=1, as `python -m localcluster
# images` passes them) every package comes from it, Horovod as the wheel scripts/build-tf-env.sh
# built against this TensorFlow: nothing is compiled and PyPI is never asked. Without one,
# packages come from PyPI and Horovod is compiled from its sdist by scripts/build-horovod.sh (the
# compilers are installed for the build and removed in the same step).
set -euo pipefail
step=${1:?usage: build-venv.sh tensorflow|horovod DEST}
dest=${2:?usage: build-venv.sh tensorflow|horovod DEST}
tf_version=${TF_VERSION:?TF_VERSION: the tensorflow-cpu version to install}
horovod_version=0.28.1
here=$(cd "$(dirname "$0")" && pwd)
pip=("$dest/bin/python" -m pip install --no-cache-dir --disable-pip-version-check)
wheelhouse=0
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -n "${PIP_NO_INDEX:-}" ]; then wheelhouse=1; fi

case $step in
tensorflow)
  python3 -m venv "$dest"
  "${pip[@]}" "tensorflow-cpu==$tf_version"
  ;;
horovod)
  # Horovod's runtime requirements (psutil: the hook reads the process's connections with it,
  # as in any Horovod install).
  "${pip[@]}" cloudpickle packaging psutil pyyaml
  if [ $wheelhouse = 1 ]; then
    "${pip[@]}" --only-binary horovod "horovod==$horovod_version"
  else
    compilers=(g++ cmake make)
    apt-get update
    apt-get install -y --no-install-recommends "${compilers[@]}"
    "${pip[@]}" "setuptools>=68" wheel cffi
    cache=$(mktemp -d)
    wheel=$(ES_CACHE=$cache "$here/build-horovod.sh" "$dest/bin/python" tensorflow | tail -1)
    "${pip[@]}" "$wheel"
    rm -rf "$cache"
    apt-get purge -y --auto-remove "${compilers[@]}"
    rm -rf /var/lib/apt/lists/*
  fi
  check=$("$dest/bin/horovodrun" --check-build)
  if [[ "$check" != *'[X] TensorFlow'* ]] || [[ "$check" != *'[X] Gloo'* ]]; then
    echo "horovodrun --check-build lacks TensorFlow or Gloo:" >&2
    echo "$check" >&2
    exit 1
  fi
  ;;
*)
  echo "build-venv.sh: unknown step '$step' (accepted: tensorflow, horovod)" >&2
  exit 2
  ;;
esac
