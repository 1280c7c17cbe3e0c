#!/usr/bin/env bash
# The whole flow on this machine, in one command (README, "Run it"):
#
#   hack/demo.sh            # leaves the cluster running until Ctrl-C
#   hack/demo.sh --check    # checks what it printed and exits (CI runs this)
#
# Builds what is missing (Kubernetes from the Go module proxy the first time: several
# minutes; our binaries with cargo), then runs akri-demo: a local control plane, two
# simulated nodes with the kubelet's own DRA code and the real kubelet-plugin, the real
# driver-controller, and the examples in examples/debug-echo/ applied with kubectl.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Kubernetes binaries (reused when up to date)"
hack/k8s-bins.sh >/dev/null
echo "== akri binaries"
cargo build -p akri-kubelet-plugin -p akri-driver-controller -p akri-demo
target=$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
echo "== demo"
exec "$target/debug/akri-demo" "$@"
