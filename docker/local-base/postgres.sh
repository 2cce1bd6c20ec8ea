#!/bin/sh
# Debian's PostgreSQL 15 (from the local base image) as the test stack's metadata DB, in place of the postgres
# image that cannot be pulled here.  Same environment as the official image (POSTGRES_USER/_PASSWORD/_DB), plus
# PGPORT; listens on 127.0.0.1 only (the stack runs on host networking).
set -eu
BIN=/usr/lib/postgresql/15/bin
DATA=/var/lib/postgresql/data/pg15
mkdir -p /var/lib/postgresql/data && chown postgres:postgres /var/lib/postgresql/data
if [ ! -s "$DATA/PG_VERSION" ]; then
  pw=$(mktemp) && printf '%s' "$POSTGRES_PASSWORD" > "$pw" && chown postgres "$pw"
  runuser -u postgres -- "$BIN/initdb" -D "$DATA" -U "$POSTGRES_USER" --pwfile="$pw" --auth=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pw"
  # Single-user mode: create the database before the server listens at all.
  echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" \
    | runuser -u postgres -- "$BIN/postgres" --single -D "$DATA" postgres >/dev/null
fi
exec runuser -u postgres -- "$BIN/postgres" -D "$DATA" -c listen_addresses=127.0.0.1 -p "$PGPORT" \
  -c unix_socket_directories=/tmp
