#!/bin/sh
# Airflow + the Celery executor + mindloom's data-stage dependencies, at exact pins (called by airflow.Dockerfile).
# Official image: Airflow's own dependencies stay as the image ships them (tested with its preinstalled providers);
# only the Celery closure is added, pinned by constraints-celery.txt.  Bare Python base: nothing is installed yet,
# so the whole tree is resolved against requirements.lock (+ the Celery closure and the Postgres drivers; `wheel`,
# at the project venv's version: the official image has it, the train target's astunparse needs it).
set -eu
D=/opt/mindloom/docker
if python -c "import airflow" 2>/dev/null; then
  "$D/pip_install.sh" "apache-airflow==${AIRFLOW_VERSION}" apache-airflow-providers-celery "celery[redis]" \
    --constraint "$D/constraints-celery.txt"
else
  "$D/pip_install.sh" "apache-airflow==${AIRFLOW_VERSION}" apache-airflow-providers-celery "celery[redis]" \
    psycopg2-binary asyncpg "wheel==0.48.0" --constraint /opt/mindloom/requirements.lock --constraint "$D/constraints-celery.txt"
fi
python "$D/lock_pins.py" /opt/mindloom/requirements.lock "$D/data-packages.txt" > /tmp/data-pins.txt
"$D/pip_install.sh" --no-deps --requirement /tmp/data-pins.txt
rm /tmp/data-pins.txt
