#!/usr/bin/env bash
# Installs or builds everything the local stack, the tests and `make replay` need,
# and prints the environment that points at it. Idempotent and cached outside the
# clone (REAPER_CACHE, default ~/.cache/reaper): a warm run takes about a second.
#
# Usage: eval "$(hack/setup.sh)"        everything the tests need
#        eval "$(hack/setup.sh demo)"   only what `make replay` and `make invoke`
#                                       run: etcd, kube-apiserver, dynalite, the
#                                       Lambda runtime interface emulator
# Progress goes to stderr, with a heartbeat during long builds; exports to stdout.
set -euo pipefail

profile=${1:-all}
case $profile in
  all | demo) ;;
  *) printf 'usage: hack/setup.sh [all|demo]\n' >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${REAPER_CACHE:-$HOME/.cache/reaper}
bin=$cache/bin
mkdir -p "$bin"

KUBE_VERSION=v1.37.2
RIE_VERSION=v0.0.0-20261030222936-bef5c4ba774d
STATICCHECK_VERSION=v0.8.2

say() { printf 'setup: %s\n' "$*" >&2; }

# with_heartbeat WHAT CMD...: runs CMD, saying every 30 s that WHAT is still
# going, so that a first build of many minutes is not mistaken for a hang.
with_heartbeat() {
  local what=$1 start=$SECONDS
  shift
  (while sleep 30; do say "still $what: $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"; done) &
  local beat=$!
  local rc=0
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}

# Debian packages: etcd for the apiserver, shellcheck for rendered user-data.
need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
if [ "$profile" = all ]; then
  command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi
# The Debian package starts a system etcd on the default ports; the stack runs
# its own on free ports, so that one only has to stay out of the way.

# kube-apiserver and kube-controller-manager, built from k8s.io/kubernetes in
# one module of their own (tools/kubernetes).
kube_ldflags="-s -w"
for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags="$kube_ldflags -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=37 -X $v.gitTreeState=clean"
done
# build_kube NAME ESTIMATE: builds tools/kubernetes/cmd/NAME once per version.
build_kube() {
  local out=$bin/$1-$KUBE_VERSION
  if [ ! -x "$out" ]; then
    say "building $1 $KUBE_VERSION (first time: $2 on 2 cores)"
    (cd "$root/tools/kubernetes" && with_heartbeat "building $1" go build -trimpath -ldflags "$kube_ldflags" -o "$out.tmp" "./cmd/$1")
    mv "$out.tmp" "$out"
  fi
}
kas=$bin/kube-apiserver-$KUBE_VERSION
kcm=$bin/kube-controller-manager-$KUBE_VERSION
build_kube kube-apiserver "about 10 minutes with its module downloads"
# The Job controller's tests need kube-controller-manager; the demo does not.
if [ "$profile" = all ]; then
  build_kube kube-controller-manager "about 3 more minutes"
fi

# Go tools: the Lambda runtime interface emulator and staticcheck.
if [ ! -x "$bin/aws-lambda-rie" ]; then
  say "installing aws-lambda-rie"
  with_heartbeat "installing aws-lambda-rie" env GOBIN="$bin" go install "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@$RIE_VERSION"
fi
if [ "$profile" = all ] && [ ! -x "$bin/staticcheck-$STATICCHECK_VERSION" ]; then
  say "installing staticcheck $STATICCHECK_VERSION"
  tmp=$(mktemp -d)
  with_heartbeat "installing staticcheck" env GOBIN="$tmp" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
  mv "$tmp/staticcheck" "$bin/staticcheck-$STATICCHECK_VERSION"
  rmdir "$tmp"
fi

# Node tools: dynalite and the CDK CLI, pinned by tools/node/package-lock.json.
lock_sum=$(cat "$root/tools/node/package.json" "$root/tools/node/package-lock.json" | sha256sum | cut -c1-16)
node_dir=$cache/node-$lock_sum
if [ ! -d "$node_dir/node_modules" ]; then
  say "installing dynalite and the CDK CLI with npm"
  rm -rf "$node_dir.tmp"
  mkdir -p "$node_dir.tmp"
  cp "$root/tools/node/package.json" "$root/tools/node/package-lock.json" "$node_dir.tmp/"
  (cd "$node_dir.tmp" && with_heartbeat "installing npm packages" npm ci --no-audit --no-fund --loglevel=error >&2)
  rm -rf "$node_dir"
  mv "$node_dir.tmp" "$node_dir"
fi

if [ "$profile" = all ]; then
  cat <<ENV
export REAPER_KUBE_CONTROLLER_MANAGER='$kcm'
export REAPER_STATICCHECK='$bin/staticcheck-$STATICCHECK_VERSION'
export REAPER_SHELLCHECK='$(command -v shellcheck)'
ENV
fi
cat <<ENV
export REAPER_KUBE_APISERVER='$kas'
export REAPER_ETCD='$(command -v etcd)'
export REAPER_DYNALITE='$node_dir/node_modules/dynalite/cli.js'
export REAPER_RIE='$bin/aws-lambda-rie'
export REAPER_CDK='$node_dir/node_modules/.bin/cdk'
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
ENV
