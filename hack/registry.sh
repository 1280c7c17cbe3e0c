#!/usr/bin/env bash
# A real OCI registry on this machine: distribution's `registry` (the reference implementation
# behind Docker Hub and Harbor), built from the Go module proxy into <repo>/_output/tools/bin,
# serving on 127.0.0.1:5000, the `localhost:5000` of the README's Quickstart. The demo and
# hack/test.sh push our images and chart to it (hack/push.sh) and the real nodes' containerd
# pull from it, as a user's cluster pulls from theirs.
#
#   hack/registry.sh          # build it (reused when up to date); prints the binary's path
#   hack/registry.sh start    # build, then serve in the background (nothing to do when one
#                             # already answers on localhost:5000); prints "started" or "serving"
#   hack/registry.sh stop     # stop the one `start` started
#
# Storage: _output/registry/data (kept across runs: pushing an unchanged image again copies
# nothing). Loopback only and plain HTTP: nothing beyond this machine reaches it, and clients
# say so (`skopeo --dest-tls-verify=false`, `helm --plain-http`, the nodes' hosts.toml).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=${REGISTRY_VERSION:-v3.1.2}
address=127.0.0.1:5000
dir="$repo/_output/registry"

build() {
  GO_TOOL_CALLER="$0" "$repo/hack/go-tool.sh" registry \
    "github.com/distribution/distribution/v3/cmd/registry" "$version" "" --version | tail -1
}
# Whether a registry (any: ours, or one the user runs) answers the distribution API there.
serving() {
  curl -fsS -o /dev/null --max-time 2 "http://$address/v2/" 2>/dev/null
}

case "${1:-build}" in
  build) build ;;
  start)
    if serving; then
      echo "serving (a registry already answers on $address)"
      exit 0
    fi
    bin=$(build)
    mkdir -p "$dir/data"
    cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $address
EOF
    # setsid: the registry outlives this script and is not stopped by the caller's Ctrl-C
    # before `stop`; its pid says which one to stop.
    setsid "$bin" serve "$dir/config.yml" >"$dir/registry.log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
    for _ in $(seq 100); do
      serving && { echo "started (on $address, log $dir/registry.log)"; exit 0; }
      kill -0 "$(cat "$dir/pid")" 2>/dev/null || break
      sleep 0.1
    done
    cat "$dir/registry.log" >&2
    echo "registry: not serving on $address after 10 s (is the port taken? ss -ltnp 'sport = :5000')" >&2
    exit 1
    ;;
  stop)
    [ -f "$dir/pid" ] || exit 0
    kill "$(cat "$dir/pid")" 2>/dev/null || true
    rm -f "$dir/pid"
    ;;
  *) echo "usage: $0 [build|start|stop]" >&2; exit 2 ;;
esac
