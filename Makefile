# mindloom: `make demo` and `make test` each set up everything they need from a clean clone.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)

# Airflow on the embedded default: SQLite metadata DB, LocalExecutor, home inside the repo, login admin/admin.
# The venv's bin comes first on PATH: `airflow standalone` starts its components by the bare name `airflow`, and
# msrun starts ranks with the `python` on PATH.  MINDLOOM_AIRFLOW_HOME / MINDLOOM_AIRFLOW_PORT move the deployment
# (the walkthrough test runs `make airflow` in a throw-away home on a free port).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
MINDLOOM_AIRFLOW_HOME ?= $(CURDIR)/.airflow
MINDLOOM_AIRFLOW_PORT ?= 8080
export AIRFLOW_HOME := $(MINDLOOM_AIRFLOW_HOME)
export AIRFLOW__API__PORT := $(MINDLOOM_AIRFLOW_PORT)
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL := http://127.0.0.1:$(MINDLOOM_AIRFLOW_PORT)/execution/
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__EXECUTOR := LocalExecutor
export AIRFLOW__CORE__PARALLELISM := 4
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS := admin:admin
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE := $(AIRFLOW_HOME)/passwords.json
export AIRFLOW__API__HOST := 127.0.0.1
export MINDLOOM_CONFIG ?= $(CURDIR)/configs/default.yaml
export MINDLOOM_TRAIN_EXECUTOR :=
export PYTHONUNBUFFERED := 1
# fewer glibc malloc arenas: a process running many tasks keeps less of their freed heap (docker/airflow.env)
export MALLOC_ARENA_MAX := 2

.PHONY: setup demo test test-fast test-docker lint corpus airflow-init airflow system-deps screenshots clean slurm slurm-stop

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-*; touch $@

corpus: data/demo-corpus/.built

data/demo-corpus/.built: $(STAMP) pipeline/democorpus.py
	$(PY) -m pipeline.democorpus --out data/demo-corpus --cache .cache/demo-sources
	@touch $@

airflow-init: $(AIRFLOW_HOME)/airflow.db

$(AIRFLOW_HOME)/airflow.db: $(STAMP)
	@mkdir -p $(AIRFLOW_HOME)
	@test -f $(AIRFLOW_HOME)/passwords.json || echo '{"admin": "admin"}' > $(AIRFLOW_HOME)/passwords.json
	$(VENV)/bin/airflow db migrate > $(AIRFLOW_HOME)/db_migrate.log 2>&1 || (tail -20 $(AIRFLOW_HOME)/db_migrate.log; exit 1)

# `dags test pretrain` does not consume the Asset event the corpus publish queued for pretrain: the demo clears it,
# so a later `make airflow` starts no second training run (scripts/clear_asset_queue.py).
demo: $(STAMP) corpus airflow-init
	@start=$$(date +%s); \
	echo "== corpus_build through Airflow =="; \
	$(VENV)/bin/airflow dags test corpus_build > $(AIRFLOW_HOME)/demo_corpus_build.log 2>&1 \
	  || { tail -40 $(AIRFLOW_HOME)/demo_corpus_build.log; exit 1; }; \
	echo "== pretrain through Airflow =="; \
	$(VENV)/bin/airflow dags test pretrain > $(AIRFLOW_HOME)/demo_pretrain.log 2>&1 \
	  || { tail -40 $(AIRFLOW_HOME)/demo_pretrain.log; exit 1; }; \
	$(PY) scripts/clear_asset_queue.py pretrain; \
	echo; $(VENV)/bin/mindloom summary; \
	echo; echo "Airflow logs: $(AIRFLOW_HOME)/demo_corpus_build.log $(AIRFLOW_HOME)/demo_pretrain.log"; \
	echo "demo took $$(( $$(date +%s) - start )) s (after setup)"

# Debian packages some tests drive: headless Chromium (browser test), docker-compose (compose-file validation),
# PostgreSQL and Redis servers (Celery live test; initdb may already be on PATH from the machine image, Debian keeps
# it in /usr/lib/postgresql/<v>/bin), Slurm and munge (the Slurm backend test starts a two-node cluster on loopback
# with scripts/slurm_local.py and stops it again).  Installed when missing and we are root with apt.  A failed apt install always
# fails this target (exit 1, with the end of .apt-install.log); so does a missing package that cannot be installed
# (not root / no apt) under MINDLOOM_STRICT=1 (.ci/run), where the tests needing it would fail anyway.  Without the
# switch that case prints a WARNING naming the packages, and those tests skip and say why.
system-deps:
	@pkgs=""; \
	command -v chromium >/dev/null || pkgs="$$pkgs chromium"; \
	command -v docker-compose >/dev/null || pkgs="$$pkgs docker-compose"; \
	{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } || pkgs="$$pkgs postgresql"; \
	command -v redis-server >/dev/null || pkgs="$$pkgs redis-server"; \
	{ command -v sbatch >/dev/null && test -x /usr/sbin/slurmctld && test -x /usr/sbin/munged; } || pkgs="$$pkgs slurm-wlm munge"; \
	if [ -z "$$pkgs" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing$$pkgs (apt)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs) > .apt-install.log 2>&1 \
	    || { echo "system-deps: FAILED: apt-get install$$pkgs failed, see .apt-install.log:" >&2; \
	         tail -5 .apt-install.log >&2; exit 1; }; \
	elif [ "$${MINDLOOM_STRICT:-0}" = 1 ]; then \
	  echo "system-deps: FAILED: missing$$pkgs and cannot install them (needs root and apt-get)" >&2; exit 1; \
	else \
	  echo "system-deps: WARNING: missing$$pkgs (needs root and apt-get to install); the tests that need them skip" >&2; \
	fi

