#!/usr/bin/env bash
# Builds the real Kubernetes-side components the Kubernetes and containerd 2.x end-to-end tests run, from the Go
# module proxy only (no image registry, no release tarballs), into a cache that outlives the checkout:
#   $DETSHARE_K8S_CACHE/<component>-<version>/bin/...   (default /var/cache/detshare-k8s)
# A component whose directory already holds a .done marker is not built again, so a warm CI run costs seconds.
# Usage: build-components.sh [containerd|kubernetes|etcd|cni|helm ...]   (no argument: all of them)
set -euo pipefail

CACHE=${DETSHARE_K8S_CACHE:-/var/cache/detshare-k8s}
# Versions: versions.env beside this script (the e2e reads the same file); the environment overrides each, e.g.
# K8S_VERSION=v1.34.4 build-components.sh kubernetes caches 1.34.4 beside the default. K8S_STAGING_VERSION (the
# staging modules k8s.io/api, client-go, ...) defaults to v0.X.Y for K8S_VERSION v1.X.Y.
while IFS='=' read -r key value; do
  case $key in ''|'#'*) continue ;; esac
  [ -n "${!key:-}" ] || printf -v "$key" '%s' "$value"
done < "$(dirname "$0")/versions.env"
K8S_STAGING_VERSION=${K8S_STAGING_VERSION:-v0.${K8S_VERSION#v1.}}
export CGO_ENABLED=${CGO_ENABLED:-0} GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

log() { echo "build-components: $*" >&2; }

# build NAME VERSION FUNC: runs FUNC into a fresh directory and marks it done only when FUNC succeeds, so an
# interrupted build is redone rather than half-used.
build() {
  local name=$1 version=$2 fn=$3 dir="$CACHE/$1-$2"
  if [ -f "$dir/.done" ]; then log "$name $version cached in $dir"; return 0; fi
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/bin"
  local start=$SECONDS
  log "building $name $version ..."
  "$fn" "$dir.tmp" "$version"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"; touch "$dir/.done"
  log "$name $version built in $((SECONDS - start)) s"
}

build_containerd() {
  GOBIN=$1/bin go install -trimpath -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$2" \
    "github.com/containerd/containerd/v2/cmd/containerd@$2" \
    "github.com/containerd/containerd/v2/cmd/ctr@$2" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$2"
}

# wrapper DIR MODULE VERSION: a throwaway module requiring MODULE@VERSION, so programs whose own go.mod carries
# replace directives (Kubernetes, etcd) build with `go build` where `go install pkg@version` refuses.
wrapper() {
  mkdir -p "$1/src"
  cat > "$1/src/go.mod" <<GOMOD
module detshare.io/k8s-components

go 1.24

require $2 $3
GOMOD
}

build_kubernetes() {
  local d=$1 v=$2
  wrapper "$d" k8s.io/kubernetes "$v"
  # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging; replace each with
  # its published release instead.
  local mod
  mod=$(cd "$d/src" && go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  { echo "replace ("
    sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$K8S_STAGING_VERSION"'#p' "$mod"
    echo ")"; } >> "$d/src/go.mod"
  cat > "$d/src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  (cd "$d/src" && go mod tidy && \
    go build -trimpath -o "$d/bin/" -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=${v#v1.}  -X k8s.io/client-go/pkg/version.gitVersion=$v" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet)
}

build_etcd() {
  local d=$1 v=$2
  wrapper "$d" go.etcd.io/etcd/server/v3 "$v"
  cat > "$d/src/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  (cd "$d/src" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$d/bin/etcd" go.etcd.io/etcd/server/v3)
}

build_cni() {
  GOBIN=$1/bin go install -trimpath -ldflags "-s -w" "github.com/containernetworking/plugins/plugins/main/loopback@$2"
}

build_helm() {
  GOBIN=$1/bin go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$2"
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(containerd kubernetes etcd cni helm)
mkdir -p "$CACHE"
for c in "${want[@]}"; do
  case $c in
  containerd) build containerd "$CONTAINERD_VERSION" build_containerd ;;
  kubernetes) build kubernetes "$K8S_VERSION" build_kubernetes ;;
  etcd) build etcd "$ETCD_VERSION" build_etcd ;;
  cni) build cni "$CNI_VERSION" build_cni ;;
  helm) build helm "$HELM_VERSION" build_helm ;;
  *) echo "build-components: unknown component $c (containerd kubernetes etcd cni helm)" >&2; exit 2 ;;
  esac
done
