#!/usr/bin/env bash
# The whole flow on this machine, in one command (README, "Run it"):
#
#   hack/demo.sh            # leaves the cluster running until Ctrl-C
#   hack/demo.sh --check    # checks what it printed and exits (CI runs this)
#
# Installs what is missing (hack/setup.sh: Debian packages and Rust targets, as .ci/run does;
# Kubernetes, containerd, runc, the CNI plugins and Helm from the Go module proxy the first
# time: several minutes; our binaries and images with cargo), then runs akri-demo: a local
# control plane and two nodes. Run as root, the nodes are real (containerd + kubelet) and get
# the product as users install it: our images and chart pushed to a registry on localhost:5000
# (hack/registry.sh, hack/push.sh), each node's containerd pulling from it, `helm install` of
# the chart from it (the kubelet-plugin DaemonSet, the driver-controller and the
# broker-controller as pods). Otherwise, or with `--simulated-nodes`, the nodes are simulated
# (the kubelet's own DRA code) and our binaries run as processes beside them. Then the
# examples in examples/debug-echo/ are applied with kubectl.
set -euo pipefail
cd "$(dirname "$0")/.."

real=true
[ "$(id -u)" = 0 ] || real=false
for arg in "$@"; do [ "$arg" = --simulated-nodes ] && real=false; done

if [ "$(id -u)" = 0 ]; then
  echo "== Debian packages and Rust targets (hack/setup.sh; reused when present)"
  hack/setup.sh
else
  echo "== not root: nothing installed (hack/setup.sh lists what is missing), simulated nodes"
fi
echo "== Kubernetes binaries (reused when up to date)"
hack/k8s-bins.sh >/dev/null
if $real; then
  echo "== containerd, runc, CNI plugins and images for real nodes (reused when up to date)"
  hack/node-bins.sh >/dev/null || echo "   not built: the demo runs simulated nodes"
  echo "== Helm (reused when up to date)"
  hack/helm.sh >/dev/null
  echo "== our images (static release binaries; reused when up to date)"
  hack/images.sh >/dev/null
  # The README's Quickstart: a registry on localhost:5000 (stopped on exit when this run started
  # it), our images and chart pushed to it; the nodes pull from it.
  echo "== the registry (hack/registry.sh start), our images and chart pushed to it (hack/push.sh)"
  registry=$(hack/registry.sh start | tail -1)
  echo "   $registry"
  hack/push.sh localhost:5000/akri --plain-http >/dev/null
fi
echo "== akri binaries"
cargo build -p akri-kubelet-plugin -p akri-driver-controller -p akri-demo -p akri-inventory
target=$(cargo metadata --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
if $real; then
  echo "== host settings the real nodes' kubelets change (hack/host-settings.sh)"
  settings=$(mktemp)
  hack/host-settings.sh save "$settings"
  stop_registry=true
  case "$registry" in started*) ;; *) stop_registry=false ;; esac
  trap 'hack/host-settings.sh restore "$settings"; ! $stop_registry || hack/registry.sh stop' EXIT
fi
echo "== demo"
"$target/debug/akri-demo" "$@"
