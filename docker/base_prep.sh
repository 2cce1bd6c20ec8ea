#!/bin/sh
# Runs as root at the start of docker/airflow.Dockerfile.  On the official apache/airflow image it only makes the
# mount points.  On a bare Python base (the Debian bookworm image of docker/local-base/, used where Docker Hub is
# out of reach) it also creates what the official image brings: user airflow (50000, group 0), a virtualenv at
# /home/airflow/.local (on the official image's PATH already) and AIRFLOW_HOME=/opt/airflow.
set -eu
if ! id airflow >/dev/null 2>&1; then
  useradd --uid 50000 --gid 0 --create-home --home-dir /home/airflow --shell /bin/bash airflow
  python3 -m venv /home/airflow/.local
  mkdir -p /opt/airflow/logs /opt/airflow/dags
  chown -R 50000:0 /home/airflow /opt/airflow
fi
mkdir -p /opt/mindloom/data/train /opt/airflow/auth
chown -R 50000:0 /opt/mindloom /opt/airflow/auth
chmod -R g+rwX /opt/mindloom /opt/airflow/auth
