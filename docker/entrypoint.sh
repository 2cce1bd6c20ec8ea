#!/bin/sh
# Entrypoint of the mindloom Airflow image.  On the official base it hands over to the official entrypoint
# (dumb-init + /entrypoint: `api-server` means `airflow api-server`, `bash`/`python` run as given).  On the local
# Debian base, which has no /entrypoint, it does the same with Debian's dumb-init.
set -eu
if [ -x /entrypoint ]; then
  exec /usr/bin/dumb-init -- /entrypoint "$@"
fi
case "${1:-}" in
  "") set -- bash ;;
  bash|sh|python|python3|airflow|celery|/*) ;;
  *) set -- airflow "$@" ;;
esac
exec /usr/bin/dumb-init -- "$@"
