#!/usr/bin/env bash
# The whole flow on this machine, in one command (README, "Run it"):
#
#   hack/demo.sh            # leaves the cluster running until Ctrl-C
#   hack/demo.sh --check    # checks what it printed and exits (CI runs this)
#
# Builds what is missing (Kubernetes, containerd, runc and the CNI plugins from the Go module
# proxy the first time: several minutes; our binaries with cargo), then runs akri-demo: a
# local control plane, two nodes (real ones, containerd + kubelet, when run as root; else
# simulated, the kubelet's own DRA code) with the real kubelet-plugin, the real
# driver-controller, and the examples in examples/debug-echo/ applied with kubectl.
# `--simulated-nodes` asks for simulated nodes where real ones could run.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Kubernetes binaries (reused when up to date)"
hack/k8s-bins.sh >/dev/null
echo "== containerd, runc, CNI plugins and images for real nodes (reused when up to date)"
hack/node-bins.sh >/dev/null || echo "   not built: the demo runs simulated nodes"
echo "== akri binaries"
cargo build -p akri-kubelet-plugin -p akri-driver-controller -p akri-demo
target=$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
echo "== demo"
exec "$target/debug/akri-demo" "$@"
