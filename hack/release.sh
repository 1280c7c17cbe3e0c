#!/usr/bin/env bash
# Cuts a release from its version tag: everything a user installs, in _output/release/<version>/.
#
#   git tag v0.2.0 && hack/release.sh                        # build and check it all
#   hack/release.sh --push localhost:5000/akri --plain-http  # and push it to a registry
#
# First, what makes it a release (each failure says how to fix it):
# - the tree is clean and HEAD is exactly at the git tag v<version>, <version> being the
#   workspace's (Cargo.toml);
# - charts/akri/Chart.yaml says `version: <version>` and `appVersion: "<version>"`: the chart's
#   default image tag is its appVersion, so a user who does not pin `image.tag` gets these
#   images, and an upgrade to the next chart moves them;
# - CHANGELOG.md has a section `## <version>` (its text becomes the release notes).
# Then, into _output/release/<version>/:
# - images/: hack/images.sh's OCI layouts (linux/amd64 and linux/arm64, tagged <version>: the
#   tag it gives a clean tree at the release tag);
# - akri-<version>.tgz: the chart, `helm package`d;
# - akri-migrate-linux-{amd64,arm64}, kubectl-akri-linux-{amd64,arm64} and SHA256SUMS;
# - crates/: `cargo package` of the crates meant for others (kubelet-proto, node-io,
#   dra-plugin), built and checked from the packaged sources alone; `cargo publish -p
#   kubelet-proto -p node-io -p dra-plugin` publishes them;
# - NOTES.md: the CHANGELOG's section.
# With --push <registry> (e.g. ghcr.io/<owner>): hack/push.sh, every image to
# <registry>/<image>:<version> (`skopeo copy --all`, both platforms) and the chart to
# oci://<registry>/charts (`helm push`); --plain-http for a registry without TLS (a local one). Users then install the chart by
# version: `helm install akri oci://<registry>/charts/akri --version <version> --set
# image.registry=<registry>`.
#
# After the release: move main to the next version (Cargo.toml, charts/akri/Chart.yaml,
# images/Dockerfile, a new "## Unreleased" in CHANGELOG.md) and name the release in
# hack/previous.sh (VERSION and COMMIT), which the upgrade test installs and upgrades from.
#
# .github/workflows/release.yml runs this on a tag push. Needs what hack/images.sh needs, and
# Helm (hack/helm.sh builds it).
set -euo pipefail
cd "$(dirname "$0")/.."

push=""
plain_http=false
while [ $# -gt 0 ]; do
  case "$1" in
    --push) push=${2:?--push needs a registry, e.g. localhost:5000/akri}; shift 2 ;;
    --plain-http) plain_http=true; shift ;;
    *) echo "release: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
fail() { echo "release: $*" >&2; exit 1; }

metadata=$(cargo metadata --no-deps --format-version 1)
version=$(jq -r '.packages[] | select(.name == "dra-plugin") | .version' <<<"$metadata")
[ -z "$(git status --porcelain --untracked-files=normal)" ] ||
  fail "the tree has changes (git status): a release is built from its tag alone"
git describe --exact-match --tags --match "v$version" HEAD >/dev/null 2>&1 ||
  fail "HEAD is not at tag v$version (the workspace's version): git tag v$version, or set the version in Cargo.toml"
chart_version=$(sed -n 's/^version: *//p' charts/akri/Chart.yaml)
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/akri/Chart.yaml)
[ "$chart_version" = "$version" ] && [ "$app_version" = "$version" ] ||
  fail "charts/akri/Chart.yaml has version $chart_version and appVersion $app_version: set both to $version"
notes=$(awk -v v="$version" '$0 == "## " v { on = 1; next } on && /^## / { exit } on' CHANGELOG.md)
[ -n "$(echo "$notes" | tr -d '[:space:]')" ] ||
  fail "CHANGELOG.md has no section \"## $version\": move the Unreleased entries there"

out=_output/release/$version
rm -rf "$out"
mkdir -p "$out/crates"
echo "== release $version into $out"

echo "== images (hack/images.sh)"
hack/images.sh
tag=$(cat _output/images/TAG)
[ "$tag" = "$version" ] || fail "hack/images.sh tagged the images $tag, not $version"
cp -r _output/images "$out/images"
rm -f "$out/images/.lock"

echo "== the chart"
helm=$(hack/helm.sh | tail -1)
"$helm" lint charts/akri
"$helm" package charts/akri --destination "$out" >/dev/null
[ -f "$out/akri-$version.tgz" ] || fail "helm package made no akri-$version.tgz"

echo "== akri-migrate and kubectl-akri"
for arch in amd64 arm64; do
  for command in akri-migrate kubectl-akri; do
    cp "_output/bin/linux-$arch/$command" "$out/$command-linux-$arch"
  done
done
(cd "$out" && sha256sum akri-migrate-linux-* kubectl-akri-linux-* "akri-$version.tgz" >SHA256SUMS)

echo "== the crates meant for others (cargo package, checked by building them from the package)"
cargo package -p kubelet-proto -p node-io -p dra-plugin
# Where cargo put them: the target directory, wherever CARGO_TARGET_DIR or a config sets it.
packaged=$(jq -r .target_directory <<<"$metadata")/package
cp "$packaged"/{kubelet-proto,node-io,dra-plugin}-"$version".crate "$out/crates/"

echo "$notes" >"$out/NOTES.md"

if [ -n "$push" ]; then
  echo "== pushing to $push (hack/push.sh)"
  http=()
  $plain_http && http=(--plain-http)
  hack/push.sh "$push" "${http[@]}"
fi

echo "== release $version:"
(cd "$out" && find . -maxdepth 2 -type f | sort)
