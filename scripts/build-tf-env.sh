#!/usr/bin/env bash
# The TensorFlow training environment the hook's TensorFlow tests run in: a virtualenv at DEST
# with tensorflow-cpu (TF_VERSION) and Horovod 0.28.1 built against it (CPU-only, Gloo +
# TensorFlow and its Keras; scripts/build-horovod.sh PYTHON tensorflow, a cached wheel). Nothing
# of the supervisor is in it: the tests put the hook on PYTHONPATH as horovodrun's supervisor
# does, so it is "a team's own TensorFlow image" as far as the hook can tell.
#
# Why TF_VERSION 2.15.1 (docs/hook.md, "TensorFlow and Keras"): the newest TensorFlow whose
# `tf.keras` is Keras 2, which Horovod 0.28.1's Keras integration (horovod.tensorflow.keras,
# horovod._keras) is written against; from 2.16 on `tf.keras` is Keras 3.
# Idempotent: a DEST that passed the check below for this TF_VERSION and this python3 (its stamp
# file says so) is kept as it is, in a fraction of a second; the check itself (TensorFlow's
# version, `horovodrun --check-build` showing TensorFlow and Gloo) takes ~40 s on 2 cores.
# Usage: build-tf-env.sh DEST   (UV: a uv binary to install with; else python3 -m venv + pip)
set -euo pipefail
dest=${1:?usage: build-tf-env.sh DEST}
TF_VERSION=${TF_VERSION:-2.15.1}
here=$(cd "$(dirname "$0")" && pwd)

stamp="$dest/.elastic-supervisor-ready"
want="tensorflow-cpu $TF_VERSION, horovod 0.28.1, $(python3 -V 2>&1)"
ready() {
  [ -x "$dest/bin/horovodrun" ] || return 1
  local v check
  v=$("$dest/bin/python" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) || return 1
  [ "$v" = "$TF_VERSION" ] || return 1
  check=$("$dest/bin/horovodrun" --check-build 2>/dev/null) || return 1
  [[ "$check" == *'[X] TensorFlow'* ]] && [[ "$check" == *'[X] Gloo'* ]]
}

if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$dest/bin/python" -c '' 2>/dev/null; then
  echo "tensorflow $TF_VERSION + horovod (Gloo + TensorFlow) ready in $dest"
  exit 0
fi
if ready; then
  echo "$want" >"$stamp"
  echo "tensorflow $TF_VERSION + horovod (Gloo + TensorFlow) checked in $dest"
  exit 0
fi

install() {
  if [ -n "${UV:-}" ]; then
    "$UV" pip install --quiet -p "$dest/bin/python" "$@"
  else
    "$dest/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
  fi
}

rm -rf "$dest"
if [ -n "${UV:-}" ]; then
  "$UV" venv --quiet --seed --python "$(command -v python3)" "$dest"
else
  python3 -m venv "$dest"
fi
# Horovod's build and runtime requirements beside TensorFlow (psutil: the hook reads the
# process's connections with it, as in any Horovod install).
install "tensorflow-cpu==$TF_VERSION" "setuptools>=68" wheel cffi cloudpickle packaging \
  psutil pyyaml
wheel=$("$here/build-horovod.sh" "$dest/bin/python" tensorflow | tail -1)
install "$wheel"
ready || {
  echo "build-tf-env: $dest has no working TensorFlow $TF_VERSION with Horovod (Gloo):" >&2
  "$dest/bin/horovodrun" --check-build >&2 || true
  exit 1
}
echo "$want" >"$stamp"
echo "tensorflow $TF_VERSION + horovod (Gloo + TensorFlow) installed in $dest"
