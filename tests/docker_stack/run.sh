#!/usr/bin/env bash
# `make test-docker`: build the images on a Debian base made here, run the compose stack (Postgres, Redis,
# api-server, scheduler, dag-processor, triggerer, two Celery workers) on loopback, run corpus_build and the
# Asset-triggered pretrain to success, tear everything down.  Skips (exit 0, one line) where dockerd cannot run.
# State lives in .cache/docker-stack/ (dockerd data-root = image and build cache, so reruns only rebuild what
# changed); MINDLOOM_DOCKER_FRESH=1 drops it first.  Under MINDLOOM_STRICT=1 (.ci/run) a skip is a failure (exit 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
T0=$(date +%s)
STATE=$REPO/.cache/docker-stack
PY=$REPO/.venv/bin/python
skip() {
  if [ "${MINDLOOM_STRICT:-0}" = 1 ]; then echo "test-docker: FAILED (MINDLOOM_STRICT=1, may not skip): $*"; exit 1; fi
  echo "test-docker: SKIPPED: $*"; echo "proofs: docker-stack 0 passed, 0 failed, 1 skipped"; exit 0
}
say() { echo "== test-docker [$(( $(date +%s) - T0 )) s] $*"; }

# -- tools: Debian's docker.io (its CLI does BuildKit builds without the buildx plugin), mmdebstrap, compose v1
[ "$(id -u)" = 0 ] || skip "not root, so no private dockerd can run here"
missing_tool=""          # `command -v a b c` succeeds when any one is found: check each
for t in dockerd mmdebstrap docker-compose; do command -v "$t" >/dev/null || missing_tool="$missing_tool $t"; done
if ! [ -x /usr/bin/docker ] || [ -n "$missing_tool" ]; then
  command -v apt-get >/dev/null || skip "docker.io/mmdebstrap missing and no apt-get to install them"
  say "installing docker.io mmdebstrap docker-compose (apt)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io mmdebstrap docker-compose) \
    > "$REPO/.apt-docker.log" 2>&1 || skip "apt-get install docker.io mmdebstrap failed: $(tail -1 .apt-docker.log)"
fi
DOCKER=/usr/bin/docker
[ "${MINDLOOM_DOCKER_FRESH:-0}" = 1 ] && rm -rf "$STATE"
mkdir -p "$STATE/logs"
export DOCKER_HOST=unix://$STATE/docker.sock DOCKER_BUILDKIT=1
why=$(tests/docker_stack/dockerd.sh start "$STATE") || skip "dockerd cannot start: $why"
say "private dockerd up ($DOCKER_HOST, no bridge, no iptables)"

STACK_DIR=$(mktemp -d "$STATE/stack.XXXX")
PROJECT=mindloom-stack
# The base file + the test override, rendered once into one model without host-network `ports:`.
compose() { docker-compose -p "$PROJECT" -f "$STACK_DIR/compose.yaml" "$@"; }
teardown() {
  rc=$?
  if [ -f "$STACK_DIR/compose.yaml" ]; then
    [ $rc = 0 ] || compose logs --no-color --tail 80 > "$STATE/logs/compose-failure.log" 2>&1 || true
    compose down --volumes --remove-orphans --timeout 20 > "$STATE/logs/down.log" 2>&1 || true
  fi
  # Anything left from a crashed earlier run of this project (containers, networks, volumes).
  $DOCKER ps -aq | xargs -r $DOCKER rm -f > /dev/null 2>&1 || true
  $DOCKER volume prune -f > /dev/null 2>&1 || true
  tests/docker_stack/dockerd.sh stop "$STATE" || true
  rm -rf "$STACK_DIR"
  [ $rc = 0 ] || { echo "test-docker: FAILED (logs: $STATE/logs/)"; echo "proofs: docker-stack 0 passed, 1 failed, 0 skipped"; }
  echo "test-docker: wall time $(( $(date +%s) - T0 )) s"
}
trap teardown EXIT
trap "exit 143" INT TERM HUP   # so a killed run still tears down

