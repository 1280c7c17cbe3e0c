#!/usr/bin/env bash
# The previous release, as the upgrade test installs it: its tree at its tag and its images,
# built from that tree by its own hack/images.sh for linux/amd64 (the test's node), the three
# components the test runs.
#
#   hack/previous.sh   # _output/previous: the release's tree (a git worktree at its tag, in
#                      # $TMPDIR), its images in _output/previous/_output/images (tagged
#                      # <version>)
#
# Its crates build in this checkout's target directory: the dependencies this checkout's
# images compiled are reused where they match (the same versions, flags, profile and features;
# three packages unify some dependencies' features otherwise than eight do, and those compile
# again), and the workspace's crates compile again (194 s in a CI run of 2026-11-30). They differ by version from this checkout's (a release moves main to
# the next version), so the two never share an artifact: cargo names a workspace crate's
# artifacts by its name and version, not by its path, and a tree at another path with the same
# version would take the other's artifacts as its own. Hence the check below.
#
# When a release is cut (hack/release.sh), VERSION and COMMIT here name it.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.2.0
COMMIT=f325d94f03d3cbf0b0e8770a8555171f0e88fcb9
IMAGES=(akri-kubelet-plugin akri-driver-controller akri-debug-echo-discovery-handler)
DIR=_output/previous

fail() { echo "previous: $*" >&2; exit 1; }
for tool in git cargo jq flock; do
  command -v "$tool" >/dev/null || fail "$tool not found (.ci/run installs what is needed)"
done
metadata=$(cargo metadata --no-deps --format-version 1)
workspace_version=$(jq -r '.packages[] | select(.name == "dra-plugin") | .version' <<<"$metadata")
[ "$workspace_version" != "$VERSION" ] ||
  fail "the workspace is at $VERSION, the previous release's version: move it to the next one (Cargo.toml, charts/akri/Chart.yaml, images/Dockerfile)"

# The release's commit. A shallow clone lacks it: its history is fetched first.
if ! git cat-file -e "$COMMIT^{commit}" 2>/dev/null && [ "$(git rev-parse --is-shallow-repository)" = true ]; then
  git fetch --quiet --unshallow || true
fi
git cat-file -e "$COMMIT^{commit}" 2>/dev/null ||
  fail "commit $COMMIT (v$VERSION) is not in this clone: clone the repository with its history"
# Its tag, which hack/images.sh needs to give the images the release's tag (a clone made
# without tags gets it here).
if tagged=$(git rev-parse -q --verify "refs/tags/v$VERSION^{commit}"); then
  [ "$tagged" = "$COMMIT" ] || fail "tag v$VERSION is $tagged, not $COMMIT as this script says"
else
  git tag "v$VERSION" "$COMMIT"
fi

# The release's tree, a worktree outside this one: cargo reads the .cargo/config.toml of every
# directory up from where it runs, and inside this checkout the release's rustflags would be
# this checkout's and its own together, so other flags, and every dependency compiled again.
# _output/previous links to it.
work=${TMPDIR:-/tmp}/akri-previous-$(printf %s "$PWD" | sha256sum | cut -c1-12)
git worktree prune
if ! git worktree list --porcelain | grep -qxF "worktree $work" ||
  [ "$(git -C "$work" rev-parse HEAD 2>/dev/null)" != "$COMMIT" ]; then
  git worktree remove --force "$work" 2>/dev/null || rm -rf "$work"
  git worktree prune
  git worktree add --quiet --detach "$work" "$COMMIT"
fi
mkdir -p _output
ln -sfn "$work" "$DIR"

# This checkout's images lock: a hack/images.sh of this checkout builds in the same target
# directory, and its cargo would put this checkout's binaries back in place of the release's
# between their build and their packing.
mkdir -p _output/images
exec 9>_output/images/.lock
flock 9
only=()
for image in "${IMAGES[@]}"; do only+=(--image "$image"); done
(cd "$work" && CARGO_TARGET_DIR=$(jq -r .target_directory <<<"$metadata") hack/images.sh --platform amd64 "${only[@]}")
tag=$(cat "$DIR/_output/images/TAG")
[ "$tag" = "$VERSION" ] || fail "the release's images are tagged $tag, not $VERSION"
echo "previous: v$VERSION's images in $DIR/_output/images, its chart in $DIR/charts/akri"
