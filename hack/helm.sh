#!/usr/bin/env bash
# Builds Helm from the Go module proxy (no prebuilt download) into <repo>/_output/tools/bin,
# for the chart tests (testing/tests/cluster/chart.rs) and for working on charts/akri by hand.
#
#   hack/helm.sh                         # the pinned version below
#   HELM_VERSION=v4.3.0 hack/helm.sh     # another release of the v4 module
#
# Prints the binary's path on its last line; an unchanged build is reused (hack/go-tool.sh).
set -euo pipefail

# Helm 4: the current major. The chart keeps to what Helm 3 understands as well
# (apiVersion v2, no Helm 4-only template functions).
version=${HELM_VERSION:-v4.3.1}
# The version is set the way Helm's Makefile sets it, so `helm version` tells the truth
# (without it Helm reports only "v4.3"). The Kubernetes version Helm assumes for
# `helm template` comes from the client-go in its build info, so nothing else is needed.
GO_TOOL_CALLER="$0" exec "$(dirname "$0")/go-tool.sh" helm "helm.sh/helm/v4/cmd/helm" "$version" \
  "-X helm.sh/helm/v4/internal/version.version=$version" version --short
