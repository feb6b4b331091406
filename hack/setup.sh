#!/usr/bin/env bash
# Installs or builds everything the local stack, the tests and `make replay` need,
# or only what a deploy needs, and prints the environment that points at it.
# Idempotent and cached outside the clone (REAPER_CACHE, default ~/.cache/reaper):
# a warm run takes about a second.
#
# Usage: eval "$(hack/setup.sh)"          everything the tests need
#        eval "$(hack/setup.sh demo)"     only what `make replay` and `make invoke`
#                                         run: etcd, kube-apiserver, dynalite, the
#                                         Lambda runtime interface emulator
#        eval "$(hack/setup.sh deploy)"   only what `make synth` and `cdk deploy`
#                                         run: the CDK CLI (also put on PATH as
#                                         cdk) and the Go modules of the CDK app
#                                         and the functions; nothing of the stack
# Progress goes to stderr, with a heartbeat during long builds; exports to stdout.
set -euo pipefail

profile=${1:-all}
case $profile in
  all | demo | deploy) ;;
  *) printf 'usage: hack/setup.sh [all|demo|deploy]\n' >&2; exit 2 ;;
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
# The heartbeat ends its own sleep when it is stopped: a sleep left behind
# would hold the script's stderr open, and whoever reads it would wait.
with_heartbeat() {
  local what=$1 start=$SECONDS
  shift
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
      sleep 30 &
      nap=$!
      wait "$nap"
      say "still $what: $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
    done
  ) &
  local beat=$!
  local rc=0
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}

# npm_ci DIR: installs the package.json and package-lock.json in DIR.tmp with
# npm ci, then moves DIR.tmp to DIR, so that an interrupted install leaves no
# DIR that looks complete.
npm_ci() {
  (cd "$1.tmp" && with_heartbeat "installing npm packages" npm ci --no-audit --no-fund --loglevel=error >&2)
  rm -rf "$1"
  mv "$1.tmp" "$1"
}

# Node tools: dynalite, the CDK CLI and the IAM policy evaluator
# (@cloud-copilot/iam-simulate, which infra/iamsim's tests run), pinned by
# tools/node/package-lock.json.
lock_sum=$(cat "$root/tools/node/package.json" "$root/tools/node/package-lock.json" | sha256sum | cut -c1-16)
node_dir=$cache/node-$lock_sum

if [ "$profile" = deploy ]; then
  # The CDK CLI alone, at the version and integrity hash the lock pins: dynalite
  # would bring classic-level, which compiles native code where no prebuilt
  # binary fits, and an operator's machine need not have a compiler. A cache
  # that holds all the Node tools already has the CLI.
  cdk_dir=$node_dir
  if [ ! -d "$node_dir/node_modules" ]; then
    cdk_dir=$cache/node-cdk-$lock_sum
  fi
  if [ ! -d "$cdk_dir/node_modules" ]; then
    command -v npm >/dev/null 2>&1 || { say "the CDK CLI needs Node.js and npm: install Node.js 20 or later"; exit 1; }
    say "installing the CDK CLI with npm"
    rm -rf "$cdk_dir.tmp"
    mkdir -p "$cdk_dir.tmp"
    node - "$root/tools/node/package-lock.json" "$cdk_dir.tmp" <<'JS'
// Writes a package.json and a package-lock.json that hold aws-cdk alone, as
// tools/node/package-lock.json pins it.
const fs = require("fs");
const [lockFile, dir] = process.argv.slice(2);
const lock = JSON.parse(fs.readFileSync(lockFile, "utf8"));
const cli = lock.packages["node_modules/aws-cdk"];
if (!cli) throw new Error(`${lockFile} pins no aws-cdk`);
// The CLI ships bundled, without dependencies; one that had some would need
// them pinned here too.
if (Object.keys({ ...cli.dependencies, ...cli.optionalDependencies }).length > 0) {
  throw new Error(`aws-cdk ${cli.version} has dependencies: pin them in hack/setup.sh's deploy profile`);
}
const root = { name: "reaper-cdk-cli", private: true, dependencies: { "aws-cdk": lock.packages[""].dependencies["aws-cdk"] } };
fs.writeFileSync(`${dir}/package.json`, JSON.stringify(root, null, 2) + "\n");
fs.writeFileSync(`${dir}/package-lock.json`, JSON.stringify(
  { name: root.name, lockfileVersion: lock.lockfileVersion, requires: true, packages: { "": root, "node_modules/aws-cdk": cli } }, null, 2) + "\n");
JS
    npm_ci "$cdk_dir"
  fi
  # `go run ./infra/app` (cdk.json) and `make build` compile these; fetching
  # their modules now keeps the first synth from doing it under the CLI.
  (cd "$root" && with_heartbeat "downloading Go modules" go list -deps ./infra/app ./functions/... >/dev/null)
  cat <<ENV
export REAPER_CDK='$cdk_dir/node_modules/.bin/cdk'
export PATH='$cdk_dir/node_modules/.bin':"\$PATH"
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
ENV
  exit 0
fi

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

if [ ! -d "$node_dir/node_modules" ]; then
  say "installing dynalite, the CDK CLI and the IAM policy evaluator with npm"
  rm -rf "$node_dir.tmp"
  mkdir -p "$node_dir.tmp"
  cp "$root/tools/node/package.json" "$root/tools/node/package-lock.json" "$node_dir.tmp/"
  npm_ci "$node_dir"
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
export REAPER_IAM_SIMULATE='$node_dir/node_modules/@cloud-copilot/iam-simulate'
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
ENV
