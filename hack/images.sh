#!/usr/bin/env bash
# OCI images of the running components, built without a container engine, then checked.
#
#   hack/images.sh            build the static (musl) release binaries, pack and check the images
#   hack/images.sh --check    only check the images already in _output/images
#   hack/images.sh --platform amd64 --image akri-kubelet-plugin   one platform, some images
#
# --platform (amd64 or arm64) and --image (repeated) build, pack and check only those: a quick
# build for one machine, and the previous release the upgrade test installs (hack/previous.sh:
# its node is amd64 and it runs three components). Every image's index then lists only that
# platform.
#
# Images already packed and checked from the same binaries under the same tag are reused.
#
# Every image is for linux/amd64 and linux/arm64: its tag names an OCI image index with one
# manifest per platform. The arm64 binaries are cross-compiled (Rust's aarch64 musl target,
# Debian's aarch64 gcc for ring's C code and as the linker) and the checks run them under
# qemu-user (Debian's qemu-user-static): each binary's --version and --help, and akri-migrate
# migrating Akri's example Configurations to the same bytes as the amd64 build. No linux/arm/v7:
# Rust's armv7 musl standard library (rust-std-armv7-unknown-linux-musleabihf) is not served to
# this project's machines, and a glibc armv7 build would not be static.
#
# Output: one OCI image layout per image in _output/images/<image>, and the tag they carry in
# _output/images/TAG (printed last); akri-migrate's and kubectl-akri's static binaries in
# _output/bin/linux-<arch>/ (each with a .sha256). The tag names the build: the workspace version alone for
# a release (the tree is exactly at git tag v<version>, nothing changed), else
# <version>-g<commit> (e.g. 0.1.0-g1cd037c4a2b3), with -dirty.<hash of the changes> for a tree
# with changes, so two different builds never share a tag. Push or convert one with skopeo:
#   skopeo copy --all oci:_output/images/akri-driver-controller:$(cat _output/images/TAG) docker://<registry>/akri-driver-controller:$(cat _output/images/TAG)
#   skopeo copy --all oci:_output/images/akri-driver-controller:$(cat _output/images/TAG) oci-archive:akri-driver-controller.tar
# (--all: both platforms; without it skopeo copies this machine's only.)
#
# Packing is umoci (per platform: a rootless unpack of an empty image, the files put in, one
# repack, the config set), then the index written with jq; the checks read the result back
# with other tools: skopeo (the index, and each platform's config as skopeo resolves it), tar
# (each layer unpacked: files, modes, owners, `--version` run from the unpacked rootfs), `file`
# and readelf (static, the platform's machine, relocations packed). images/Dockerfile builds the same images for people with Docker;
# its equivalence is checked here too (ENTRYPOINT, USER and VERSION of each stage).
#
# Each image is one layer: /etc/passwd and /etc/group (images/rootfs/etc: root, and nonroot
# 65532), /tmp (1777), the binaries in /usr/local/bin. No CA certificates: kube-rs trusts the
# kubeconfig's CA, or in a pod the ServiceAccount's ca.crt, and nothing else. File times are
# SOURCE_DATE_EPOCH (default: the last commit's time), so an unchanged binary gives the same
# image digest again.
#
# Needs (Debian): umoci, skopeo, musl-tools (musl-gcc, for ring's C code), gcc-aarch64-linux-gnu,
# qemu-user-static, jq, file, binutils; the rustup targets x86_64-unknown-linux-musl and
# aarch64-unknown-linux-musl. hack/setup.sh (run by .ci/run) installs them.
set -euo pipefail
cd "$(dirname "$0")/.."

