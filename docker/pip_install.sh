#!/bin/sh
# pip install for the Dockerfiles.  Where the build passes a CA bundle as the BuildKit secret `pip_ca` (a machine
# behind a TLS-inspecting proxy, see tests/docker_stack/), pip trusts it for this command only; nothing of it stays
# in a layer.
set -eu
if [ -s /run/secrets/pip_ca ]; then
  export PIP_CERT=/run/secrets/pip_ca
fi
exec python -m pip install --no-cache-dir "$@"
