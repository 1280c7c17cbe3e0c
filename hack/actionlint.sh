#!/usr/bin/env bash
# Builds rhysd/actionlint from the Go module proxy (no prebuilt download) into
# <repo>/_output/tools/bin, for the check of .github/workflows/ (hack/test.sh runs it).
#
#   hack/actionlint.sh                             # the pinned version below
#   ACTIONLINT_VERSION=v1.7.11 hack/actionlint.sh  # another release
#
# Prints the binary's path on its last line; an unchanged build is reused (hack/go-tool.sh).
set -euo pipefail

version=${ACTIONLINT_VERSION:-v1.7.12}
GO_TOOL_CALLER="$0" exec "$(dirname "$0")/go-tool.sh" actionlint \
  "github.com/rhysd/actionlint/cmd/actionlint" "$version" "" -version
