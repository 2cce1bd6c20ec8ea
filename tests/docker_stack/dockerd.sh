#!/usr/bin/env bash
# Private Docker daemon for the stack test: own socket, data-root and pid file under $STATE, no bridge and no
# iptables rules, so nothing on the host network changes and containers can only use host networking (bound to
# 127.0.0.1 by the test) or none.  Usage: dockerd.sh start|stop STATE_DIR.  `start` prints nothing on success and
# exits 3 with one line on why when the daemon cannot run here (the caller turns that into a skip).
set -euo pipefail
cmd=$1 state=$(realpath -m "$2")
sock=$state/docker.sock pid=$state/dockerd.pid
# The data-root holds the image layers and the build cache; it survives `stop` so reruns reuse them.
data=${MINDLOOM_DOCKER_DATA:-$state/data}

case $cmd in
start)
  [ "$(id -u)" = 0 ] || { echo "not root: a private dockerd needs root"; exit 3; }
  command -v dockerd >/dev/null || { echo "dockerd not installed (apt-get install -y docker.io failed)"; exit 3; }
  # A daemon left by a killed earlier run on this state: reuse it (run.sh removes every container it holds).
  if [ -f "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null && docker -H "unix://$sock" info >/dev/null 2>&1; then
    exit 0
  fi
  mkdir -p "$state/exec" "$data"
  # Short exec-root path: containerd's socket path must stay under 108 bytes.
  exec_root=/run/mindloom-dockerd-$(echo "$state" | sha1sum | cut -c1-8)
  setsid dockerd --data-root "$data" --exec-root "$exec_root" --pidfile "$pid" --host "unix://$sock" \
    --bridge=none --iptables=false --ip6tables=false --storage-driver overlay2 \
    > "$state/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do
    docker -H "unix://$sock" info >/dev/null 2>&1 && exit 0
    sleep 1
  done
  echo "dockerd did not answer within 60 s: $(tail -1 "$state/dockerd.log")"
  [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  exit 3
  ;;
stop)
  [ -f "$pid" ] || exit 0
  p=$(cat "$pid")
  kill "$p" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 1; done
  kill -9 "$p" 2>/dev/null || true
  rm -f "$pid"
  ;;
esac
