"""Test fixtures: an isolated Airflow home (SQLite) set up before Airflow is imported, and small real corpora.

Real text only: slices of ``../shared/corpora`` when present, else the Python standard library's own source and
documentation strings of the running interpreter (present on every machine).

The strict switch (``MINDLOOM_STRICT=1``, set by ``.ci/run``): a test that would skip because a browser, service,
tool or package is missing FAILS instead, so a CI machine where apt or a service fails cannot go green without its
proofs.  Only skips for absent *data* may still skip (:data:`DATA_SKIPS`: ``../shared/corpora``, the demo corpus
and its network sources), since those tests prove nothing the data-free tests do not.  At the end pytest prints one
``proofs:`` line per proof marker (browser, celery, airflow, docker) with its passed/failed/skipped counts.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import sysconfig
import tempfile

import pytest

from pipeline.train.jobs.cpu_dispatch import cpu_dispatch_inline

STRICT = os.environ.get("MINDLOOM_STRICT", "").strip().lower() in ("1", "true", "yes")
#: Skip reasons that stay skips under the strict switch: absent data, not absent machinery (see module docstring).
DATA_SKIPS = ("shared/corpora", "data/demo-corpus not built", "wheel not cached (make corpus)", "PyPI unreachable")
#: The proofs whose counts the summary shows: marker -> what it proves.
PROOFS = {"browser": "the UI walkthrough in headless Chromium", "celery": "Airflow on Celery, Postgres and Redis",
          "airflow": "Airflow's REST API on a real deployment", "docker": "the compose files and Dockerfiles",
          "slurm": "training stages on a real two-node Slurm cluster"}
#: Proofs that must have passed tests (``.ci/run`` names them all): a CI run where one ran no test at all (renamed,
#: deselected, not collected) fails even though nothing failed or skipped.
REQUIRED_PROOFS = [p for p in os.environ.get("MINDLOOM_REQUIRE_PROOFS", "").split(",") if p.strip()]
REPO = pathlib.Path(__file__).resolve().parents[1]
FILE_SECONDS = REPO / "tests" / "fixtures" / "file_seconds.json"
_CONFIG: dict = {}      # the session's config, for pytest_runtest_logreport (which is not given it)
SHARED_CORPORA = REPO.parent / "shared" / "corpora"
#: Environment for an msrun launch that is meant to crash.  When one rank fails, msrun SIGKILLs the others; a killed
#: rank never unregisters, so msrun's scheduler (and msrun with it) only exits once that rank's heartbeats have been
#: missing for ``MS_NODE_TIMEOUT`` seconds (default 30): 30 s of idle wait per crash test, 10 s with this.
MSRUN_CRASH_ENV = {"MS_NODE_TIMEOUT": "10"}
# pytest's timeout (pyproject.toml) counts a module fixture's setup and teardown into the test that runs them.  The
# files whose fixture runs several trainings or a whole deployment get twice that guard: it catches a hang, not a
# slow day of this machine (docs/testing.md, Duration).
LONG_FIXTURE = pytest.mark.timeout(1800)
_HOME = pathlib.Path(os.environ.get("AF_TEST_HOME") or tempfile.mkdtemp(prefix="mindloom_af_test_"))
os.environ.update(
    AIRFLOW_HOME=str(_HOME),
    AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
    AIRFLOW__CORE__LOAD_EXAMPLES="False",
    AIRFLOW__CORE__UNIT_TEST_MODE="True",
    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{_HOME}/airflow.db",
    MINDLOOM_TRAIN_EXECUTOR="",
    MINDLOOM_TESTING_SWITCHES="1",          # the DAGs offer fail_at_step only when the deployment enables it
)
# the in-process trainings' dispatch as a CPU job's own process gets it (trainer._setup_context), whatever MindSpore
# ran in this worker before its first training
cpu_dispatch_inline()


def load_file_module(path: pathlib.Path):
    """The module in ``path`` (a script under scripts/ or docker/, not a package), imported under its file stem."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require(condition: object, why: str) -> None:
    """Skip with ``why`` when ``condition`` is false, or fail under the strict switch: for machinery a proof needs."""
    if not condition:
        if STRICT:
            pytest.fail(f"MINDLOOM_STRICT=1 and {why}", pytrace=False)
        pytest.skip(why)


