"""Test fixtures: an isolated Airflow home (SQLite) set up before Airflow is imported, and small real corpora.

Real text only: slices of ``../shared/corpora`` when present, else the Python standard library's own source and
documentation strings of the running interpreter (present on every machine).
"""

from __future__ import annotations

import json
import os
import pathlib
import sysconfig
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_CORPORA = REPO.parent / "shared" / "corpora"
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
