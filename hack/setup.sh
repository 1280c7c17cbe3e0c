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
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]} (run as root, or apt-get install them)" >&2
    exit 1
  fi
  echo "== apt-get install ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi


command -v cargo >/dev/null || { echo "cargo not found: this machine kind ships Rust via rustup" >&2; exit 1; }
command -v go >/dev/null || { echo "go not found: this machine kind ships Go" >&2; exit 1; }
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# The static release binaries of the images (hack/images.sh), amd64 and arm64.
rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl >/dev/null
