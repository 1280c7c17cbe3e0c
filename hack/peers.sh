#!/usr/bin/env bash
# The discovery handlers' test peers (hack/peers/*.py): a Python virtualenv in
# _output/tools/peers-venv with the pinned packages below, from PyPI. Reused when the pins
# have not changed.
#
#   hack/peers.sh     make or refresh it; prints the Python's path
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=_output/tools/peers-venv
# asyncua: a real OPC UA server and Local Discovery Server (FreeOpcUa); WSDiscovery: a real
# WS-Discovery publisher for the ONVIF camera peer.
PINS="asyncua==2.1.0 WSDiscovery==2.1.2"

stamp="$VENV/.pins"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$PINS" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
command -v python3 >/dev/null || { echo "peers: python3 not found" >&2; exit 1; }
rm -rf "$VENV"
python3 -m venv "$VENV"
# shellcheck disable=SC2086
"$VENV/bin/pip" install --quiet --disable-pip-version-check $PINS
echo "$PINS" > "$stamp"
echo "$VENV/bin/python"
