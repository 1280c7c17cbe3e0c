#!/usr/bin/env bash
# The project's test command (README): formatting, lints, the real Kubernetes binaries, every
# test. Tests that need Kubernetes fail (they never skip) when the binaries are missing.
#
# Most tests wait on timers, so the builds needed only later run beside them, at low CPU and
# I/O priority: the images (first: the demo needs them next), then the older Kubernetes
# versions. Each step that needs one of them waits for it (`wait_for`), and a failed build
# fails the run there, its output shown.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s)
step() { echo "== [$(( $(date +%s) - started ))s] $*"; }

background=_output/background
rm -rf "$background"
mkdir -p "$background"
# Builds `name` with the rest of the command line, recording its output and exit status.
build() {
  local name=$1
  shift
  local status=0
  "$@" >"$background/$name.log" 2>&1 || status=$?
  echo "$status" >"$background/$name.status"
}
# Waits for the background build `name`; shows its output and fails if it failed.
wait_for() {
  local name=$1 waited_from
  waited_from=$(date +%s)
  while [ ! -f "$background/$name.status" ]; do
    kill -0 "$builds" 2>/dev/null || { echo "the background builds ended before $name" >&2; exit 1; }
    sleep 2
  done
  echo "   (built in the background; waited $(( $(date +%s) - waited_from ))s for it)"
  local status
  status=$(cat "$background/$name.status")
  if [ "$status" != 0 ]; then
    cat "$background/$name.log"
    echo "$name failed with status $status" >&2
    exit "$status"
  fi
}
(
  build images nice -n 10 ionice -c 3 hack/images.sh
  # 1.34 runs no kube-proxy and no kubectl in the steps below. GOGC=400: the Go compiler
  # spends about a quarter less CPU (.ci/run says how much), for a little more memory.
  build k8s-1.34.4 env GOGC=400 nice -n 19 ionice -c 3 hack/k8s-bins.sh 1.34.4 \
    kube-apiserver kubelet kube-scheduler kube-controller-manager
  build k8s-1.33.13 env GOGC=400 nice -n 19 ionice -c 3 hack/k8s-bins.sh 1.33.13
) &
builds=$!
# A run that stops early stops the background builds too (the build in progress with them).
stop_tree() {
  local child
  for child in $(pgrep -P "$1"); do stop_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
trap 'stop_tree $builds' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
step "Kubernetes binaries (built from the Go module proxy, reused when up to date)"
hack/k8s-bins.sh >/dev/null
step "containerd, runc, CNI plugins and images for the real test node (reused when up to date)"
hack/node-bins.sh >/dev/null
step "Helm, for the chart tests (built from the Go module proxy, reused when up to date)"
hack/helm.sh >/dev/null
step "the discovery handlers' protocol peers (a Python virtualenv from PyPI, reused when up to date)"
hack/peers.sh >/dev/null
step "cargo test (akri_move:: and upgrade:: run after the images are built, legacy_only:: on Kubernetes 1.33 below)"
cargo test --workspace -- --skip legacy_only:: --skip akri_move:: --skip upgrade::
step "OCI images: static release binaries, packed without a Docker engine and checked (the demo installs them)"
wait_for images
cat "$background/images.log"
step "the README's run command, checked (hack/demo.sh --check --real-nodes: the chart's pods on real nodes, a real container must print its device)"
hack/demo.sh --check --real-nodes
# The steps below name one test target with --workspace, not -p: the workspace's features,
# so the test binaries built above run as they are, nothing compiled again.
step "the move off Akri and an upgrade as docs/operations.md give them: the chart with our images on a real node (one at a time: each runs kube-proxy)"
cargo test --workspace --test cluster -- akri_move:: upgrade:: --test-threads=1
step "Kubernetes 1.34 binaries (the oldest release with resource.k8s.io/v1)"
wait_for k8s-1.34.4
step "cargo test on Kubernetes 1.34: no consumable capacity, per-device node selection or extended resources, so the driver-controller's fallbacks"
AKRI_K8S_VERSION=1.34.4 cargo test --workspace --test controller
AKRI_K8S_VERSION=1.34.4 cargo test --workspace --test library slices_apiserver::
step "the real node (containerd + kubelet) on Kubernetes 1.34: devices reach containers through CDI and Allocate"
AKRI_K8S_VERSION=1.34.4 cargo test --workspace --test node_agent real_node::
step "the Helm chart on Kubernetes 1.34, the oldest release with DRA (1.33: the legacy_only step below)"
AKRI_K8S_VERSION=1.34.4 cargo test --workspace --test cluster chart::
step "Kubernetes 1.33 binaries (no resource.k8s.io: DRA is beta and off there)"
wait_for k8s-1.33.13
step "the legacy device plugins alone on Kubernetes 1.33: the chart on two real nodes, seed 000's walkthroughs in real containers"
AKRI_K8S_VERSION=1.33.13 cargo test --workspace --test cluster -- legacy_only:: startup::
step "an upgrade on Kubernetes 1.33: the legacy device plugins handed over on a kubelet before 1.37"
AKRI_K8S_VERSION=1.33.13 cargo test --workspace --test cluster -- upgrade::
step "done"
