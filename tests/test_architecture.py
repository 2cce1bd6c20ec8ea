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


# --------------------------------------------------------------------------------------------------------------
# No import circles: a module that needs another one's names sits above it, never beside it in a loop.

CIRCLE_ROOTS = ("pipeline", "operators", "dags", "benchmarks")
FLAT_ROOTS = ("benchmarks",)  # scripts that put their own folder on sys.path and import each other by bare name


def _modules() -> dict[str, Path]:
    mods = {}
    for root in CIRCLE_ROOTS:
        for p in sorted((REPO / root).rglob("*.py")):
            rel = p.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts)
            mods[name.removesuffix(".__init__")] = p
    return mods


def _import_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> project modules it imports (absolute, relative, and bare names inside a flat script folder)."""
    out: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        flat = mod.split(".")[0] if mod.split(".")[0] in FLAT_ROOTS else None
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                # ``from pkg import sub`` depends on the submodule; a package is loaded before its submodules anyway
                subs = [f"{base}.{a.name}" for a in node.names]
                names = [n for n in subs if n in mods] if all(n in mods for n in subs) else [base, *subs]
            else:
                continue
            for name in names:
                for target in (name, f"{flat}.{name}" if flat else None):
                    if target in mods and target != mod:
                        out[mod].add(target)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_circles():
    circles = _circles(_import_edges(_modules()))
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_circle_check_sees_relative_and_flat_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    edges = _import_edges(_modules())
    assert "pipeline.train.config" in edges["pipeline.train.job"]  # from .config import ModelConfig
    assert "benchmarks.common" in edges["benchmarks.run_all"]  # import common (benchmarks/ on sys.path)