# -- images ------------------------------------------------------------------------------------------------------
BASE=mindloom/bookworm-base:12
say "base image $BASE (mmdebstrap, cached in .cache/docker-base/)"
docker/local-base/build.sh "$REPO/.cache/docker-base" "$BASE"
build() {  # build NAME DOCKERFILE [TARGET]: timed, log in $STATE/logs/NAME.log
  local t=$(date +%s) target=${3:+--target $3}
  # The machine's CA bundle (pip's `cert`) reaches pip as a BuildKit secret; PyPI via the host network.
  nice -n 10 $DOCKER build --network host --progress plain \
    --secret "id=pip_ca,src=$("$PY" -m pip config get global.cert 2>/dev/null || echo /etc/ssl/certs/ca-certificates.crt)" \
    --build-arg "BASE_IMAGE=$BASE" -f "docker/$2" $target -t "$1" . > "$STATE/logs/${1//[:\/]/_}.log" 2>&1 \
    || { tail -30 "$STATE/logs/${1//[:\/]/_}.log"; exit 1; }
  say "built $1 in $(( $(date +%s) - t )) s, $($DOCKER image inspect -f '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}')"
}
build mindloom-airflow:test airflow.Dockerfile airflow
build mindloom-airflow-train:test airflow.Dockerfile airflow-train
build mindloom-train:test train.Dockerfile
say "smoke: airflow version + import mindspore (no network)"
$DOCKER run --rm --network none mindloom-airflow-train:test bash -c \
  'airflow version && python -c "import mindspore; print(\"mindspore\", mindspore.__version__)"'
$DOCKER run --rm --network none mindloom-train:test --help > /dev/null

# -- stack -------------------------------------------------------------------------------------------------------
mkdir -p "$STACK_DIR/data/train"
"$PY" tests/docker_stack/drive.py config "$STACK_DIR/data" /opt/mindloom/data
chown -R 50000:0 "$STACK_DIR/data"
read -r PG REDIS API HEALTH < <("$PY" -c 'import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
ADMIN_PW=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(18))')
"$PY" - "$STACK_DIR/stack.env" <<PYEOF
import base64, os, secrets, sys
v = {"AIRFLOW_JWT_SECRET": secrets.token_urlsafe(64), "AIRFLOW_API_SECRET_KEY": secrets.token_urlsafe(32),
     "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
     "POSTGRES_PASSWORD": secrets.token_hex(16), "REDIS_PASSWORD": secrets.token_hex(16),
     "AIRFLOW_ADMIN_PASSWORD": "$ADMIN_PW", "STACK_DIR": "$STACK_DIR", "MINDLOOM_BASE_IMAGE": "$BASE",
     "MINDLOOM_AIRFLOW_IMAGE": "mindloom-airflow:test", "MINDLOOM_AIRFLOW_TRAIN_IMAGE": "mindloom-airflow-train:test",
     "STACK_PG_PORT": "$PG", "STACK_REDIS_PORT": "$REDIS", "STACK_API_PORT": "$API", "STACK_HEALTH_PORT": "$HEALTH"}
open(sys.argv[1], "w").write("".join(f"{k}={x}\n" for k, x in v.items()))
PYEOF
docker-compose --env-file "$STACK_DIR/stack.env" -f docker/docker-compose.yaml -f docker/compose.test.yaml config \
  | "$PY" tests/docker_stack/drive.py host-ports > "$STACK_DIR/compose.yaml"
say "compose up (api on 127.0.0.1:$API, postgres :$PG, redis :$REDIS)"
compose up -d --no-build > "$STATE/logs/up.log" 2>&1 || { cat "$STATE/logs/up.log"; exit 1; }
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$API/api/v2/version" > /dev/null && break
  sleep 3
done
say "stack up; running corpus_build then the Asset-triggered pretrain"
"$PY" tests/docker_stack/drive.py run "http://127.0.0.1:$API" "$ADMIN_PW"
say "stack run passed; tearing down"
echo "proofs: docker-stack 1 passed, 0 failed, 0 skipped"
