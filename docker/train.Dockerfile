# mindloom training image: MindSpore 2.10.0 + mindloom, entrypoint = validated multi-node msrun
# (`python -m pipeline.train.jobs.launcher`, see pipeline/train/jobs/launcher.py).  One container per node; every node runs the same
# image tag.  Build from the repository root:
#
#   docker build -f docker/train.Dockerfile -t mindloom-train:<git-sha> .
#
# Run node 1 of 2 × 8 devices (node 0 is the same with MINDLOOM_NODE_RANK=0; a Kubernetes Indexed Job may give
# JOB_COMPLETION_INDEX instead):
#   docker run --network host --shm-size 16g -v /shared:/shared \
#     -e MINDLOOM_NODES=2 -e MINDLOOM_DEVICES_PER_NODE=8 -e MINDLOOM_NODE_RANK=1 -e MINDLOOM_MASTER_ADDR=10.0.0.11 \
#     -e MINDLOOM_DEVICE=Ascend -e MINDLOOM_MSRUN_LOG_DIR=/shared/train/<run>/msrun_log \
#     mindloom-train:<git-sha> --job /shared/train/<run>/main/job.json
# `--dry-run` prints the msrun argv and environment instead of running; `--entrypoint msrun` gives raw msrun.
#
# Ascend (NPU) variant — same file, another base image with CANN (toolkit + kernels) for the NPU generation:
#   docker build -f docker/train.Dockerfile \
#     --build-arg BASE_IMAGE=ascendai/cann:<cann-version>-910b-ubuntu22.04-py3.11 -t mindloom-train-ascend:<sha> .
#   What changes: (1) the base brings CANN and its Python 3.11 (tag format <cann>-<chip>-<os>-<py>; pick the CANN
#   release that MindSpore 2.10's install guide pairs with, and pin the tag by digest); (2) the entrypoint sources
#   /usr/local/Ascend/ascend-toolkit/set_env.sh when present; (3) at run time mount the driver read-only and pass
#   the devices: --device /dev/davinci0..7 --device /dev/davinci_manager --device /dev/devmm_svm
#   --device /dev/hisi_hdc -v /usr/local/Ascend/driver:/usr/local/Ascend/driver:ro
#   -v /usr/local/dcmi:/usr/local/dcmi:ro -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro, plus
#   --group-add <GID of the host's HwHiAiUser group> so the non-root user may open them; (4) MINDLOOM_DEVICE=Ascend
#   makes the launcher set HCCL_CONNECT_TIMEOUT from the cluster timeout; choose the NIC with
#   HCCL_SOCKET_IFNAME=<iface>.  Verify on the target that the mindspore wheel from PyPI matches the CANN version.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS train

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
USER 0:0
# iproute2: msrun finds which node is the master with `ip -j addr`; numactl: msrun --bind_numa.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 numactl procps \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 50000 --gid 0 --create-home --home-dir /home/mindloom --shell /bin/bash mindloom \
 && python3 -m venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    MINDLOOM_HOME=/opt/mindloom \
    MINDLOOM_CONFIG=/opt/mindloom/configs/default.yaml \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# No Airflow in this image, so the whole dependency tree is pinned by requirements.lock (used as constraints).
COPY requirements.lock /opt/mindloom/requirements.lock
COPY docker/lock_pins.py docker/data-packages.txt docker/train-packages.txt docker/pip_install.sh /opt/mindloom/docker/
# A CA bundle for pip may come in as the BuildKit secret `pip_ca` (see docker/pip_install.sh).
RUN --mount=type=secret,id=pip_ca \
    python /opt/mindloom/docker/lock_pins.py /opt/mindloom/requirements.lock /opt/mindloom/docker/data-packages.txt > /tmp/pins.txt \
 && python /opt/mindloom/docker/lock_pins.py /opt/mindloom/requirements.lock /opt/mindloom/docker/train-packages.txt >> /tmp/pins.txt \
 && /opt/mindloom/docker/pip_install.sh --constraint /opt/mindloom/requirements.lock --requirement /tmp/pins.txt \
        "PyYAML>=6" "tqdm>=4.60" \
 && rm /tmp/pins.txt

COPY pyproject.toml README.md /opt/mindloom/
COPY pipeline /opt/mindloom/pipeline
COPY operators /opt/mindloom/operators
COPY configs /opt/mindloom/configs
COPY docker/train-entrypoint.sh /opt/mindloom/docker/train-entrypoint.sh
RUN --mount=type=secret,id=pip_ca /opt/mindloom/docker/pip_install.sh --no-deps --editable /opt/mindloom \
 && pip check \
 && python -c "import mindspore, pipeline.train.trainer, pipeline.train.jobs.launcher, shutil; assert shutil.which('msrun')"

USER 50000:0
WORKDIR /home/mindloom
ENTRYPOINT ["/opt/mindloom/docker/train-entrypoint.sh"]
CMD ["--help"]
