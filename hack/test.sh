#!/usr/bin/env bash
# The project's test command (README): formatting, lints, the real Kubernetes binaries, every
# test. Tests that need Kubernetes fail (they never skip) when the binaries are missing.
#
# The builds run beside each other and beside the tests, which mostly wait on timers: the Go
# builds in one chain (the main Kubernetes version, the node's binaries and Helm, which the
# tests need first, then the older Kubernetes versions at low priority, 1.33 first), and the
# images (low priority; the demo needs them after the tests). Each step that needs one waits
# for it (`wait_for`), and a failed build fails the run there, its output shown.
#
# K8S_BINS_CLEAN_GO_CACHES=1 (CI: its disk) clears Go's module cache after each Kubernetes
# version and after the tools, and the build cache once every Go build is done: the builds
# share the standard library and the modules of the same version (a third of 1.34.4's sources
# after 1.33.13, a fifth of 1.33.13's after 1.37.2), compiled once.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "test: the real nodes (containerd, runc, the kubelet) need root: run hack/test.sh as root (tests that need a real node fail otherwise)" >&2; exit 1; }
started=$(date +%s)
step() { echo "== [$(( $(date +%s) - started ))s] $*"; }

background=_output/background
rm -rf "$background"
mkdir -p "$background"
# Builds `name` with the rest of the command line, recording its output and exit status.
# Its start and end (seconds into the run) go to $background/timeline, printed at the end: what
# a cold CI spent where.
build() {
  local name=$1 from
  shift
  local status=0
  from=$(( $(date +%s) - started ))
  "$@" >"$background/$name.log" 2>&1 || status=$?
  echo "$name: ${from}s-$(( $(date +%s) - started ))s, status $status" >>"$background/timeline"
  echo "$status" >"$background/$name.status"
}
# Waits for the background build `name` of the chain `pid`; shows its output and fails if it
# failed.
wait_for() {
  local name=$1 chain=$2 waited_from
  waited_from=$(date +%s)
  while [ ! -f "$background/$name.status" ]; do
    kill -0 "$chain" 2>/dev/null || [ -f "$background/$name.status" ] ||
      { echo "the background builds ended before $name" >&2; exit 1; }
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
# The name filters of a `cargo test ...` command line: its positional arguments, before `--`
# (after `cargo test`) and after it, without the values of the options that take one.
filters_of() {
  local skip_next=0 arg
  shift 2 # cargo test
  for arg in "$@"; do
    if [ "$skip_next" = 1 ]; then skip_next=0; continue; fi
    case "$arg" in
      --) ;;
      --test | --bench | --bin | --example | -p | --package | --features | --target | --skip | --test-threads | -j | --jobs | --exclude | --color | --format | -Z)
        skip_next=1 ;;
      -*) ;;
      *) echo "$arg" ;;
    esac
  done
}
# Runs `cargo test ...` (the whole command line) and fails unless it ran every test the same
# command lists (`--list`; ignored ones count as run), at least one, and at least one per name
# filter: a filter that matches nothing after a rename (alone, or beside others that still
# match), or a target that lost its tests, fails the step instead of passing it empty.
counted() {
  local out listed ran
  out=$(mktemp)
  "$@" 2>&1 | tee "$out" || { rm -f "$out"; return 1; }
  local list=("$@")
  case " $* " in
    *" -- "*) list+=(--list) ;;
    *) list+=(-- --list) ;;
  esac
  listed=$("${list[@]}" 2>/dev/null | awk '/^[0-9]+ tests?, [0-9]+ benchmarks?$/ { n += $1 } END { print n + 0 }')
  ran=$(awk '/^test result: / { n += $4 + $8 } END { print n + 0 }' "$out")
  local filter unmatched=()
  while read -r filter; do
    [ -n "$filter" ] || continue
    awk -v f="$filter" '/^test .* \.\.\. (ok|ignored)/ && index($2, f) { found = 1 } END { exit !found }' "$out" ||
      unmatched+=("$filter")
  done < <(filters_of "$@")
  rm -f "$out"
  if [ "$ran" -eq 0 ] || [ "$ran" -ne "$listed" ]; then
    echo "counted: ran $ran of the $listed tests listed by: $*" >&2
    return 1
  fi
  if [ "${#unmatched[@]}" -gt 0 ]; then
    echo "counted: no test ran for the filter(s) ${unmatched[*]} of: $*" >&2
    return 1
  fi
  echo "counted: ran all $ran tests listed by: $*"
}
# Go's caches in CI (see above): the modules between builds, the build cache at the end. The
# timeline records the disk left.
clean_go_caches() {
  echo "disk free before clearing Go's caches ($*): $(df -h --output=avail . | tail -1)" >>"$background/timeline"
  [ "${K8S_BINS_CLEAN_GO_CACHES:-}" != 1 ] || go clean "$@"
}
(
  # hack/go-compile.sh: the Go compiler spends less CPU (it says how much), for more memory.
  build k8s hack/go-compile.sh hack/k8s-bins.sh
  build node-bins hack/go-compile.sh hack/node-bins.sh
  build helm hack/go-compile.sh hack/helm.sh
  # promtool shares Helm's client-go (v0.37.1) and so most of its build: before the caches go.
  build promtool hack/go-compile.sh hack/promtool.sh
  build actionlint hack/go-compile.sh hack/actionlint.sh
  # distribution's registry: what the images and the chart are pushed to, the nodes pull from.
  build registry hack/go-compile.sh hack/registry.sh
  clean_go_caches -modcache
  # 1.34 first: its lane starts once the first tests are done and runs beside the demo, the
  # move and the upgrade, which take about 10 minutes before the 1.33 steps need 1.33. Built
  # the other way round, 1.34 was ready only after 1.33 and its lane ended the run (a cold CI
  # here, 2026-11-29: its last step at 5071 s of 5072). 1.34 runs no kube-proxy and no
  # kubectl in its steps.
  build k8s-1.34.4 nice -n 19 ionice -c 3 hack/go-compile.sh hack/k8s-bins.sh 1.34.4 \
    kube-apiserver kubelet kube-scheduler kube-controller-manager
  build k8s-1.33.13 nice -n 19 ionice -c 3 hack/go-compile.sh hack/k8s-bins.sh 1.33.13
  # 1.36 and 1.35 last, the releases many managed clusters run: their suites run after the
  # 1.33 steps, which need 1.33 first.
  build k8s-1.36.3 nice -n 19 ionice -c 3 hack/go-compile.sh hack/k8s-bins.sh 1.36.3 \
    kube-apiserver kubelet kube-scheduler kube-controller-manager
  build k8s-1.35.4 nice -n 19 ionice -c 3 hack/go-compile.sh hack/k8s-bins.sh 1.35.4 \
    kube-apiserver kubelet kube-scheduler kube-controller-manager
  clean_go_caches -cache -modcache
) &
go_builds=$!
build images nice -n 10 ionice -c 3 hack/images.sh &
images_build=$!
# Test steps that run beside the foreground's: `beside name command...` starts one, its output
# kept; `joined name` waits for it, shows the output and fails if it failed.
lanes=()
beside() {
  local name=$1
  shift
  build "$name" "$@" &
  eval "lane_$name=$!"
  lanes+=("$!")
}
joined() {
  local name=$1 pid
  eval "pid=\$lane_$name"
  wait "$pid" || true
  cat "$background/$name.log"
  local status
  status=$(cat "$background/$name.status" 2>/dev/null || echo "no status")
  [ "$status" = 0 ] || { echo "$name failed with status $status" >&2; exit 1; }
}
# A run that stops early stops the background builds and tests too (what is in progress with
# them).
stop_tree() {
  local child
  for child in $(pgrep -P "$1"); do stop_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
# The real nodes' kubelets change host settings; they are put back at the end.
step "host settings the real nodes' kubelets change (hack/host-settings.sh)"
hack/host-settings.sh save "$background/host-settings"
previous_build=""
trap 'for pid in $go_builds $images_build $previous_build ${lanes[@]+"${lanes[@]}"}; do stop_tree "$pid"; done; hack/registry.sh stop; hack/host-settings.sh restore "$background/host-settings"' EXIT

step "cargo fmt --check"
cargo fmt --all -- --check
step "the discovery handlers' protocol peers (a Python virtualenv from PyPI, reused when up to date)"
hack/peers.sh >/dev/null
step "cargo clippy (beside the Go builds, as the two builds below)"
cargo clippy --workspace --all-targets -- -D warnings
step "each package's benches, checked on their own (as the docs' cargo bench lines build them)"
# One package at a time: together, one package's dev-dependency features would cover another's
# missing ones (a bench that built only inside the workspace build went unnoticed).
for dir in */benches; do
  cargo check -q --benches --manifest-path "${dir%/benches}/Cargo.toml"
done
step "the crates meant for others package (cargo package; hack/release.sh also builds them from the package)"
cargo package --no-verify --allow-dirty -q -p kubelet-proto -p node-io -p dra-plugin
step "the test build"
cargo test --workspace --no-run
# hack/demo.sh builds these for itself. Without the test build's dev-dependencies (tokio's
# test-util, akri-testing's components) their features differ, so most crates compile again:
# here, while the Go builds run, rather than in the demo's step.
step "the demo's build (hack/demo.sh below finds it done)"
cargo build -p akri-kubelet-plugin -p akri-driver-controller -p akri-demo -p akri-inventory
step "Kubernetes binaries (built from the Go module proxy, reused when up to date)"
wait_for k8s "$go_builds"
step "containerd, runc, CNI plugins and images for the real test node (reused when up to date)"
wait_for node-bins "$go_builds"
step "Helm, for the chart tests (built from the Go module proxy, reused when up to date)"
wait_for helm "$go_builds"
step "promtool (built from the Go module proxy after Helm, reused when up to date): the suites judge the chart's alerts with it on what the components' /metrics say"
wait_for promtool "$go_builds"
# The node agent's suite (8 of the 16 minutes of tests here) beside all the others: both mostly
# wait on timers. Real nodes and control planes of two test processes keep apart (their own
# directories, ports and network blocks); the suites with kube-proxy run one at a time below.
step "cargo test: the node agent's suite beside all the others (akri_move::, upgrade::, reachability::, uninstall:: and the docs' helm lines run once the images and chart are in the registry, legacy_only:: on Kubernetes 1.33 below, monitoring:: in the 1.34 lane)"
beside node_agent_suite counted cargo test --workspace --test node_agent
other_tests=()
for target in $(cargo metadata --no-deps --format-version 1 |
  jq -r '.packages[].targets[] | select(.kind | index("test")) | .name' | sort -u); do
  [ "$target" = node_agent ] || other_tests+=(--test "$target")
done
counted cargo test --workspace --lib --bins "${other_tests[@]}" -- --skip legacy_only:: --skip akri_move:: --skip upgrade:: --skip reachability:: --skip monitoring:: --skip uninstall:: --skip chart::the_documented_helm_commands_work
counted cargo test --workspace --doc
joined node_agent_suite
# Two lanes from here: the suites on 1.34 (no kube-proxy) beside the demo, the move off Akri,
# the upgrade and the 1.33 suites, which run kube-proxy and so one after another.
# The steps name one test target with --workspace, not -p: the workspace's features, so the
# test binaries built above run as they are, nothing compiled again.
# (A lane is a function, and `set -e` does not stop a function whose status is tested: each
# command says `|| return`.)
k8s_1_34_steps() {
  step "Kubernetes 1.34 binaries (the oldest release with resource.k8s.io/v1)"
  wait_for k8s-1.34.4 "$go_builds"
  step "cargo test on Kubernetes 1.34: no consumable capacity, per-device node selection or extended resources, so the driver-controller's fallbacks"
  AKRI_K8S_VERSION=1.34.4 counted cargo test --workspace --test controller || return
  AKRI_K8S_VERSION=1.34.4 counted cargo test --workspace --test library slices_apiserver:: || return
  step "the real node (containerd + kubelet) on Kubernetes 1.34: devices reach containers through CDI and Allocate"
  AKRI_K8S_VERSION=1.34.4 counted cargo test --workspace --test node_agent real_node:: || return
  step "the Helm chart on Kubernetes 1.34, the oldest release with DRA (1.33: the legacy_only step), once the chart is in the registry"
  wait_for pushed "$$" || return
  AKRI_K8S_VERSION=1.34.4 counted cargo test --workspace --test cluster chart:: || return
  step "the chart's alerts (promtool check rules, promtool test rules) and its dashboard"
  counted cargo test --workspace --test cluster monitoring:: || return
  step "actionlint (built from the Go module proxy after promtool): the release workflow"
  wait_for actionlint "$go_builds" || return
  _output/tools/bin/actionlint .github/workflows/*.yml || return
}
step "the 1.34 lane starts (its output comes at the end)"
beside k8s_1_34_lane k8s_1_34_steps
step "OCI images: static release binaries, packed without a Docker engine and checked (the demo installs them)"
wait_for images "$images_build"
cat "$background/images.log"
step "the README's registry and push lines: distribution's registry (built from the Go module proxy) on localhost:5000, our images and chart pushed to it"
wait_for registry "$go_builds"
hack/registry.sh start
hack/push.sh localhost:5000/akri --plain-http
echo 0 >"$background/pushed.status"
step "the README's run command, checked (hack/demo.sh --check --real-nodes: the chart's pods on real nodes, a real container must print its device)"
hack/demo.sh --check --real-nodes
# The previous release's images (hack/previous.sh: its tag's tree, amd64, three components) after
# the demo, whose hack/images.sh would wait for it, and beside the next step's tests.
build previous nice -n 10 ionice -c 3 hack/previous.sh &
previous_build=$!
step "the move off Akri and binding conditions on two nodes: the chart and our images from the registry on real nodes (one at a time: each runs kube-proxy); every helm line of the docs"
counted cargo test --workspace --test cluster -- akri_move:: reachability:: uninstall:: chart::the_documented_helm_commands_work --test-threads=1
step "the previous release, built from its tag (hack/previous.sh)"
wait_for previous "$previous_build"
step "an upgrade as docs/operations.md gives it, from the previous release to this checkout"
counted cargo test --workspace --test cluster -- upgrade::
step "Kubernetes 1.33 binaries (no resource.k8s.io: DRA is beta and off there)"
wait_for k8s-1.33.13 "$go_builds"
step "the legacy device plugins alone on Kubernetes 1.33: the chart on two real nodes, seed 000's walkthroughs in real containers"
AKRI_K8S_VERSION=1.33.13 counted cargo test --workspace --test cluster -- legacy_only:: startup::
step "an upgrade on Kubernetes 1.33: the legacy device plugins handed over on a kubelet before 1.37"
AKRI_K8S_VERSION=1.33.13 counted cargo test --workspace --test cluster -- upgrade::
# 1.36 and 1.35 after the 1.33 steps, not beside them: run beside them, the load made the
# 1.33 upgrade's churn meet a slot pod refused at rest ("no healthy devices present"), which
# it had not met in runs without it.
step "Kubernetes 1.36 binaries (built after 1.33)"
wait_for k8s-1.36.3 "$go_builds"
step "cargo test on Kubernetes 1.36: consumable capacity, per-device node selection, extended resources and binding conditions as on 1.37, no optional node operations"
AKRI_K8S_VERSION=1.36.3 counted cargo test --workspace --test controller
step "the real node and the Helm chart on Kubernetes 1.36"
AKRI_K8S_VERSION=1.36.3 counted cargo test --workspace --test node_agent real_node::
AKRI_K8S_VERSION=1.36.3 counted cargo test --workspace --test cluster chart::
step "Kubernetes 1.35 binaries (built after 1.36)"
wait_for k8s-1.35.4 "$go_builds"
step "cargo test, the real node and the Helm chart on Kubernetes 1.35 (the optional DRA features as its defaults set them)"
AKRI_K8S_VERSION=1.35.4 counted cargo test --workspace --test controller
AKRI_K8S_VERSION=1.35.4 counted cargo test --workspace --test node_agent real_node::
AKRI_K8S_VERSION=1.35.4 counted cargo test --workspace --test cluster chart::
step "the 1.34 lane"
joined k8s_1_34_lane
step "done; the background builds and lanes ran (seconds into the run):"
cat "$background/timeline"