# The UI at http://127.0.0.1:8080 (login admin/admin): api-server, scheduler, dag-processor, triggerer.  The demo
# corpus is built first when the deployment uses the default config.  scripts/airflow_ready.py waits until every
# component is healthy, unpauses pretrain (so the first corpus publish starts it) and prints the URL and login.
airflow: $(STAMP) airflow-init
	@if [ "$(MINDLOOM_CONFIG)" = "$(CURDIR)/configs/default.yaml" ]; then $(MAKE) --no-print-directory corpus; fi
	@$(PY) scripts/airflow_ready.py --port $(MINDLOOM_AIRFLOW_PORT) --watch-pid $$$$ & \
	exec $(VENV)/bin/airflow standalone

# A two-node Slurm cluster on loopback (node1, node2; state under /tmp/mindloom-slurm): for train.backend slurm by
# hand, `export SLURM_CONF=/tmp/mindloom-slurm/slurm.conf` after it.
slurm: system-deps
	$(PYTHON) scripts/slurm_local.py start

slurm-stop:
	$(PYTHON) scripts/slurm_local.py stop

screenshots: $(STAMP) system-deps corpus
	$(PY) scripts/screenshots.py docs/screenshots
	MINDLOOM_SCREENSHOTS=$(CURDIR)/docs/screenshots $(PY) -m pytest -q tests/test_ui_walkthrough.py

# Test files run on TEST_WORKERS pytest-xdist workers, a whole file per worker (module fixtures are shared within a
# file), the longest files first (tests/fixtures/file_seconds.json; --no-loadscope-reorder keeps that order, xdist
# would otherwise start the files with the most tests first); TEST_WORKERS=0 runs them in this process.  Three workers
# on two cores: much of the suite waits (msrun cluster start and shutdown, live deployments' loops, the browser), and
# two workers left the cores 18 % idle (docs/testing.md).
# PYTEST_ARGS: more pytest options (--junitxml=... gives every test's time).
TEST_WORKERS ?= 3
test: $(STAMP) system-deps
	$(PY) -m pytest -q --durations=40 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The images built on a Debian base made here (no Docker Hub), the compose stack (Postgres, Redis, Airflow, Celery
# workers) run on loopback through corpus_build and the Asset-triggered pretrain, then torn down.  Needs root (a
# private dockerd; installs docker.io and mmdebstrap with apt); otherwise one line says why it skipped.
test-docker: $(STAMP)
	tests/docker_stack/run.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check pipeline operators dags tests benchmarks
	$(VENV)/bin/ruff check --select AIR dags operators

# Benchmarks against the peers (datatrove, rensa, datasketch, PyTorch CPU, each installed in its own venv under
# .cache/bench-venvs/ when missing): every topic one after the other, then benchmarks/results.json and BENCHMARKS.md.
.PHONY: bench ablation bench-scale
bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# Issue 13: corpus_build through `airflow dags test` on corpora of SCALE_SIZES GB recombined from ../shared/corpora
# (built under .cache/bench-scale/), datatrove on the smallest; then results.json, BENCHMARKS.md (topic `scale`).
# Hours at 1,4 on a small machine; a 30 MB try: .venv/bin/python benchmarks/bench_scale.py --quick
SCALE_SIZES ?= 1,4
bench-scale: $(STAMP)
	$(PY) benchmarks/bench_scale.py --sizes $(SCALE_SIZES)
	$(PY) benchmarks/run_all.py --refresh scale

# The ablation DAG's steps (mindloom ablation) over configs/ablation.yaml (the 7-domain sample beside the repo): raw vs
# shipped, 4 seeds, the A/A pair and the positive control, 16 proxy runs (about an hour on 2 cores); a rerun
# resumes. Its report becomes benchmarks/results/ablation.json, then the README table and BENCHMARKS.md.
ablation: $(STAMP)
	$(PY) benchmarks/ablation.py
	$(PY) benchmarks/run_all.py --refresh ablation

clean:
	rm -rf data .airflow .pytest_cache
