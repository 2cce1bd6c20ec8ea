"""The strict switch of ``.ci/run``: under ``MINDLOOM_STRICT=1`` a skip for missing machinery fails, a skip for
absent data stays a skip, and the summary counts each proof marker.  Runs pytest on a probe file in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PROBE = '''
import pytest
from conftest import require

def test_tool_missing():
    require(False, "chromium not installed")

def test_data_absent():
    pytest.skip("../shared/corpora is absent")

def test_package_missing():
    pytest.importorskip("no_such_module_mindloom")

@pytest.mark.browser
def test_a_browser_proof():
    assert True

@pytest.mark.celery
@pytest.mark.skipif(True, reason="redis-server not found")
def test_a_celery_proof():
    pass
'''


def _run(tmp_path: Path, strict: bool, body: str = PROBE, require: str = "",
         workers: int = 0) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "MINDLOOM_STRICT": "1" if strict else "0", "MINDLOOM_REQUIRE_PROOFS": require}
    files = sorted(str(p) for p in tmp_path.glob("test_*.py"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-rA", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, *files,
                           *(["-n", str(workers), "--dist", "loadfile"] if workers else [])],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def _counts(out: str) -> dict[str, int]:
    last = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)][-1]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}


def test_strict_switch_fails_machinery_skips_but_not_data_skips(tmp_path):
    res = _run(tmp_path, strict=True)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert _counts(out) == {"passed": 1, "failed": 2, "skipped": 1, "error": 1}, out
    assert "MINDLOOM_STRICT=1 and chromium not installed" in out
    assert "test_package_missing may not skip" in out and "test_a_celery_proof may not skip" in out
    assert "proofs: browser 1 passed, 0 failed, 0 skipped" in out
    assert "proofs: celery 0 passed, 1 failed, 0 skipped" in out


def test_without_the_switch_missing_machinery_skips_and_is_counted(tmp_path):
    res = _run(tmp_path, strict=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert _counts(out) == {"passed": 1, "skipped": 4}, out
    assert "proofs: celery 0 passed, 0 failed, 1 skipped" in out


def test_strict_switch_fails_a_module_level_skip(tmp_path):
    body = 'import pytest\npytest.skip("postgres not found", allow_module_level=True)\n\ndef test_x():\n    pass\n'
    (tmp_path / "test_other.py").write_text("def test_still_runs():\n    pass\n")
    res = _run(tmp_path, strict=True, body=body)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "may not skip (postgres not found)" in out
    assert "test_still_runs PASSED" in out or "PASSED test_other.py::test_still_runs" in out, out   # not aborted
    assert _run(tmp_path, strict=False, body=body).returncode in (0, 5)


def test_a_required_proof_that_ran_no_test_fails_the_run(tmp_path):
    body = "import pytest\n\n@pytest.mark.browser\ndef test_b():\n    pass\n"
    assert _run(tmp_path, strict=True, body=body, require="browser").returncode == 0
    res = _run(tmp_path, strict=True, body=body, require="browser,celery")
    assert res.returncode == 1
    assert "proofs: FAILED: MINDLOOM_REQUIRE_PROOFS names celery, and no celery test passed" in res.stdout


def test_proofs_are_counted_across_xdist_workers(tmp_path):
    """``make test`` runs on xdist workers: the proof lines and the required-proof check come from the controller,
    which sees every worker's reports."""
    (tmp_path / "test_second.py").write_text("import pytest\n\n@pytest.mark.browser\ndef test_c():\n    pass\n")
    res = _run(tmp_path, strict=True, workers=2, require="browser")
    out = res.stdout + res.stderr
    assert res.returncode == 1, out                        # the probe's machinery skips fail under the switch
    assert "proofs: browser 2 passed, 0 failed, 0 skipped" in out, out
    assert "proofs: celery 0 passed, 1 failed, 0 skipped" in out, out
    (tmp_path / "test_probe.py").unlink()
    body = "import pytest\n\n@pytest.mark.browser\ndef test_b():\n    pass\n"
    assert _run(tmp_path, strict=True, body=body, workers=2, require="browser").returncode == 0
    res = _run(tmp_path, strict=True, body=body, workers=2, require="browser,celery")
    assert res.returncode == 1
    assert "proofs: FAILED: MINDLOOM_REQUIRE_PROOFS names celery, and no celery test passed" in res.stdout
