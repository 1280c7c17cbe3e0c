#!/usr/bin/env bash
# Builds Prometheus' promtool from the Go module proxy (no prebuilt download) into
# <repo>/_output/tools/bin, for the chart's alert tests (`promtool check rules`, `promtool test
# rules`; testing/alerts/, run by the cluster suite's monitoring:: tests).
#
#   hack/promtool.sh                             # the pinned version below
#   PROMETHEUS_VERSION=v0.315.0 hack/promtool.sh # another release (Go module versions: v0.3xx.y
#                                                # is Prometheus v3.xx.y)
#
# Prints the binary's path on its last line; an unchanged build is reused (hack/go-tool.sh).
set -euo pipefail

version=${PROMETHEUS_VERSION:-v0.316.0}
# Without the service discovery plugins (AWS, Azure, GCE, ...: Prometheus' own build tag), which
# rule tests never use: 2 min 25 s instead of about 3.5 min from an empty build cache.
GO_TOOL_TAGS=remove_all_sd GO_TOOL_CALLER="$0" exec "$(dirname "$0")/go-tool.sh" promtool \
  "github.com/prometheus/prometheus/cmd/promtool" "$version" "" --version
