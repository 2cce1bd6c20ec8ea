"""Standing rules of the layout: the library stays free of Airflow; DAG files stay light to parse."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = {"mindspore", "sentencepiece", "datasketch", "pyarrow", "numpy"}


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, top-level module, at module level?) for every import in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0], id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module.split(".")[0], id(node) in top_level))
    return out


def test_pipeline_never_imports_airflow():
    offenders = [f"{p.relative_to(REPO)}:{line}" for p in sorted((REPO / "pipeline").rglob("*.py"))
                 for line, mod, _ in _imports(p) if mod == "airflow"]
    assert offenders == [], f"pipeline/ must not import airflow: {offenders}"


def test_pipeline_imports_mindspore_lazily():
    offenders = [f"{p.relative_to(REPO)}:{line}" for p in sorted((REPO / "pipeline").rglob("*.py"))
                 for line, mod, top in _imports(p) if mod == "mindspore" and top]
    # The trainer's model/step modules run only inside the training process, where MindSpore is the point.
    allowed = ("pipeline/train/",)
    assert [o for o in offenders if not o.startswith(allowed)] == []


def test_dag_files_have_no_heavy_top_level_imports():
    offenders = [f"{p.name}:{line} {mod}" for p in sorted((REPO / "dags").glob("*.py"))
                 for line, mod, top in _imports(p) if top and mod in HEAVY]
    assert offenders == []