def _allowed_skip(reason: str) -> bool:
    return any(d in reason for d in DATA_SKIPS)


def _skip_reason(rep) -> str:
    lr = rep.longrepr
    return str(lr[2] if isinstance(lr, tuple) and len(lr) == 3 else lr).removeprefix("Skipped: ")


def pytest_configure(config):
    for name, what in PROOFS.items():
        config.addinivalue_line("markers", f"{name}: proof - {what} (counted; never skips under MINDLOOM_STRICT=1)")
    config._mindloom_proofs = {}
    _CONFIG["config"] = config
    if STRICT:      # a module that may not skip fails as a collection error; the other modules still run
        config.option.continue_on_collection_errors = True


def pytest_collection_modifyitems(session, config, items):
    """Longest test files first (``tests/fixtures/file_seconds.json``: seconds per file from a measured run), each
    file's tests in their own order: xdist's ``--dist loadfile`` (``make test``) hands files to its workers in this
    order, so the long ones do not start last and leave one worker running alone at the end."""
    weights = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    items.sort(key=lambda it: -weights.get(it.nodeid.split("::", 1)[0].rsplit("/", 1)[-1], 0.0))


def _cpu_seconds() -> float:
    """CPU seconds of this process and of every descendant it (or they) waited for: msrun ranks, CLI runs, live
    deployments' components once stopped.  Not a Slurm job's ranks (slurmd's children) nor docker containers."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._mindloom_cpu0 = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown" and hasattr(item, "_mindloom_cpu0"):
        # a ``cpu_s`` property per test case in the JUnit report (module fixtures count in the test that runs
        # them): where the suite's CPU goes, beside pytest's wall-clock ``time`` (scripts/file_seconds.py --cpu)
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item._mindloom_cpu0, 1)))
    rep = (yield).get_result()
    if STRICT and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = _skip_reason(rep)
        if not _allowed_skip(reason):
            rep.outcome = "failed"
            rep.longrepr = f"MINDLOOM_STRICT=1: {item.nodeid} may not skip ({reason})"


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    """Count proof outcomes where the reports end up: in the one process, or in xdist's controller (a worker's
    reports reach it with their keywords, which hold the markers)."""
    config = _CONFIG.get("config")
    if config is None or _is_xdist_worker(config):
        return
    proofs = config._mindloom_proofs
    for name in PROOFS:
        if name in report.keywords:
            seen = proofs.setdefault(name, {})
            if report.failed:
                seen[report.nodeid] = "failed"
            elif report.skipped and seen.get(report.nodeid) != "failed":
                seen[report.nodeid] = "skipped"
            elif report.when == "call" and report.passed:
                seen.setdefault(report.nodeid, "passed")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    rep = (yield).get_result()
    if STRICT and rep.skipped and not _allowed_skip(_skip_reason(rep)):   # a module-level skip
        rep.outcome = "failed"
        rep.longrepr = f"MINDLOOM_STRICT=1: {collector.nodeid} may not skip ({_skip_reason(rep)})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    proofs = getattr(config, "_mindloom_proofs", {})
    if _is_xdist_worker(config) or not (STRICT or proofs):
        return
    tr = terminalreporter
    tr.write_sep("-", f"proofs (MINDLOOM_STRICT={'1' if STRICT else '0'})")
    for name in PROOFS:
        outcomes = list(proofs.get(name, {}).values())
        counts = ", ".join(f"{outcomes.count(k)} {k}" for k in ("passed", "failed", "skipped"))
        tr.write_line(f"proofs: {name} {counts}")
    for name in _missing_proofs(config):
        tr.write_line(f"proofs: FAILED: MINDLOOM_REQUIRE_PROOFS names {name}, and no {name} test passed", red=True)


def _missing_proofs(config) -> list[str]:
    proofs = getattr(config, "_mindloom_proofs", {})
    return [p.strip() for p in REQUIRED_PROOFS if "passed" not in proofs.get(p.strip(), {}).values()]


def pytest_sessionfinish(session, exitstatus):
    if not _is_xdist_worker(session.config) and _missing_proofs(session.config) and exitstatus == 0:
        session.exitstatus = 1
    _stop_leftover_children()


def _stop_leftover_children() -> None:
    """Name and stop the processes the tests left running (a hung worker, a pool worker): they would outlive the
    session and keep whatever reads this run's output waiting."""
    import sys

    import psutil

    own = ("multiprocessing.forkserver import main", "multiprocessing.resource_tracker import main")   # end with us
    me = psutil.Process()

    def command(p) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    left = [p for p in me.children(recursive=True)
            if not (p.ppid() == me.pid and any(o in command(p) for o in own))]
    for p in left:
        try:
            print(f"conftest: a test left pid {p.pid} running ({command(p)[:160]}); stopping it",
                  file=sys.stderr)
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(left, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def stdlib_records(n: int, domain: str = "code") -> list[dict]:
    """Real documents from the interpreter's standard library (sorted, deterministic)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if 2_000 < p.stat().st_size < 60_000)[:n]
    return [{"id": f"stdlib/{p.name}", "text": p.read_text(encoding="utf-8", errors="replace"),
             "source": "cpython-stdlib", "meta": {"path": p.name}} for p in files]


def prose_records(n: int) -> list[dict]:
    """English prose: module docstrings of the standard library (written by CPython's authors, not us)."""
    import ast

    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc and len(doc.split()) >= 80:
            out.append({"id": f"stdlib-doc/{p.name}", "text": doc, "source": "cpython-docstrings"})
        if len(out) >= n:
            break
    return out


def write_jsonl(path: pathlib.Path, records: list[dict]) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def tiny_config(tmp: pathlib.Path, **sections) -> pathlib.Path:
    """A config over two real domains (code, prose), small tokenizer and a 12-step debug model."""
    import yaml

    write_jsonl(tmp / "in" / "code.jsonl", stdlib_records(12))
    prose = prose_records(40)
    write_jsonl(tmp / "in" / "prose.jsonl", prose + prose[:3])   # three exact duplicates
    cfg = {
        "run_name": "test", "seed": 7, "data_root": str(tmp / "data"), "parallelism": 2,   # 4 shards in 2 tasks
        "sources": [{"domain": "code", "paths": [str(tmp / "in" / "code.jsonl")]},
                    {"domain": "prose", "paths": [str(tmp / "in" / "prose.jsonl")]}],
        "ingest": {"docs_per_shard": 20},
        "tokenizer": {"vocab_size": 600, "sample_chars": 200_000},
        "pack": {"seq_len": 32, "shard_num": 2},
        "train": {"steps": 12, "batch_size": 4, "warmup_steps": 2, "checkpoint_every": 4,
                  "model_overrides": {"dim": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
    }
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp / "mindloom.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


@pytest.fixture
def own_assets(airflow_db):
    """For a test that parses the DAGs with its own config: the Assets of that config (``mindloom_corpus`` at
    another data root) become the active ones while it runs, and the active set is restored after it.

    Airflow activates an Asset when it is first created, unless an active one has the same name: without this, the
    first of two configs in one metadata DB keeps the name, and the other one's ``publish`` fails with
    ``AirflowInactiveAssetInInletOrOutletException`` (seen when such a test ran before ``test_dags_e2e.py`` on the
    same xdist worker)."""
    from airflow.models.asset import AssetActive
    from airflow.utils.session import create_session

    with create_session() as s:
        before = [(a.name, a.uri) for a in s.query(AssetActive).all()]
        s.query(AssetActive).delete()
    try:
        yield
    finally:
        with create_session() as s:
            s.query(AssetActive).delete()
            s.add_all([AssetActive(name=name, uri=uri) for name, uri in before])


@pytest.fixture(scope="session")
def airflow_db():  # requested by the tests that touch the metadata DB
    from airflow.utils import db

    db.initdb()


@pytest.fixture(scope="session")
def tiny_config_path(tmp_path_factory) -> pathlib.Path:
    path = tiny_config(tmp_path_factory.mktemp("tiny"))
    os.environ["MINDLOOM_CONFIG"] = str(path)
    return path


@pytest.fixture(scope="session")
def dagbag(tiny_config_path, airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))
