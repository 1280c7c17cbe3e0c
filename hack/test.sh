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
echo "== cargo test"
cargo test --workspace
