#!/usr/bin/env bash
# OCI images of the running components, built without a container engine, then checked.
#
#   hack/images.sh            build the static (musl) release binaries, pack and check the images
#   hack/images.sh --check    only check the images already in _output/images
#
# Output: one OCI image layout per image in _output/images/<image>, and the tag they carry in
# _output/images/TAG (printed last). The tag names the build: the workspace version alone for
# a release (the tree is exactly at git tag v<version>, nothing changed), else
# <version>-g<commit> (e.g. 0.1.0-g1cd037c4a2b3), with -dirty.<hash of the changes> for a tree
# with changes, so two different builds never share a tag. Push or convert one with skopeo:
#   skopeo copy oci:_output/images/akri-driver-controller:$(cat _output/images/TAG) docker://<registry>/akri-driver-controller:$(cat _output/images/TAG)
#   skopeo copy oci:_output/images/akri-driver-controller:$(cat _output/images/TAG) oci-archive:akri-driver-controller.tar
#
# Packing is umoci (a rootless unpack of an empty image, the files put in, one repack, the
# config set) and the checks read the result back with other tools: skopeo (manifest and
# config), a fresh umoci unpack (files, modes, `--version` run from the unpacked rootfs),
# `file` and readelf (static). images/Dockerfile builds the same images for people with Docker;
# its equivalence is checked here too (ENTRYPOINT, USER and VERSION of each stage).
#
# Each image is one layer: /etc/passwd and /etc/group (images/rootfs/etc: root, and nonroot
# 65532), /tmp (1777), the binaries in /usr/local/bin. No CA certificates: kube-rs trusts the
# kubeconfig's CA, or in a pod the ServiceAccount's ca.crt, and nothing else. File times are
# SOURCE_DATE_EPOCH (default: the last commit's time), so an unchanged binary gives the same
# image digest again.
#
# Needs (Debian): umoci, skopeo, musl-tools (musl-gcc, for ring's C code), jq, file, binutils;
# the rustup target x86_64-unknown-linux-musl. .ci/run installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-musl
OUT=_output/images
PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# image | user | binaries (the first is the entrypoint) | why this user (label sh.akri.image.user)
COMPONENTS=(
  "akri-kubelet-plugin|0:0|akri-kubelet-plugin|root: writes the kubelet's host paths (/var/lib/kubelet/plugins_registry, /var/lib/kubelet/plugins, /var/run/cdi) and its state under /var/lib, and the kubelet's device-plugins dir in legacy mode"
  "akri-driver-controller|65532:65532|akri-driver-controller|nonroot: talks to the API server only"
  "akri-broker-controller|65532:65532|akri-broker-controller|nonroot: talks to the API server only"
  "akri-udev-discovery-handler|0:0|akri-udev-discovery-handler|root: serves on and registers through the host's /var/lib/akri (the registration socket is root's, mode 0660)"
  "akri-opcua-discovery-handler|0:0|akri-opcua-discovery-handler|root: serves on and registers through the host's /var/lib/akri (the registration socket is root's, mode 0660)"
  "akri-onvif-discovery-handler|0:0|akri-onvif-discovery-handler|root: serves on and registers through the host's /var/lib/akri (the registration socket is root's, mode 0660)"
  "akri-debug-echo-discovery-handler|0:0|akri-debug-echo-discovery-handler|root: serves on and registers through the host's /var/lib/akri (the registration socket is root's, mode 0660)"
  "akri-migrate|65532:65532|akri-migrate|nonroot: a command-line tool that reads files and talks to the API server"
)

check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

for tool in cargo umoci skopeo jq file readelf flock; do
  command -v "$tool" >/dev/null || { echo "images: $tool not found (.ci/run installs what is needed)" >&2; exit 1; }
done

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9 # one run at a time in this tree

metadata=$(cargo metadata --no-deps --format-version 1)
target_dir=$(jq -r .target_directory <<<"$metadata")
# The package that owns a binary, as JSON.
package_of() { jq -c --arg bin "$1" '.packages[] | select(any(.targets[]; .name == $bin and (.kind | index("bin"))))' <<<"$metadata"; }

