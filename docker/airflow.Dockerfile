# mindloom on the official Apache Airflow 3.3.2 image (Python 3.11): api-server, scheduler, dag-processor,
# triggerer and Celery workers all run this image, so DAGs, the mindloom package and every pinned version are
# identical on every host.  Build from the repository root:
#
#   docker build -f docker/airflow.Dockerfile --target airflow       -t mindloom-airflow:<git-sha> .
#   docker build -f docker/airflow.Dockerfile --target airflow-train -t mindloom-airflow-train:<git-sha> .
#
# Targets: `airflow` = data stages (CPU fan-out, Celery `data` queue); `airflow-train` = + MindSpore 2.10.0 for the
# Celery `train` queue (TrainingStageOperator starts msrun on that worker).
# Versions: mindloom's own dependencies are installed at the exact pins of requirements.lock (--no-deps, names in
# docker/data-packages.txt and docker/train-packages.txt); Airflow's dependencies stay as the upstream image ships
# them (its constraints were tested with its preinstalled providers); the Celery provider closure is pinned by
# docker/constraints-celery.txt (celery 5.6.3: 5.7.0 breaks provider-celery 3.26.0).  `pip check` fails the build
# on any conflict.
# Reproducible base: the tag below is exact; to also pin the bytes, append the digest you verified, e.g.
#   --build-arg BASE_IMAGE=apache/airflow:3.3.2-python3.11@sha256:<digest of `docker buildx imagetools inspect …`>
# Without Docker Hub: BASE_IMAGE=<a Debian bookworm image with python3, python3-venv, dumb-init> (docker/local-base/
# builds one from Debian packages; docker/base_prep.sh then creates the airflow user and a venv, and
# docker/install_airflow.sh installs Airflow itself at the pins of requirements.lock).  Needs BuildKit (RUN --mount);
# a CA bundle for pip can come in as the secret `pip_ca` (`--secret id=pip_ca,src=<bundle>`).
ARG BASE_IMAGE=apache/airflow:3.3.2-python3.11

FROM ${BASE_IMAGE} AS airflow

ARG AIRFLOW_VERSION=3.3.2
ENV MINDLOOM_HOME=/opt/mindloom \
    MINDLOOM_CONFIG=/opt/mindloom/configs/default.yaml \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/mindloom/dags \
    AIRFLOW_HOME=/opt/airflow \
    PATH=/home/airflow/.local/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Mount points of the named volumes exist in the image, owned by airflow (50000:0, group-writable for OpenShift-style
# random UIDs in group 0), so a fresh volume starts with that ownership and nothing needs to run as root.
USER 0:0
COPY docker/base_prep.sh /usr/local/sbin/mindloom-base-prep
RUN /usr/local/sbin/mindloom-base-prep
USER 50000:0

# Dependencies first (cached until the lock or a package list changes).
COPY --chown=50000:0 requirements.lock /opt/mindloom/requirements.lock
COPY --chown=50000:0 docker/constraints-celery.txt docker/data-packages.txt docker/train-packages.txt docker/lock_pins.py docker/pip_install.sh docker/install_airflow.sh docker/entrypoint.sh /opt/mindloom/docker/
RUN --mount=type=secret,id=pip_ca,uid=50000 /opt/mindloom/docker/install_airflow.sh

# mindloom itself (editable: configs/ and dags/ stay next to the package, where pipeline.config looks for them).
COPY --chown=50000:0 pyproject.toml README.md /opt/mindloom/
COPY --chown=50000:0 pipeline /opt/mindloom/pipeline
COPY --chown=50000:0 operators /opt/mindloom/operators
COPY --chown=50000:0 dags /opt/mindloom/dags
COPY --chown=50000:0 configs /opt/mindloom/configs
COPY --chown=50000:0 docker/airflow_init.py /opt/mindloom/docker/airflow_init.py
RUN --mount=type=secret,id=pip_ca,uid=50000 /opt/mindloom/docker/pip_install.sh --no-deps --editable /opt/mindloom \
 && pip check \
 && python -c "import pipeline.tasks.corpus, operators.routing, airflow.providers.celery, pyarrow, datasketch, sentencepiece"

WORKDIR /opt/airflow
ENTRYPOINT ["/opt/mindloom/docker/entrypoint.sh"]
CMD []


FROM airflow AS airflow-train
# MindSpore (CPU wheel) for the `train` queue.  On Ascend hosts run training through docker/train.Dockerfile's
# CANN variant instead (EdgeExecutor or a Kubernetes job per node); see docker/README.md.
RUN --mount=type=secret,id=pip_ca,uid=50000 \
    python /opt/mindloom/docker/lock_pins.py /opt/mindloom/requirements.lock /opt/mindloom/docker/train-packages.txt > /tmp/train-pins.txt \
 && /opt/mindloom/docker/pip_install.sh --no-deps --requirement /tmp/train-pins.txt \
 && rm /tmp/train-pins.txt \
 && pip check \
 && python -c "import mindspore, shutil; assert shutil.which('msrun'), 'msrun not on PATH'"
