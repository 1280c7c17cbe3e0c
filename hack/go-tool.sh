#!/usr/bin/env bash
# Builds a Go command from the Go module proxy (no prebuilt download) into
# <repo>/_output/tools/bin: what hack/helm.sh and hack/promtool.sh share.
#
#   hack/go-tool.sh NAME PACKAGE VERSION [LDFLAGS] [VERSION-ARGS...]
#
# GO_TOOL_TAGS: build tags. Prints the binary's path on its last line. A build whose inputs (the calling script, this
# one, the version, the Go toolchain) have not changed is reused; VERSION-ARGS, if given, are
# run on the new binary so that the log says what was built.
set -euo pipefail

name=$1 package=$2 version=$3 ldflags=${4:-}
shift $(( $# < 4 ? $# : 4 ))
repo=$(cd "$(dirname "$0")/.." && pwd)
bin="$repo/_output/tools/bin"
tool="$bin/$name"
stamp_file="$bin/.$name.stamp"

log() { printf '[%s] %s\n' "$name" "$*" >&2; }

stamp=$( (cat "$0" "${GO_TOOL_CALLER:-/dev/null}"; echo "package=$package version=$version ldflags=$ldflags tags=${GO_TOOL_TAGS:-} go=$(go env GOVERSION)") | sha256sum | cut -d' ' -f1)
if [ -x "$tool" ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
  log "$version is up to date in $bin"
  echo "$tool"
  exit 0
fi

mkdir -p "$bin"
rm -f "$stamp_file"
log "building $name $version from the Go module proxy"
GOBIN="$bin" GOFLAGS=-mod=mod go install -tags "${GO_TOOL_TAGS:-}" -trimpath -ldflags "-s -w $ldflags" "$package@$version"
[ $# -eq 0 ] || "$tool" "$@" >&2
echo "$stamp" >"$stamp_file"
echo "$tool"
