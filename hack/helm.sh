#!/usr/bin/env bash
# Builds Helm from the Go module proxy (no prebuilt download) into <repo>/_output/tools/bin,
# for the chart tests (testing/tests/cluster/chart.rs) and for working on charts/akri by hand.
#
#   hack/helm.sh                         # the pinned version below
#   HELM_VERSION=v4.3.0 hack/helm.sh     # another release of the v4 module
#
# Prints the binary's path on its last line. A build whose inputs (this script, the version,
# the Go toolchain) have not changed is reused.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
# Helm 4: the current major. The chart keeps to what Helm 3 understands as well
# (apiVersion v2, no Helm 4-only template functions).
version=${HELM_VERSION:-v4.3.1}
bin="$repo/_output/tools/bin"
helm="$bin/helm"
stamp_file="$bin/.helm.stamp"

log() { printf '[helm] %s\n' "$*" >&2; }

stamp=$( (cat "$0"; echo "version=$version go=$(go env GOVERSION)") | sha256sum | cut -d' ' -f1)
if [ -x "$helm" ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
  log "$version is up to date in $bin"
  echo "$helm"
  exit 0
fi

mkdir -p "$bin"
rm -f "$stamp_file"
log "building helm $version from the Go module proxy"
# The version is set the way Helm's Makefile sets it, so `helm version` tells the truth
# (without it Helm reports only "v4.3"). The Kubernetes version Helm assumes for
# `helm template` comes from the client-go in its build info, so nothing else is needed.
GOBIN="$bin" GOFLAGS=-mod=mod go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
  "helm.sh/helm/v4/cmd/helm@$version"
"$helm" version --short >&2
echo "$stamp" >"$stamp_file"
echo "$helm"
