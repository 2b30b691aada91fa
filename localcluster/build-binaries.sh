#!/usr/bin/env bash
# Builds the pinned Kubernetes control plane, the node components (kubelet, kube-proxy), etcd and
# kubectl with the machine's Go, from the Go module proxy, through the wrapper module in gobuild/;
# and kwok's controller (simulated nodes and pods for the benchmarks) through gobuild-kwok/, a
# module of its own because kwok pins newer k8s.io libraries than the control plane's.
# Idempotent: the results are cached under $ES_CACHE/k8s/<kube>-<etcd>/bin and
# $ES_CACHE/kwok/<kwok>/bin and reused when every binary is present and reports its version.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${ES_CACHE:-$HOME/.cache/elastic-supervisor}
out="$cache/k8s/$KUBE_VERSION-etcd$ETCD_VERSION/bin"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd)

command -v go >/dev/null || { echo "build-binaries: Go toolchain not found (need go >= 1.26 on PATH: kwok needs 1.26)" >&2; exit 1; }

build_kwok() {
  local kout="$cache/kwok/$KWOK_VERSION/bin"
  # `kwok --version` prints e.g. "kwok version v0.8.0 go1.26.8 (linux/amd64)".
  case "$("$kout/kwok" --version 2>/dev/null || true)" in
    *" $KWOK_VERSION "*) echo "kwok cached: $kout/kwok"; return ;;
  esac
  mkdir -p "$kout"
  echo "building kwok $KWOK_VERSION into $kout (first time: a few minutes on 2 cores)"
  (cd "$here/gobuild-kwok" && GOFLAGS=-buildvcs=false CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$kout/kwok.partial" sigs.k8s.io/kwok/cmd/kwok)
  mv -f "$kout/kwok.partial" "$kout/kwok"
  "$kout/kwok" --version
}

complete=1
for b in "${bins[@]}"; do [ -x "$out/$b" ] || complete=0; done
# Versions are captured, never piped into head/grep -q: under pipefail the writer can die of
# SIGPIPE when the reader exits first, which fails the step by chance.

if [ $complete = 1 ] && [ "$("$out/kube-apiserver" --version 2>/dev/null || true)" = "Kubernetes $KUBE_VERSION" ]; then
  echo "control-plane binaries cached: $out"
  build_kwok
  exit 0
fi

mkdir -p "$out"
tmp="$out.partial"
rm -rf "$tmp"; mkdir -p "$tmp"
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
ver="k8s.io/component-base/version"
ldflags="-s -w -X $ver.gitVersion=$KUBE_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor"
ldflags+=" -X $ver.gitTreeState=clean -X $ver.buildDate=1970-01-01T00:00:00Z"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
cd "$here/gobuild"
export GOFLAGS=-buildvcs=false CGO_ENABLED=0
echo "building kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy $KUBE_VERSION, etcd $ETCD_VERSION into $out (first time: 15-30 min on 2 cores)"
go build -trimpath -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy
go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
for b in "${bins[@]}"; do mv -f "$tmp/$b" "$out/$b"; done
rmdir "$tmp"
"$out/kube-apiserver" --version
etcd_version=$("$out/etcd" --version)
echo "${etcd_version%%$'\n'*}"
build_kwok