all_bins=()
for c in "${COMPONENTS[@]}"; do
  IFS='|' read -r _ _ bins _ <<<"$c"
  all_bins+=($bins)
done

if ! $check_only; then
  # One cargo invocation for every binary, so shared crates are compiled once.
  packages=()
  for bin in "${all_bins[@]}"; do
    pkg=$(package_of "$bin" | jq -r .name)
    [ -n "$pkg" ] || { echo "images: no package has a binary named $bin" >&2; exit 1; }
    packages+=(-p "$pkg")
  done
  echo "== cargo build --release --target $TARGET ${packages[*]}"
  cargo build --release --target "$TARGET" "${packages[@]}"
fi

# The tag of this build (see the header).
build_tag() {
  local version=$1 commit changes
  commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || { echo "$version-unknown"; return; }
  changes=$(git status --porcelain --untracked-files=normal)
  if [ -z "$changes" ] && git describe --exact-match --tags --match "v$version" HEAD >/dev/null 2>&1; then
    echo "$version"
  elif [ -z "$changes" ]; then
    echo "$version-g$commit"
  else
    echo "$version-g$commit-dirty.$({ git diff HEAD; git ls-files --others --exclude-standard -z | xargs -0r cat; } | sha256sum | cut -c1-12)"
  fi
}
workspace_version=$(package_of akri-driver-controller | jq -r .version)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if $check_only; then
  tag=$(cat "$OUT/TAG")
else
  tag=$(build_tag "$workspace_version")
fi

epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
work=$(mktemp -d "$OUT/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# org.opencontainers.image.source: the workspace's repository, else the origin remote, else a
# visible "unknown" (and a warning).
source_url=$(jq -r '[.packages[].repository // empty] | first // empty' <<<"$metadata")
[ -n "$source_url" ] ||
  source_url=$(git remote get-url origin 2>/dev/null | sed -E 's|^git@([^:]+):|https://\1/|; s|\.git$||' || true)
if [ -z "$source_url" ] && ! $check_only; then
  echo "images: warning: no repository URL ([workspace.package] repository or an origin remote): label org.opencontainers.image.source is \"unknown\"" >&2
fi
source_url=${source_url:-unknown}

build_image() {
  local name=$1 user=$2 bins=$3 user_note=$4
  local entry=${bins%% *} pkg layout bundle rootfs bin
  pkg=$(package_of "$entry")
  layout=$work/$name
  bundle=$work/bundle-$name
  rootfs=$bundle/rootfs

  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci unpack --rootless --image "$layout:$tag" "$bundle" >/dev/null
  install -d -m 0755 "$rootfs/etc" "$rootfs/usr" "$rootfs/usr/local" "$rootfs/usr/local/bin"
  install -d -m 1777 "$rootfs/tmp"
  install -m 0644 images/rootfs/etc/passwd images/rootfs/etc/group "$rootfs/etc/"
  for bin in $bins; do
    install -m 0755 "$target_dir/$TARGET/release/$bin" "$rootfs/usr/local/bin/"
  done
  find "$rootfs" -exec touch -h -d "@$epoch" {} +
  umoci repack --image "$layout:$tag" --history.created "$created" \
    --history.created_by "hack/images.sh: /etc/passwd, /etc/group, /tmp, /usr/local/bin/{${bins// /,}}" "$bundle"
  umoci config --image "$layout:$tag" --no-history --created "$created" \
    --os linux --architecture amd64 \
    --config.entrypoint "/usr/local/bin/$entry" --config.user "$user" --config.env "$PATH_ENV" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$tag" \
    --config.label "org.opencontainers.image.revision=$commit" \
    --config.label "org.opencontainers.image.licenses=$(jq -r .license <<<"$pkg")" \
    --config.label "org.opencontainers.image.source=$source_url" \
    --config.label "sh.akri.image.user=$user_note"
  umoci gc --layout "$layout"
  chmod -R a+rX "$layout" # umoci writes blobs 0600
  rm -rf "$OUT/$name"
  mv "$layout" "$OUT/$name"
}

if ! $check_only; then
  for c in "${COMPONENTS[@]}"; do
    IFS='|' read -r name user bins note <<<"$c"
    echo "== pack $name"
    build_image "$name" "$user" "$bins" "$note"
  done
  echo "$tag" >"$OUT/TAG"
fi

# Checks: every failure is reported, then the script fails.
failures=()
fail() { failures+=("$1: $2"); echo "FAIL $1: $2" >&2; }

# The images/Dockerfile stage named $1 (FROM ... AS $1 up to the next FROM).
dockerfile_stage() { awk -v s="$1" 'toupper($1) == "FROM" { on = (tolower($NF) == s) } on' images/Dockerfile; }

rows=()
check_image() {
  local name=$1 user=$2 bins=$3
  local entry=${bins%% *} version ref manifest config layers compressed rootfs bin out
  version=$(package_of "$entry" | jq -r .version)
  ref="oci:$OUT/$name:$tag"
  if ! manifest=$(skopeo inspect --raw "$ref" 2>&1) || ! config=$(skopeo inspect --config --raw "$ref" 2>&1); then
    fail "$name" "skopeo cannot read $ref: $manifest$config"
    return
  fi

  # Config: entrypoint, user, platform, labels.
  [ "$(jq -c .config.Entrypoint <<<"$config")" = "[\"/usr/local/bin/$entry\"]" ] ||
    fail "$name" "entrypoint is $(jq -c .config.Entrypoint <<<"$config"), want [\"/usr/local/bin/$entry\"]"
  [ "$(jq -r '.config.User // ""' <<<"$config")" = "$user" ] ||
    fail "$name" "user is '$(jq -r '.config.User // ""' <<<"$config")', want '$user'"
  # Root only where the host paths need it: the kubelet-plugin (the kubelet's directories) and
  # the discovery handlers (the agent's root-owned registration socket in /var/lib/akri).
  if [[ ! " akri-kubelet-plugin akri-udev-discovery-handler akri-opcua-discovery-handler akri-onvif-discovery-handler akri-debug-echo-discovery-handler " =~ " $name " ]]; then
    case "$(jq -r '.config.User // ""' <<<"$config")" in
      "" | 0 | 0:* | root | root:*) fail "$name" "runs as root" ;;
    esac
  fi
  [ "$(jq -r '.os + "/" + .architecture' <<<"$config")" = linux/amd64 ] || fail "$name" "platform is not linux/amd64"
  # The chart's command is the bare binary name: the image's PATH must find it.
  jq -e '.config.Env // [] | any(startswith("PATH=") and (split("=")[1] | split(":") | index("/usr/local/bin")))' <<<"$config" >/dev/null ||
    fail "$name" "PATH has no /usr/local/bin (the chart runs the binary by name)"
  local label want
  for label in title="$name" version="$tag" revision="$commit" licenses=Apache-2.0 source=; do
    want=${label#*=}
    label=org.opencontainers.image.${label%%=*}
    got=$(jq -r --arg l "$label" '.config.Labels[$l] // ""' <<<"$config")
    if [ -z "$got" ] || { [ -n "$want" ] && [ "$got" != "$want" ]; }; then
      fail "$name" "label $label is '$got'${want:+, want '$want'}"
    fi
  done

  # Manifest: one gzip layer.
  layers=$(jq '.layers | length' <<<"$manifest")
  [ "$layers" = 1 ] || fail "$name" "$layers layers, want 1"
  jq -e 'all(.layers[]; .mediaType == "application/vnd.oci.image.layer.v1.tar+gzip")' <<<"$manifest" >/dev/null ||
    fail "$name" "a layer is not tar+gzip"
  compressed=$(jq '[.layers[].size] | add // 0' <<<"$manifest")
  local digest owners
  for digest in $(jq -r '.layers[].digest' <<<"$manifest"); do
    owners=$(tar -tvzf "$OUT/$name/blobs/sha256/${digest#sha256:}" --numeric-owner | awk '{print $2}' | sort -u | xargs)
    [ "$owners" = 0/0 ] || fail "$name" "layer $digest has files owned by $owners, want 0/0 only"
  done

  # Contents: unpack with umoci, then look at the files and run the binaries.
  rootfs=$work/check-$name/rootfs
  if ! out=$(umoci unpack --rootless --image "$OUT/$name:$tag" "$work/check-$name" 2>&1); then
    fail "$name" "umoci unpack failed: $out"
    return
  fi
  local want_files=". etc etc/group etc/passwd tmp usr usr/local usr/local/bin" got_files
  for bin in $bins; do want_files+=" usr/local/bin/$bin"; done
  got_files=$(cd "$rootfs" && find . -mindepth 0 | sed 's|^\./||' | sort | xargs)
  [ "$got_files" = "$(tr ' ' '\n' <<<"$want_files" | sort | xargs)" ] ||
    fail "$name" "files are [$got_files], want [$want_files]"
  [ "$(stat -c %a "$rootfs/tmp" 2>/dev/null)" = 1777 ] || fail "$name" "/tmp is not mode 1777"
  grep -q '^nonroot:x:65532:65532:' "$rootfs/etc/passwd" 2>/dev/null || fail "$name" "/etc/passwd has no nonroot 65532"
  for bin in $bins; do
    local path=$rootfs/usr/local/bin/$bin description
    [ -x "$path" ] || { fail "$name" "/usr/local/bin/$bin missing or not executable"; continue; }
    description=$(file -b "$path")
    case "$description" in
      *"statically linked"* | *"static-pie linked"*) ;;
      *) fail "$name" "$bin is not static: $description" ;;
    esac
    if readelf -lW "$path" | grep -q INTERP; then fail "$name" "$bin has a program interpreter (dynamic)"; fi
    out=$(env -i "$path" --version 2>&1) || true
    [ "$out" = "$bin $version" ] || fail "$name" "$bin --version printed '$(head -c 200 <<<"$out" | head -n 3)', want '$bin $version'"
  done

  # images/Dockerfile builds the same image.
  local stage=${name#akri-}
  dockerfile_stage "$stage" | grep -qxF "ENTRYPOINT [\"/usr/local/bin/$entry\"]" ||
    fail "$name" "images/Dockerfile stage $stage has no ENTRYPOINT [\"/usr/local/bin/$entry\"]"
  dockerfile_stage "$stage" | grep -qxF "USER $user" || fail "$name" "images/Dockerfile stage $stage has no USER $user"

  local unpacked
  unpacked=$(du -sb "$rootfs" | cut -f1)
  rows+=("$(printf '%-36s %-40s %6s %21s %21s  %s' "$name" "$tag" "$layers" \
    "$(numfmt --to=iec-i --suffix=B "$compressed") ($compressed)" "$(numfmt --to=iec-i --suffix=B "$unpacked") ($unpacked)" \
    "$(jq -r '.manifests[0].digest' "$OUT/$name/index.json" | cut -c1-19)")")
}

echo "== check images"
for c in "${COMPONENTS[@]}"; do
  IFS='|' read -r name user bins _ <<<"$c"
  check_image "$name" "$user" "$bins"
done
dockerfile_version=$(sed -n 's/^ARG VERSION=//p' images/Dockerfile | head -1)
[ "$dockerfile_version" = "$workspace_version" ] ||
  fail images/Dockerfile "ARG VERSION=$dockerfile_version, the workspace is $workspace_version"

printf '%-36s %-40s %6s %21s %21s  %s\n' IMAGE TAG LAYERS "COMPRESSED (bytes)" "UNPACKED (bytes)" MANIFEST
printf '%s\n' "${rows[@]}"
if [ ${#failures[@]} -gt 0 ]; then
  echo "images: ${#failures[@]} check(s) failed:" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "images: all checks passed ($OUT, tag $tag)"
echo "$tag"
