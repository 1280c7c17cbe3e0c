#!/usr/bin/env bash
# The machine's part of every build and run: the Debian packages, the Rust targets and
# components. .ci/run and hack/demo.sh run it first, so a fresh machine of our kind needs
# nothing installed by hand. Installs only what is missing (as root; else it says what to
# install and fails).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# Debian packages: protoc for the gRPC code generated in proto/build.rs, setpriv (util-linux)
# for the test harness's parent-death signal, a C toolchain for ring; for hack/images.sh,
# musl-gcc (ring for the musl target), umoci and skopeo (OCI images without a Docker engine),
# jq and file (its checks); procps for kill(1); for hack/node-bins.sh (the real test node),
# libseccomp-dev and pkg-config (runc with seccomp), busybox-static (the test image), iproute2
# (the node's bridge), e2fsprogs (mkfs.ext4: the nearly-full-disk test's filesystem).
missing=()
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v setpriv >/dev/null || missing+=(util-linux)
command -v cc >/dev/null || missing+=(build-essential)
command -v git >/dev/null || missing+=(git)
command -v musl-gcc >/dev/null || missing+=(musl-tools)
# The arm64 images: the cross C compiler and linker, and qemu-user to run what it built.
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v umoci >/dev/null || missing+=(umoci)
command -v skopeo >/dev/null || missing+=(skopeo)
# curl: hack/registry.sh asks whether a registry answers.
command -v curl >/dev/null || missing+=(curl)
command -v jq >/dev/null || missing+=(jq)
command -v file >/dev/null || missing+=(file)
[ -f /usr/lib/x86_64-linux-gnu/libseccomp.a ] || missing+=(libseccomp-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v ip >/dev/null || missing+=(iproute2)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
# losetup (Debian's mount package) and partx (util-linux): the udev handler's real loop disks.
command -v losetup >/dev/null || missing+=(mount)
command -v partx >/dev/null || missing+=(util-linux)
# python3 with venv (hack/peers.sh: the discovery handlers' test peers, from PyPI).
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
# procps' kill(1): tests stop real binaries with SIGTERM (`kill` in a shell is a builtin).
[ -x /bin/kill ] || [ -x /usr/bin/kill ] || missing+=(procps)
# nft: kube-proxy's nftables mode and the real nodes' rule that keeps pods' packets on this
# machine.
command -v nft >/dev/null || missing+=(nftables)
if [ ${#missing[@]} -gt 0 ]; then
  # As root, or through sudo where it needs no password (a CI runner's user).
  as_root=()
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || {
      echo "setup: missing Debian packages: ${missing[*]} (run as root, or apt-get install them)" >&2
      exit 1
    }
    as_root=(sudo -n --preserve-env=DEBIAN_FRONTEND)
  fi
  echo "== apt-get install ${missing[*]}"
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi


# Rust at the workspace's rust-version or newer; Go 1.26 or newer (the go directive of the
# newest Kubernetes built here), or 1.21 or newer where GOTOOLCHAIN lets it fetch the Go a
# build names through the module proxy (.ci/run sets GOTOOLCHAIN=auto); the disk a cold build
# takes.
repo=$(cd "$(dirname "$0")/.." && pwd)
at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }
command -v cargo >/dev/null || { echo "setup: cargo not found: install Rust with rustup (https://rustup.rs)" >&2; exit 1; }
rust_needed=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' "$repo/Cargo.toml")
rust_have=$(cargo --version | cut -d' ' -f2)
at_least "$rust_have" "$rust_needed" ||
  { echo "setup: Rust $rust_have is older than the workspace's rust-version $rust_needed: rustup update stable" >&2; exit 1; }
command -v go >/dev/null || { echo "setup: go not found: install Go 1.26 or newer (https://go.dev/dl)" >&2; exit 1; }
go_have=$(go env GOVERSION | sed 's/^go//')
go_needed=1.26
[ "$(go env GOTOOLCHAIN)" = local ] || go_needed=1.21
at_least "$go_have" "$go_needed" ||
  { echo "setup: Go $go_have is older than $go_needed: install a newer Go, or GOTOOLCHAIN=auto with Go 1.21 or newer" >&2; exit 1; }
# The disk a cold build needs, checked before one: once the build is under way (hack/demo.sh
# runs this again in the middle of hack/test.sh) what it has used is no longer needed, and a
# cold CI here failed there with 24 GB free.
disk_needed_gb=${AKRI_SETUP_DISK_GB:-25}
disk_free_gb=$(( $(df --output=avail -k "$repo" | tail -1) / 1024 / 1024 ))
[ -d "$repo/target" ] || [ "$disk_free_gb" -ge "$disk_needed_gb" ] ||
  { echo "setup: ${disk_free_gb} GB free where the build goes ($repo), a cold build needs about ${disk_needed_gb} GB: free some (cargo clean, go clean -cache -modcache), or set AKRI_SETUP_DISK_GB to go on with less" >&2; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# The static release binaries of the images (hack/images.sh), amd64 and arm64.
rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl >/dev/null
