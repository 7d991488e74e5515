#!/usr/bin/env bash
# Yields a directory holding kube-apiserver, etcd and kubectl for the Kubernetes
# version that go.mod implies (k8s.io/api v0.X.Y -> 1.X.Y), and prints its path
# as the last line of stdout. Progress goes to stderr.
#
# Order of sources:
#   1. a copy already in setup-envtest's store (instant);
#   2. setup-envtest's own download (fails fast where release sites are unreachable);
#   3. a build from source through the Go module proxy, installed into the store so
#      the next run is instant. A cold build takes several minutes on 2 cores.
#
# Environment:
#   ENVTEST_K8S_VERSION   override the version (default: derived from go.mod)
#   ENVTEST_STORE         store root (default: setup-envtest's, $XDG_DATA_HOME/kubebuilder-envtest)
#   ENVTEST_SKIP_DOWNLOAD=1  skip step 2
set -euo pipefail

log() { printf 'setup-envtest: %s\n' "$*" >&2; }
die() { printf 'setup-envtest: error: %s\n' "$*" >&2; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command -v go >/dev/null || die "go is not on PATH"

version=${ENVTEST_K8S_VERSION:-}
if [ -z "$version" ]; then
  api=$(cd "$root" && go list -m -f '{{.Version}}' k8s.io/api 2>/dev/null) \
    || die "cannot read k8s.io/api's version from go.mod"
  # v0.37.2 -> 1.37.2
  version=$(printf '%s' "$api" | sed -E 's/^v0\.([0-9]+)\.([0-9]+).*/1.\1.\2/')
  [[ $version =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "unexpected k8s.io/api version $api"
fi
goos=$(go env GOOS); goarch=$(go env GOARCH)
store=${ENVTEST_STORE:-${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest}
dir="$store/k8s/$version-$goos-$goarch"

complete() { [ -x "$1/kube-apiserver" ] && [ -x "$1/etcd" ] && [ -x "$1/kubectl" ]; }

if complete "$dir"; then
  echo "$dir"; exit 0
fi

if [ "${ENVTEST_SKIP_DOWNLOAD:-}" != 1 ]; then
  log "trying setup-envtest's download of $version (fails fast without release-site access)"
  if timeout 120 env GOFLAGS=-mod=mod go run sigs.k8s.io/controller-runtime/tools/setup-envtest@v0.25.1 \
       use "$version" --bin-dir "$store" -p path >/dev/null 2>&1 && complete "$dir"; then
    echo "$dir"; exit 0
  fi
  log "download unavailable; building from source"
fi

log "building kube-apiserver, kubectl and etcd $version from source via the Go module proxy."
log "a cold build takes ~5-10 minutes on 2 cores; later runs reuse $dir"

work=$(mktemp -d "${TMPDIR:-/tmp}/envtest-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0

go mod init envtest-build >/dev/null 2>&1
log "resolving k8s.io/kubernetes v$version"
modjson=$(go mod download -json "k8s.io/kubernetes@v$version") \
  || die "k8s.io/kubernetes@v$version is not available from the module proxy"
gomod=$(printf '%s' "$modjson" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
[ -f "$gomod" ] || die "no go.mod for k8s.io/kubernetes@v$version"

# k8s.io/kubernetes replaces each staging module by a local directory; point each at
# its published v0.X.Y instead.
staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod")
[ -n "$staging" ] || die "could not read staging modules from $gomod"
args=(-require="k8s.io/kubernetes@v$version")
for m in $staging; do args+=(-replace="$m=$m@v0.${version#1.}"); done
go mod edit "${args[@]}"
etcdv=$(sed -n 's#^[[:space:]]*go.etcd.io/etcd/server/v3 \(v[^ ]*\).*#\1#p' "$gomod" | head -1)
[ -n "$etcdv" ] || etcdv=v3.6.16
go mod edit -require="go.etcd.io/etcd/server/v3@$etcdv"

ld="-s -w -X k8s.io/component-base/version.gitVersion=v$version"
ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2)"
ld+=" -X k8s.io/client-go/pkg/version.gitVersion=v$version"
mkdir -p "$work/out"
log "building kube-apiserver"
go build -trimpath -ldflags "$ld" -o "$work/out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver \
  || die "kube-apiserver build failed"
log "building kubectl"
go build -trimpath -ldflags "$ld" -o "$work/out/kubectl" k8s.io/kubernetes/cmd/kubectl \
  || die "kubectl build failed"
log "building etcd $etcdv"
go build -trimpath -ldflags "-s -w" -o "$work/out/etcd" go.etcd.io/etcd/server/v3 \
  || die "etcd build failed"

mkdir -p "$(dirname "$dir")"
tmpdir="$dir.tmp.$$"
rm -rf "$tmpdir"; mv "$work/out" "$tmpdir"
rm -rf "$dir"; mv "$tmpdir" "$dir"   # publish atomically: a half-built dir is never used
log "installed into $dir"
echo "$dir"