# platform (OCI architecture) | Rust target | `file`'s name of the machine | how to run it here
PLATFORMS=(
  "amd64|x86_64-unknown-linux-musl|x86-64|"
  "arm64|aarch64-unknown-linux-musl|ARM aarch64|qemu-aarch64-static"
)
# The arm64 cross toolchain, unless the caller chose another.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER:-aarch64-linux-gnu-gcc}
export CC_aarch64_unknown_linux_musl=${CC_aarch64_unknown_linux_musl:-aarch64-linux-gnu-gcc}
export AR_aarch64_unknown_linux_musl=${AR_aarch64_unknown_linux_musl:-aarch64-linux-gnu-ar}
OUT=_output/images
PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# image | user | binaries (the first is the entrypoint) | why this user (label sh.akri.image.user)
COMPONENTS=(
  "akri-kubelet-plugin|0:0|akri-kubelet-plugin|root: writes the kubelet's host paths (/var/lib/kubelet/plugins_registry, /var/lib/kubelet/plugins, /var/run/cdi) and its state under /var/lib, and the kubelet's device-plugins dir in legacy mode"
  "akri-driver-controller|65532:65532|akri-driver-controller|nonroot: talks to the API server only"
  "akri-broker-controller|65532:65532|akri-broker-controller|nonroot: talks to the API server only"
  "akri-udev-discovery-handler|0:0|akri-udev-discovery-handler|root: reads the host's udev database and sysfs attributes, not all world-readable"
  "akri-opcua-discovery-handler|65532:65532|akri-opcua-discovery-handler|nonroot: serves and registers in a directory of its own that the kubelet-plugin makes for this user"
  "akri-onvif-discovery-handler|65532:65532|akri-onvif-discovery-handler|nonroot: serves and registers in a directory of its own that the kubelet-plugin makes for this user"
  "akri-debug-echo-discovery-handler|65532:65532|akri-debug-echo-discovery-handler|nonroot: serves and registers in a directory of its own that the kubelet-plugin makes for this user"
  "akri-migrate|65532:65532|akri-migrate kubectl-akri|nonroot: command-line tools that read files and talk to the API server"
)

check_only=false
only_platform=""
only_images=()
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check_only=true; shift ;;
    --platform) only_platform=${2:?--platform needs amd64 or arm64}; shift 2 ;;
    --image) only_images+=("${2:?--image needs an image name}"); shift 2 ;;
    *) echo "usage: $0 [--check] [--platform amd64|arm64] [--image <name>]..." >&2; exit 2 ;;
  esac
