"""One-shot init of the compose stack: refuse weak or missing secrets, migrate the metadata DB, create the admin.

Runs in the ``airflow-init`` service before every other Airflow service starts (they wait for it to exit 0).  Why a
check here: a short JWT secret only produces a warning in Airflow, and a secret that differs between containers
shows up much later as every task failing with 401/403 from the Execution API.  Messages name the ``.env`` variable
to fix.  The admin password comes only from ``AIRFLOW_ADMIN_PASSWORD`` (init's environment, no other service's).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
import sys
from pathlib import Path

# Airflow setting -> (.env variable, minimum bytes)
SECRETS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": ("AIRFLOW_JWT_SECRET", 64),
    "AIRFLOW__API__SECRET_KEY": ("AIRFLOW_API_SECRET_KEY", 32),
}
FERNET = ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW_FERNET_KEY")
SIMPLE = "SimpleAuthManager"
FAB = "FabAuthManager"
GENERATE = {
    "AIRFLOW_JWT_SECRET": "python3 -c 'import secrets; print(secrets.token_urlsafe(64))'",
    "AIRFLOW_API_SECRET_KEY": "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'",
    "AIRFLOW_FERNET_KEY": "python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'",
    "AIRFLOW_ADMIN_PASSWORD": "python3 -c 'import secrets; print(secrets.token_urlsafe(18))'",
}


def check_secrets(env: dict[str, str]) -> list[str]:
    """Problems with the secrets in ``env`` (empty list: all good)."""
    problems = []
    for setting, (var, min_bytes) in SECRETS.items():
        value = env.get(setting, "")
        if len(value.encode()) < min_bytes:
            problems.append(f"{var}: must be at least {min_bytes} bytes (got {len(value.encode())}); "
                            f"generate one with: {GENERATE[var]}")
    setting, var = FERNET
    try:
        if len(base64.urlsafe_b64decode(env.get(setting, "").encode())) != 32:
            raise ValueError
    except (ValueError, binascii.Error):
        problems.append(f"{var}: must be a Fernet key (url-safe base64 of 32 bytes); generate one with: "
                        f"{GENERATE[var]}")
    if env.get("AIRFLOW__API_AUTH__JWT_SECRET") and env.get("AIRFLOW__API_AUTH__JWT_SECRET") == env.get(
            "AIRFLOW__API__SECRET_KEY"):
        problems.append("AIRFLOW_API_SECRET_KEY: must differ from AIRFLOW_JWT_SECRET")
    auth = env.get("AIRFLOW__CORE__AUTH_MANAGER", "")
    if (SIMPLE in auth or FAB in auth) and len(env.get("AIRFLOW_ADMIN_PASSWORD", "")) < 12:
        problems.append(f"AIRFLOW_ADMIN_PASSWORD: must be at least 12 characters; generate one with: "
                        f"{GENERATE['AIRFLOW_ADMIN_PASSWORD']}")
    return problems


def write_simple_passwords(path: str | Path, user: str, password: str) -> Path:
    """SimpleAuthManager's password file ({"user": "password"}), readable by the owner and group 0 only."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({user: password}, fh)
    os.replace(tmp, path)
    return path


def _run(argv: list[str]) -> None:
    shown = ["***" if i and argv[i - 1] == "--password" else a for i, a in enumerate(argv)]
    print("+", " ".join(shown), flush=True)
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ if env is None else env)
    problems = check_secrets(env)
    if problems:
        for p in problems:
            print(f"airflow-init: error: {p}", file=sys.stderr)
        print("airflow-init: fix docker/.env (see docker/.env.example) and run `docker compose up` again",
              file=sys.stderr)
        return 2
    try:
        _setup_database_and_users(env)
    except subprocess.CalledProcessError as e:
        shown = " ".join("***" if i and e.cmd[i - 1] == "--password" else a for i, a in enumerate(e.cmd))
        print(f"airflow-init: error: `{shown}` exited with {e.returncode} (its output is above)", file=sys.stderr)
        return 1
    print("airflow-init: done", flush=True)
    return 0


def _setup_database_and_users(env: dict[str, str]) -> None:
    _run(["airflow", "db", "migrate"])
    auth, user = env.get("AIRFLOW__CORE__AUTH_MANAGER", ""), env.get("AIRFLOW_ADMIN_USER", "admin")
    if FAB in auth:
        listed = subprocess.run(["airflow", "users", "list", "--output", "json"], capture_output=True, text=True,
                                check=True, stdin=subprocess.DEVNULL).stdout
        if user not in {u.get("username") for u in json.loads(listed or "[]")}:
            _run(["airflow", "users", "create", "--username", user, "--password", env["AIRFLOW_ADMIN_PASSWORD"],
                  "--role", "Admin", "--firstname", user, "--lastname", "admin", "--email", f"{user}@localhost"])
    elif SIMPLE in auth:
        path = write_simple_passwords(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"], user,
                                      env["AIRFLOW_ADMIN_PASSWORD"])
        print(f"airflow-init: SimpleAuthManager password file {path} written for user {user!r}", flush=True)
    else:
        print(f"airflow-init: auth manager {auth!r}: create users with its own tools", flush=True)


if __name__ == "__main__":
    sys.exit(main())
