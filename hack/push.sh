#!/usr/bin/env bash
# Pushes what hack/images.sh built to a registry, as a user publishes it for their cluster:
#
#   hack/push.sh localhost:5000/akri --plain-http   # the README's Quickstart (hack/registry.sh)
#   hack/push.sh ghcr.io/<owner>                    # hack/release.sh --push
#
# - every image in _output/images under its tag (_output/images/TAG) to <registry>/<image>:<tag>,
#   both platforms (`skopeo copy --all`);
# - the chart, packaged with version and appVersion set to that tag (so its default image tag
#   is the one pushed, and an upgrade to a newer chart moves the images), to
#   oci://<registry>/charts (`helm push`): `helm install akri oci://<registry>/charts/akri
#   --version <tag>` installs it.
# --plain-http for a registry without TLS (a local one). Needs skopeo and Helm (hack/helm.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

registry=${1:?usage: $0 <registry, e.g. localhost:5000/akri> [--plain-http]}
plain_http=false
case "${2:-}" in
  --plain-http) plain_http=true ;;
  "") ;;
  *) echo "push: unknown argument $2" >&2; exit 2 ;;
esac
[ -f _output/images/TAG ] || { echo "push: no _output/images/TAG: build the images first (hack/images.sh)" >&2; exit 1; }
tag=$(cat _output/images/TAG)
helm=$(hack/helm.sh | tail -1)

tls=()
http=()
if $plain_http; then
  tls=(--dest-tls-verify=false)
  http=(--plain-http)
fi
for layout in _output/images/*/; do
  image=$(basename "$layout")
  echo "== $registry/$image:$tag"
  skopeo copy --quiet --all "${tls[@]}" "oci:$layout:$tag" "docker://$registry/$image:$tag"
done
charts=_output/charts
mkdir -p "$charts"
"$helm" package charts/akri --version "$tag" --app-version "$tag" --destination "$charts" >/dev/null
echo "== oci://$registry/charts/akri:$tag"
"$helm" push "$charts/akri-$tag.tgz" "oci://$registry/charts" "${http[@]}"