done
if [ -n "$only_platform" ]; then
  kept=()
  for p in "${PLATFORMS[@]}"; do [ "${p%%|*}" != "$only_platform" ] || kept+=("$p"); done
  [ ${#kept[@]} = 1 ] || { echo "images: no platform $only_platform (amd64, arm64)" >&2; exit 2; }
  PLATFORMS=("${kept[@]}")
fi
if [ ${#only_images[@]} -gt 0 ]; then
  kept=()
  for image in "${only_images[@]}"; do
    found=false
    for c in "${COMPONENTS[@]}"; do [ "${c%%|*}" != "$image" ] || { kept+=("$c"); found=true; }; done
    $found || { echo "images: no image $image" >&2; exit 2; }
  done
  COMPONENTS=("${kept[@]}")
fi
# What was asked for: part of what makes a build the same as one checked before.
selection="${PLATFORMS[*]%%|*} ${COMPONENTS[*]%%|*}"

for tool in cargo umoci skopeo jq file readelf flock sha256sum qemu-aarch64-static "$CC_aarch64_unknown_linux_musl"; do
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
  # Both targets in one invocation: build scripts and proc macros are compiled once.
  targets=()
  for p in "${PLATFORMS[@]}"; do
    IFS='|' read -r _ target _ _ <<<"$p"
    targets+=(--target "$target")
  done
  echo "== cargo build --release ${targets[*]} ${packages[*]}"
  cargo build --release "${targets[@]}" "${packages[@]}"
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

# Packed and checked before from these very binaries under this tag (hack/test.sh builds the
# images, then hack/demo.sh asks for them again): reused.
built_digest() {
  local p target bin
  for p in "${PLATFORMS[@]}"; do
    IFS='|' read -r _ target _ _ <<<"$p"
    for bin in "${all_bins[@]}"; do cat "$target_dir/$target/release/$bin"; done
  done | sha256sum | cut -d' ' -f1
}
if ! $check_only; then
  built="$tag $(built_digest) $selection"
  if [ "$(cat "$OUT/CHECKED" 2>/dev/null)" = "$built" ]; then
    echo "images: up to date, packed and checked before ($OUT, tag $tag)"
    echo "$tag"
    exit 0
  fi
  rm -f "$OUT/CHECKED"
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
  local entry=${bins%% *} pkg layout bundle rootfs bin p arch target
  pkg=$(package_of "$entry")
  layout=$work/$name

  umoci init --layout "$layout"
  for p in "${PLATFORMS[@]}"; do
    IFS='|' read -r arch target _ _ <<<"$p"
    bundle=$work/bundle-$name-$arch
    rootfs=$bundle/rootfs
    umoci new --image "$layout:$tag-$arch"
    umoci unpack --rootless --image "$layout:$tag-$arch" "$bundle" >/dev/null
    install -d -m 0755 "$rootfs/etc" "$rootfs/usr" "$rootfs/usr/local" "$rootfs/usr/local/bin"
    install -d -m 1777 "$rootfs/tmp"
    install -m 0644 images/rootfs/etc/passwd images/rootfs/etc/group "$rootfs/etc/"
    for bin in $bins; do
      install -m 0755 "$target_dir/$target/release/$bin" "$rootfs/usr/local/bin/"
    done
    find "$rootfs" -exec touch -h -d "@$epoch" {} +
    umoci repack --image "$layout:$tag-$arch" --history.created "$created" \
      --history.created_by "hack/images.sh: /etc/passwd, /etc/group, /tmp, /usr/local/bin/{${bins// /,}}" "$bundle"
    umoci config --image "$layout:$tag-$arch" --no-history --created "$created" \
      --os linux --architecture "$arch" \
      --config.entrypoint "/usr/local/bin/$entry" --config.user "$user" --config.env "$PATH_ENV" \
      --config.label "org.opencontainers.image.title=$name" \
      --config.label "org.opencontainers.image.version=$tag" \
      --config.label "org.opencontainers.image.revision=$commit" \
      --config.label "org.opencontainers.image.licenses=$(jq -r .license <<<"$pkg")" \
      --config.label "org.opencontainers.image.source=$source_url" \
      --config.label "sh.akri.image.user=$user_note"
  done
  umoci gc --layout "$layout"

  # The tag names an image index of the platforms' manifests (umoci writes no index, and one
  # tag per platform would make each platform an image of its own in a containerd import).
  local manifests index digest
  manifests=$(jq -c --arg tag "$tag" '[.manifests[]
      | (.annotations["org.opencontainers.image.ref.name"] | ltrimstr($tag + "-")) as $arch
      | {mediaType, digest, size, platform: {architecture: $arch, os: "linux"}}]' "$layout/index.json")
  index=$(jq -cn --argjson m "$manifests" '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: $m}')
  digest=$(printf '%s' "$index" | sha256sum | cut -d' ' -f1)
  printf '%s' "$index" >"$layout/blobs/sha256/$digest"
  jq -cn --arg digest "sha256:$digest" --argjson size "${#index}" --arg tag "$tag" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
      manifests: [{mediaType: "application/vnd.oci.image.index.v1+json", digest: $digest, size: $size,
                   annotations: {"org.opencontainers.image.ref.name": $tag}}]}' >"$layout/index.json"
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
  # akri-migrate and kubectl-akri are also commands for an operator's machine: their static
  # binaries per platform.
  for p in "${PLATFORMS[@]}"; do
    IFS='|' read -r arch target _ _ <<<"$p"
    for command in akri-migrate kubectl-akri; do
      [[ " ${all_bins[*]} " == *" $command "* ]] || continue
      install -D -m 0755 "$target_dir/$target/release/$command" "_output/bin/linux-$arch/$command"
      (cd "_output/bin/linux-$arch" && sha256sum "$command" >"$command.sha256")
    done
  done
fi

# Checks: every failure is reported, then the script fails.
failures=()
fail() { failures+=("$1: $2"); echo "FAIL $1: $2" >&2; }

# The images/Dockerfile stage named $1 (FROM ... AS $1 up to the next FROM).
dockerfile_stage() { awk -v s="$1" 'toupper($1) == "FROM" { on = (tolower($NF) == s) } on' images/Dockerfile; }

want_platforms=$(for p in "${PLATFORMS[@]}"; do echo "linux/${p%%|*}"; done | sort | xargs)
rows=()
declare -A rootfs_of # "<image> <arch>" -> its unpacked rootfs
check_image() {
  local name=$1 user=$2 bins=$3
  local entry=${bins%% *} version ref index platforms p arch
  version=$(package_of "$entry" | jq -r .version)
  ref="oci:$OUT/$name:$tag"
  if ! index=$(skopeo inspect --raw "$ref" 2>&1); then
    fail "$name" "skopeo cannot read $ref: $index"
    return
  fi
  [ "$(jq -r .mediaType <<<"$index")" = application/vnd.oci.image.index.v1+json ] ||
    fail "$name" "$tag is a $(jq -r .mediaType <<<"$index"), want an OCI image index"
  platforms=$(jq -r '[.manifests[].platform | .os + "/" + .architecture] | sort | join(" ")' <<<"$index")
  [ "$platforms" = "$want_platforms" ] || fail "$name" "the index's platforms are [$platforms], want [$want_platforms]"
  for p in "${PLATFORMS[@]}"; do
    IFS='|' read -r arch _ machine runner <<<"$p"
    check_platform "$name" "$user" "$bins" "$version" "$index" "$arch" "$machine" "$runner"
  done

  # images/Dockerfile builds the same image.
  local stage=${name#akri-}
  dockerfile_stage "$stage" | grep -qxF "ENTRYPOINT [\"/usr/local/bin/$entry\"]" ||
    fail "$name" "images/Dockerfile stage $stage has no ENTRYPOINT [\"/usr/local/bin/$entry\"]"
  dockerfile_stage "$stage" | grep -qxF "USER $user" || fail "$name" "images/Dockerfile stage $stage has no USER $user"
}

# One platform's image of the index: its config as skopeo resolves it for that platform, its one
# layer unpacked with tar, its binaries run (under qemu-user for another architecture).
check_platform() {
  local name=$1 user=$2 bins=$3 version=$4 index=$5 arch=$6 machine=$7 runner=$8
  local entry=${bins%% *} what="$name $arch" ref="oci:$OUT/$name:$tag" digest manifest config layers compressed rootfs bin out
  digest=$(jq -r --arg a "$arch" '.manifests[] | select(.platform.architecture == $a) | .digest' <<<"$index")
  if [ -z "$digest" ] || ! manifest=$(cat "$OUT/$name/blobs/sha256/${digest#sha256:}" 2>&1); then
    fail "$what" "no manifest for linux/$arch in the index"
    return
  fi
  if ! config=$(skopeo inspect --override-os linux --override-arch "$arch" --config --raw "$ref" 2>&1); then
    fail "$what" "skopeo cannot read the config of $ref for linux/$arch: $config"
    return
  fi
  [ "$config" = "$(cat "$OUT/$name/blobs/sha256/$(jq -r '.config.digest | ltrimstr("sha256:")' <<<"$manifest")" 2>&1)" ] ||
    fail "$what" "skopeo resolved linux/$arch to a config that is not the one of the index's linux/$arch manifest"

  # Config: entrypoint, user, platform, labels.
  [ "$(jq -c .config.Entrypoint <<<"$config")" = "[\"/usr/local/bin/$entry\"]" ] ||
    fail "$what" "entrypoint is $(jq -c .config.Entrypoint <<<"$config"), want [\"/usr/local/bin/$entry\"]"
  [ "$(jq -r '.config.User // ""' <<<"$config")" = "$user" ] ||
    fail "$what" "user is '$(jq -r '.config.User // ""' <<<"$config")', want '$user'"
  # Root only where the host paths need it: the kubelet-plugin (the kubelet's directories) and
  # the discovery handlers (the agent's root-owned registration socket in /var/lib/akri).
  if [[ ! " akri-kubelet-plugin akri-udev-discovery-handler akri-opcua-discovery-handler akri-onvif-discovery-handler akri-debug-echo-discovery-handler " =~ " $name " ]]; then
    case "$(jq -r '.config.User // ""' <<<"$config")" in
      "" | 0 | 0:* | root | root:*) fail "$what" "runs as root" ;;
    esac
  fi
  [ "$(jq -r '.os + "/" + .architecture' <<<"$config")" = "linux/$arch" ] ||
    fail "$what" "config platform is $(jq -r '.os + "/" + .architecture' <<<"$config"), want linux/$arch"
  # The chart's command is the bare binary name: the image's PATH must find it.
  jq -e '.config.Env // [] | any(startswith("PATH=") and (split("=")[1] | split(":") | index("/usr/local/bin")))' <<<"$config" >/dev/null ||
    fail "$what" "PATH has no /usr/local/bin (the chart runs the binary by name)"
  local label want got
  for label in title="$name" version="$tag" revision="$commit" licenses=Apache-2.0 source=; do
    want=${label#*=}
    label=org.opencontainers.image.${label%%=*}
    got=$(jq -r --arg l "$label" '.config.Labels[$l] // ""' <<<"$config")
    if [ -z "$got" ] || { [ -n "$want" ] && [ "$got" != "$want" ]; }; then
      fail "$what" "label $label is '$got'${want:+, want '$want'}"
    fi
  done

  # Manifest: one gzip layer, every file root's.
  layers=$(jq '.layers | length' <<<"$manifest")
  [ "$layers" = 1 ] || fail "$what" "$layers layers, want 1"
  jq -e 'all(.layers[]; .mediaType == "application/vnd.oci.image.layer.v1.tar+gzip")' <<<"$manifest" >/dev/null ||
    fail "$what" "a layer is not tar+gzip"
  compressed=$(jq '[.layers[].size] | add // 0' <<<"$manifest")
  local layer owners
  rootfs=$work/check-$name-$arch
  mkdir -p "$rootfs"
  for layer in $(jq -r '.layers[].digest' <<<"$manifest"); do
    layer=$OUT/$name/blobs/sha256/${layer#sha256:}
    owners=$(tar -tvzf "$layer" --numeric-owner | awk '{print $2}' | sort -u | xargs)
    [ "$owners" = 0/0 ] || fail "$what" "layer $layer has files owned by $owners, want 0/0 only"
    out=$(tar -xzpf "$layer" -C "$rootfs" 2>&1) || fail "$what" "tar cannot unpack $layer: $out"
  done

  # Contents: the files, their modes, the binaries (static, this platform's machine) run.
  local want_files=". etc etc/group etc/passwd tmp usr usr/local usr/local/bin" got_files
  for bin in $bins; do want_files+=" usr/local/bin/$bin"; done
  got_files=$(cd "$rootfs" && find . -mindepth 0 | sed 's|^\./||' | sort | xargs)
  [ "$got_files" = "$(tr ' ' '\n' <<<"$want_files" | sort | xargs)" ] ||
    fail "$what" "files are [$got_files], want [$want_files]"
  [ "$(stat -c %a "$rootfs/tmp" 2>/dev/null)" = 1777 ] || fail "$what" "/tmp is not mode 1777"
  grep -q '^nonroot:x:65532:65532:' "$rootfs/etc/passwd" 2>/dev/null || fail "$what" "/etc/passwd has no nonroot 65532"
  for bin in $bins; do
    local path=$rootfs/usr/local/bin/$bin description rela
    [ -x "$path" ] || { fail "$what" "/usr/local/bin/$bin missing or not executable"; continue; }
    description=$(file -b "$path")
    case "$description" in
      *"statically linked"* | *"static-pie linked"*) ;;
      *) fail "$what" "$bin is not static: $description" ;;
    esac
    [[ "$description" == *", $machine,"* ]] || fail "$what" "$bin is not a $machine binary: $description"
    if readelf -lW "$path" | grep -q INTERP; then fail "$what" "$bin has a program interpreter (dynamic)"; fi
    # No unpacked relocations (.cargo/config.toml packs them; Rust's aarch64 musl binaries are
    # not position-independent and have none): 1.8 MB less resident in the kubelet-plugin.
    rela=$(readelf -SW "$path" | awk '{ for (i = 1; i <= NF; i++) if ($i == ".rela.dyn") print $(i + 4) }')
    [ -z "$rela" ] || [ $((16#$rela)) = 0 ] ||
      fail "$what" "$bin has $((16#$rela)) bytes of unpacked relocations (.rela.dyn): built without .cargo/config.toml's rustflags (RUSTFLAGS set?)"
    out=$(env -i $runner "$path" --version 2>&1) || true
    [ "$out" = "$bin $version" ] || fail "$what" "$bin --version printed '$(head -c 200 <<<"$out" | head -n 3)', want '$bin $version'"
    out=$(env -i $runner "$path" --help 2>&1) || fail "$what" "$bin --help failed: $(head -c 200 <<<"$out")"
    [[ "$out" == *Usage:* ]] || fail "$what" "$bin --help printed no usage: '$(head -c 200 <<<"$out" | head -n 3)'"
  done
  rootfs_of["$name $arch"]=$rootfs

  local unpacked
  unpacked=$(du -sb "$rootfs" | cut -f1)
  rows+=("$(printf '%-36s %-6s %-40s %6s %21s %21s  %s' "$name" "$arch" "$tag" "$layers" \
    "$(numfmt --to=iec-i --suffix=B "$compressed") ($compressed)" "$(numfmt --to=iec-i --suffix=B "$unpacked") ($unpacked)" \
    "${digest:0:19}")")
}

# Real work on every platform: akri-migrate turns Akri's v0 Configurations (the golden tests'
# inputs) into v1 objects, and every platform's build prints the same bytes.
check_migrate_work() {
  local inputs=migrate/tests/fixtures/v0 p arch runner out reference="" reference_arch
  for p in "${PLATFORMS[@]}"; do
    IFS='|' read -r arch _ _ runner <<<"$p"
    [ -n "${rootfs_of["akri-migrate $arch"]:-}" ] || continue
    if ! out=$(env -i $runner "${rootfs_of["akri-migrate $arch"]}/usr/local/bin/akri-migrate" "$inputs" 2>&1); then
      fail "akri-migrate $arch" "akri-migrate $inputs failed: $(head -c 300 <<<"$out")"
      continue
    fi
    grep -q '^kind: DiscoveryConfiguration$' <<<"$out" || fail "akri-migrate $arch" "akri-migrate $inputs printed no DiscoveryConfiguration"
    if [ -z "$reference" ]; then
      reference=$out reference_arch=$arch
    elif [ "$out" != "$reference" ]; then
      fail "akri-migrate $arch" "akri-migrate $inputs printed other output than the $reference_arch build: $(diff <(echo "$reference") <(echo "$out") | head -5)"
    else
      echo "akri-migrate $inputs: $arch prints what $reference_arch prints ($(grep -c '^kind: ' <<<"$out") objects, $(wc -c <<<"$out") bytes)"
    fi
  done
}

echo "== check images"
for c in "${COMPONENTS[@]}"; do
  IFS='|' read -r name user bins _ <<<"$c"
  check_image "$name" "$user" "$bins"
done
check_migrate_work
dockerfile_version=$(sed -n 's/^ARG VERSION=//p' images/Dockerfile | head -1)
[ "$dockerfile_version" = "$workspace_version" ] ||
  fail images/Dockerfile "ARG VERSION=$dockerfile_version, the workspace is $workspace_version"

printf '%-36s %-6s %-40s %6s %21s %21s  %s\n' IMAGE ARCH TAG LAYERS "COMPRESSED (bytes)" "UNPACKED (bytes)" MANIFEST
printf '%s\n' "${rows[@]}"
if [ ${#failures[@]} -gt 0 ]; then
  echo "images: ${#failures[@]} check(s) failed:" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "images: all checks passed ($OUT, tag $tag)"
$check_only || echo "$built" >"$OUT/CHECKED"
echo "$tag"
