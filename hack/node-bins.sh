#!/usr/bin/env bash
# Builds what a real test node runs besides the kubelet (hack/k8s-bins.sh builds that):
# containerd 2.x with its runc shim and ctr, runc, the CNI plugins the node's network uses
# (loopback, bridge, host-local), all from the Go module proxy; and the two images its pods
# use before any registry, as OCI archives for `ctr images import` (our own images the nodes
# pull from hack/registry.sh's registry):
#
#   pause   the sandbox image: hack/node/pause, a static Go program that sleeps and reaps
#   busybox Debian's busybox-static (/bin/busybox) with its applets as symlinks in /bin
#
#   hack/node-bins.sh     # prints the output directory on its last line
#
# Output: $AKRI_NODE_BINS_ROOT (default <repo>/_output/node): bin/ and images/. A build whose
# inputs (this script, the pause sources, the busybox binary) have not changed is reused.
# Debian's containerd (1.6) has no CDI, which is why containerd is built here.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
root=${AKRI_NODE_BINS_ROOT:-$repo/_output/node}
bin=$root/bin
images=$root/images

CONTAINERD=github.com/containerd/containerd/v2@v2.4.2
RUNC=github.com/opencontainers/runc@v1.5.2
CNI_PLUGINS=github.com/containernetworking/plugins@v1.9.1
# The names pods and containerd's sandbox_image use; imported under these names only.
PAUSE_IMAGE=registry.k8s.io/pause:akri-test
BUSYBOX_IMAGE=docker.io/library/busybox:akri-test

log() { printf '[node-bins] %s\n' "$*" >&2; }

[ -x /bin/busybox ] || { log "/bin/busybox not found: apt-get install busybox-static (.ci/run does)"; exit 1; }
[ -f /usr/lib/x86_64-linux-gnu/libseccomp.a ] || { log "libseccomp.a not found: apt-get install libseccomp-dev (.ci/run does)"; exit 1; }
for tool in go gcc pkg-config jq sha256sum gzip tar; do
  command -v "$tool" >/dev/null || { log "$tool not found"; exit 1; }
done

stamp=$({ cat "$0"; find "$repo/hack/node" -type f | LC_ALL=C sort | xargs cat; sha256sum /bin/busybox; go env GOVERSION; } | sha256sum | cut -d' ' -f1)
if [ -f "$root/stamp" ] && [ "$(cat "$root/stamp")" = "$stamp" ]; then
  log "up to date in $root"
  echo "$root"
  exit 0
fi
rm -f "$root/stamp"
mkdir -p "$bin" "$images"

start=$(date +%s)
# `go install module/cmd@version` builds each module with its own go.mod, exactly as its
# release does, without a module of ours that would have to reconcile their dependencies.
log "building containerd, containerd-shim-runc-v2, ctr ($CONTAINERD)"
# Snapshotters other than overlayfs and native are left out (btrfs needs its C headers).
GOBIN=$bin CGO_ENABLED=0 go install -ldflags "-s -w" -tags "no_btrfs no_devmapper no_zfs" \
  "${CONTAINERD%@*}/cmd/containerd@${CONTAINERD#*@}" \
  "${CONTAINERD%@*}/cmd/containerd-shim-runc-v2@${CONTAINERD#*@}" \
  "${CONTAINERD%@*}/cmd/ctr@${CONTAINERD#*@}"
# runc with seccomp, as every distribution ships it: containerd gives each sandbox (pause)
# container the runtime's default seccomp profile. Static (libseccomp.a, as runc's own
# `make static`), so the binary does not depend on this machine's libraries.
log "building runc ($RUNC)"
GOBIN=$bin CGO_ENABLED=1 go install -trimpath -tags "seccomp netgo osusergo urfave_cli_no_docs" \
  -ldflags "-s -w -extldflags -static" "${RUNC%@*}@${RUNC#*@}"
log "building CNI plugins loopback, bridge, host-local ($CNI_PLUGINS)"
mkdir -p "$bin/cni"
GOBIN=$bin/cni CGO_ENABLED=0 go install -ldflags "-s -w" \
  "${CNI_PLUGINS%@*}/plugins/main/loopback@${CNI_PLUGINS#*@}" \
  "${CNI_PLUGINS%@*}/plugins/main/bridge@${CNI_PLUGINS#*@}" \
  "${CNI_PLUGINS%@*}/plugins/ipam/host-local@${CNI_PLUGINS#*@}"
log "building pause"
(cd "$repo/hack/node/pause" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/pause" .)

# An OCI image archive of one layer (the rootfs directory $2) with entrypoint $3, named $1
# through containerd's io.containerd.image.name annotation (ctr images import uses it).
oci_archive() {
  local name=$1 rootfs=$2 entrypoint=$3 out=$4 work layer diff_id layer_digest config config_digest manifest manifest_digest
  work=$(mktemp -d)
  mkdir -p "$work/blobs/sha256"
  tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" .
  diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  gzip -n -9 "$work/layer.tar"
  layer_digest=$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)
  mv "$work/layer.tar.gz" "$work/blobs/sha256/$layer_digest"
  config=$(jq -cn --arg diff "sha256:$diff_id" --argjson entry "$entrypoint" '{
    architecture: "amd64", os: "linux",
    config: { Entrypoint: $entry, Env: ["PATH=/bin"] },
    rootfs: { type: "layers", diff_ids: [$diff] } }')
  config_digest=$(printf %s "$config" | sha256sum | cut -d' ' -f1)
  printf %s "$config" >"$work/blobs/sha256/$config_digest"
  manifest=$(jq -cn --arg c "sha256:$config_digest" --argjson cs "${#config}" \
    --arg l "sha256:$layer_digest" --argjson ls "$(stat -c %s "$work/blobs/sha256/$layer_digest")" '{
    schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs },
    layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $l, size: $ls }] }')
  manifest_digest=$(printf %s "$manifest" | sha256sum | cut -d' ' -f1)
  printf %s "$manifest" >"$work/blobs/sha256/$manifest_digest"
  jq -cn --arg m "sha256:$manifest_digest" --argjson ms "${#manifest}" --arg name "$name" '{
    schemaVersion: 2,
    manifests: [{ mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $m, size: $ms,
      annotations: { "io.containerd.image.name": $name, "org.opencontainers.image.ref.name": ($name | split(":") | last) } }] }' \
    >"$work/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
  rm -f "$work/layer.tar"
  tar -C "$work" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out" oci-layout index.json blobs
  rm -rf "$work"
}

log "packing images $PAUSE_IMAGE and $BUSYBOX_IMAGE"
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
install -D -m 0755 "$bin/pause" "$rootfs/pause/pause"
oci_archive "$PAUSE_IMAGE" "$rootfs/pause" '["/pause"]' "$images/pause.tar"
install -D -m 0755 /bin/busybox "$rootfs/busybox/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || ln -s busybox "$rootfs/busybox/bin/$applet"
done
mkdir -p "$rootfs/busybox/tmp" "$rootfs/busybox/etc"
oci_archive "$BUSYBOX_IMAGE" "$rootfs/busybox" '["/bin/sh"]' "$images/busybox.tar"
{ echo "pause=$PAUSE_IMAGE"; echo "busybox=$BUSYBOX_IMAGE"; } >"$images/names"

log "built in $(( $(date +%s) - start ))s"
echo "$stamp" >"$root/stamp"
echo "$root"
