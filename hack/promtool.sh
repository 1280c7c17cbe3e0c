#!/usr/bin/env bash
# Builds Prometheus' promtool from the Go module proxy (no prebuilt download) into
# <repo>/_output/tools/bin, for the chart's alert tests (`promtool check rules`, `promtool test
# rules`; testing/alerts/, run by the cluster suite's chart:: tests).
#
#   hack/promtool.sh                             # the pinned version below
#   PROMETHEUS_VERSION=v0.315.0 hack/promtool.sh # another release (Go module versions: v0.3xx.y
#                                                # is Prometheus v3.xx.y)
#
# Prints the binary's path on its last line. A build whose inputs (this script, the version,
# the Go toolchain) have not changed is reused.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=${PROMETHEUS_VERSION:-v0.316.0}
bin="$repo/_output/tools/bin"
promtool="$bin/promtool"
stamp_file="$bin/.promtool.stamp"

log() { printf '[promtool] %s\n' "$*" >&2; }

stamp=$( (cat "$0"; echo "version=$version go=$(go env GOVERSION)") | sha256sum | cut -d' ' -f1)
if [ -x "$promtool" ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
  log "$version is up to date in $bin"
  echo "$promtool"
  exit 0
fi

mkdir -p "$bin"
rm -f "$stamp_file"
log "building promtool $version from the Go module proxy"
GOBIN="$bin" GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/promtool@$version"
"$promtool" --version >&2
echo "$stamp" >"$stamp_file"
echo "$promtool"
