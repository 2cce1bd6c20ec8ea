#!/bin/sh
# Entrypoint of the mindloom training image: load the Ascend CANN environment when the base image has one, then
# validate the cluster layout and exec msrun for this node (python -m pipeline.train.jobs.launcher --help for the options).
set -eu
if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then
    # shellcheck disable=SC1091
    . /usr/local/Ascend/ascend-toolkit/set_env.sh
fi
exec python -m pipeline.train.jobs.launcher "$@"
