"""The report plugin's security on its FastAPI app, without a browser or an api-server (fastapi's TestClient).

Airflow's own auth dependency runs for real (SimpleAuthManager, JWTs signed by Airflow's signer): anonymous
requests get 401 (a browser page request: the login page), forged or foreign tokens 403, a user without a role
403.  Served reports carry the CSP sandbox; values are escaped; a path outside ``data_root`` (a symlinked report or
run folder) is refused; a corpus run folder is served only to the DAG run that claimed it.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import tiny_config

os.environ.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", "mindloom-plugin-test-secret-" + "k" * 40)   # >= 64 bytes

EVIL = "<img src=x onerror=alert(1)>"


@pytest.fixture
def client(tmp_path, monkeypatch, airflow_db):
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi.testclient import TestClient

    from operators.plugin import app

    monkeypatch.setenv("MINDLOOM_CONFIG", str(tiny_config(tmp_path)))
    # SimpleAuthManager reads its password file at start-up; `make test` exports the deployment's path
    # (.airflow/passwords.json), which a clean clone does not have before `make airflow-init`
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"admin": "admin"}))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    init_auth_manager()
    c = TestClient(app, follow_redirects=False)
    c.data = tmp_path / "data"
    return c


def _token(role: str | None, secret: str | None = None) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    am = get_auth_manager()
    user = SimpleAuthManagerUser(username="admin" if role else "nobody", role=role)
    if secret is None:
        return am.generate_jwt(user)
    import jwt

    claims = jwt.decode(am.generate_jwt(user), options={"verify_signature": False})
    return jwt.encode(claims, secret, algorithm="HS512")


def _auth(role: str | None = "admin") -> dict:
    return {"Authorization": f"Bearer {_token(role)}"}


def _publish(data, run_id: str, dag_id: str = "corpus_build", text: str = "<p>the corpus report</p>"):
    from pipeline.io import claim_run_dir, run_dir

    rdir = run_dir(data, run_id)
    claim_run_dir(rdir, dag_id, run_id)
    (rdir / "report.html").write_text(text, encoding="utf-8")
    return rdir


def _sandboxed(r) -> None:
    csp = r.headers["content-security-policy"]
    assert csp.startswith("sandbox ") and "allow-same-origin" not in csp and "allow-scripts" not in csp
    assert "default-src 'none'" in csp and r.headers["x-content-type-options"] == "nosniff"


def test_anonymous_api_request_gets_401_and_a_page_request_goes_to_the_login(client):
    r = client.get("/reports/corpus_build/r1")
    assert r.status_code == 401 and r.json() == {"detail": "Not authenticated"}
    _sandboxed(r)
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from operators.plugin import MindloomPlugin

    server = FastAPI()                                  # mounted where the api-server mounts it
    mount = MindloomPlugin.fastapi_apps[0]
    server.mount(mount["url_prefix"], mount["app"])
    page = TestClient(server, follow_redirects=False).get(
        "/mindloom/reports/corpus_build/r1?x=1", headers={"Accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 303
    assert page.headers["location"] == "/auth/login?next=%2Fmindloom%2Freports%2Fcorpus_build%2Fr1%3Fx%3D1"


def test_forged_or_foreign_tokens_and_roleless_users_get_403(client):
    _publish(client.data, "r1")
    client.cookies.set("_token", "forged")
    assert client.get("/reports/corpus_build/r1").status_code == 403
    client.cookies.clear()
    foreign = {"Authorization": f"Bearer {_token('admin', secret='not-the-deployments-key-' + 'x' * 48)}"}
    assert client.get("/reports/corpus_build/r1", headers=foreign).status_code == 403
    r = client.get("/reports/corpus_build/r1", headers=_auth(None))
    assert r.status_code == 403 and "the corpus report" not in r.text
    viewer = client.get("/reports/corpus_build/r1", headers=_auth("viewer"))
    assert viewer.status_code == 200 and viewer.text == "<p>the corpus report</p>"


def test_a_report_is_served_sandboxed_with_the_session_cookie(client):
    _publish(client.data, "r1")
    client.cookies.set("_token", _token("admin"))
    r = client.get("/reports/corpus_build/r1")
    assert r.status_code == 200 and r.text == "<p>the corpus report</p>"
    _sandboxed(r)
    assert r.headers["cache-control"] == "no-store"


def test_values_are_escaped_on_the_status_page_of_an_unknown_run(client):
    r = client.get(f"/reports/pretrain/{EVIL}", headers=_auth())
    assert r.status_code == 404
    assert EVIL not in r.text and "&lt;img src=x onerror=alert(1)&gt;" in r.text
    _sandboxed(r)


def test_paths_outside_data_root_and_other_dags_are_refused(client, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.html").write_text("SECRET", encoding="utf-8")
    rdir = _publish(client.data, "linked")
    (rdir / "report.html").unlink()
    (rdir / "report.html").symlink_to(outside / "secret.html")          # a report that is a link out of data_root
    (client.data / "runs" / "folder-link").symlink_to(outside)           # a run folder that is a link
    for run in ("linked", "folder-link"):
        r = client.get(f"/reports/corpus_build/{run}", headers=_auth())
        assert r.status_code == 400 and "SECRET" not in r.text, (run, r.text)
    assert client.get("/reports/corpus_build/..", headers=_auth()).status_code in (400, 404)
    r = client.get("/reports/other_dag/r1", headers=_auth())
    assert r.status_code == 404 and r.json() == {"detail": "no reports for this DAG"}


def test_a_corpus_run_folder_is_served_only_to_the_dag_that_claimed_it(client):
    _publish(client.data, "shared-id", dag_id="corpus_refresh", text="<p>refresh report</p>")
    own = client.get("/reports/corpus_refresh/shared-id", headers=_auth())
    assert own.status_code == 200 and own.text == "<p>refresh report</p>"
    other = client.get("/reports/corpus_build/shared-id", headers=_auth())
    assert other.status_code == 404 and "refresh report" not in other.text
    assert "There is no run shared-id of corpus_build" in other.text
    # the same folder name from another run id (safe_run_id maps ':' to '_') is not that run's report either
    assert "refresh report" not in client.get("/reports/corpus_refresh/shared:id", headers=_auth()).text


def test_a_second_run_cannot_claim_a_folder_another_run_owns(tmp_path):
    from pipeline.io import claim_run_dir, run_owner

    rdir = tmp_path / "runs" / "r1"
    claim_run_dir(rdir, "corpus_build", "r1")
    claim_run_dir(rdir, "corpus_build", "r1")                            # the same run again (a retry): fine
    with pytest.raises(ValueError, match=r"run id 'r1': folder .* already belongs to corpus_build run 'r1'"):
        claim_run_dir(rdir, "corpus_refresh", "r1")
    with pytest.raises(ValueError, match="already belongs to corpus_build run 'r1'"):
        claim_run_dir(rdir, "corpus_build", "r:1")
    assert run_owner(rdir) == {"dag_id": "corpus_build", "run_id": "r1"}


def _trigger_app(detail: str):
    from fastapi import FastAPI, HTTPException
    from fastapi.testclient import TestClient

    from operators.param_errors import OneLineParamErrors

    api = FastAPI()

    @api.post("/api/v2/dags/{dag_id}/dagRuns")
    def trigger(dag_id: str):
        raise HTTPException(400, detail)

    @api.post("/api/v2/dags/{dag_id}/other")
    def other(dag_id: str):
        raise HTTPException(400, detail)

    api.add_middleware(OneLineParamErrors)
    return TestClient(api)


def test_a_bad_corpus_run_is_answered_in_one_line_that_names_the_allowed_characters(tiny_config_path):
    """The 400 text Airflow builds (``Invalid input for param k: <jsonschema error>``) from the real Param schema."""
    from jsonschema import ValidationError, validate

    from operators.params import pretrain_params

    schema = pretrain_params(["main"], retries=1)["corpus_run"].schema
    assert "letters, digits and _ . : + -" in pretrain_params(["main"], retries=1)["corpus_run"].description
    try:
        validate("my corpus/../x", schema)
    except ValidationError as e:
        raw = f"Invalid input for param corpus_run: {e}"
    assert raw.count("\n") > 5 and "Failed validating" in raw             # what the user saw before
    r = _trigger_app(raw).post("/api/v2/dags/pretrain/dagRuns")
    assert r.status_code == 400
    assert r.json()["detail"] == ("Invalid input for param corpus_run: 'my corpus/../x' is not allowed; a run id is "
                                  "1 to 250 characters: letters, digits and _ . : + - (no spaces or slashes), "
                                  "starting with a letter or digit, e.g. manual__2026-11-29T10:00:00+00:00")
    assert int(r.headers["content-length"]) == len(r.content)
    other = "Invalid input for param seq_len: 2 is less than the minimum of 8\n\nFailed validating 'minimum'"
    assert _trigger_app(other).post("/api/v2/dags/x/dagRuns").json()["detail"] == \
        "Invalid input for param seq_len: 2 is less than the minimum of 8"
    assert _trigger_app(other).post("/api/v2/dags/x/other").json()["detail"] == other    # other routes untouched


def test_fail_at_step_says_which_crash_points_resume_at_the_configured_checkpoint_every():
    from operators.params import fail_at_step_description

    text = fail_at_step_description(10)
    assert "every 10 steps" in text and "a crash at step 20 resumes from step 20" in text
    assert "A crash at step 8 restarts the stage from step 0" in text
    assert "restarts" not in fail_at_step_description(2)
