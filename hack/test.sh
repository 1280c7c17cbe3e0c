#!/usr/bin/env bash
# The project's test command (README): formatting, lints, the real Kubernetes binaries, every
# test. Tests that need Kubernetes fail (they never skip) when the binaries are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== Kubernetes binaries (built from the Go module proxy, reused when up to date)"
hack/k8s-bins.sh >/dev/null
echo "== containerd, runc, CNI plugins and images for the real test node (reused when up to date)"
hack/node-bins.sh >/dev/null
echo "== Helm, for the chart tests (built from the Go module proxy, reused when up to date)"
hack/helm.sh >/dev/null
echo "== the discovery handlers' protocol peers (a Python virtualenv from PyPI, reused when up to date)"
hack/peers.sh >/dev/null
echo "== cargo test (akri_move:: and upgrade:: run after the images are built, legacy_only:: on Kubernetes 1.33 below)"
cargo test --workspace -- --skip legacy_only:: --skip akri_move:: --skip upgrade::
echo "== OCI images: static release binaries, packed without a Docker engine and checked (the demo installs them)"
hack/images.sh
echo "== the README's run command, checked (hack/demo.sh --check --real-nodes: the chart's pods on real nodes, a real container must print its device)"
hack/demo.sh --check --real-nodes
echo "== the move off Akri and an upgrade as docs/operations.md give them: the chart with our images on a real node (one at a time: each runs kube-proxy)"
cargo test -p akri-testing --test cluster -- akri_move:: upgrade:: --test-threads=1
echo "== Kubernetes 1.34 binaries (the oldest release with resource.k8s.io/v1)"
hack/k8s-bins.sh 1.34.4 >/dev/null
echo "== cargo test on Kubernetes 1.34: no consumable capacity, per-device node selection or extended resources, so the driver-controller's fallbacks"
AKRI_K8S_VERSION=1.34.4 cargo test -p akri-driver-controller --test controller
AKRI_K8S_VERSION=1.34.4 cargo test -p dra-plugin --test library slices_apiserver::
echo "== the real node (containerd + kubelet) on Kubernetes 1.34: devices reach containers through CDI and Allocate"
AKRI_K8S_VERSION=1.34.4 cargo test -p akri-kubelet-plugin --test node_agent real_node::
echo "== the Helm chart on Kubernetes 1.34, the oldest release with DRA (1.33: the legacy_only step below)"
AKRI_K8S_VERSION=1.34.4 cargo test -p akri-testing --test cluster chart::
echo "== Kubernetes 1.33 binaries (no resource.k8s.io: DRA is beta and off there)"
hack/k8s-bins.sh 1.33.13 >/dev/null
echo "== the legacy device plugins alone on Kubernetes 1.33: the chart on two real nodes, seed 000's walkthroughs in real containers"
AKRI_K8S_VERSION=1.33.13 cargo test -p akri-testing --test cluster -- legacy_only:: startup::
echo "== an upgrade on Kubernetes 1.33: the legacy device plugins handed over on a kubelet before 1.37"
AKRI_K8S_VERSION=1.33.13 cargo test -p akri-testing --test cluster -- upgrade::
