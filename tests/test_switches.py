"""Every ``MINDLOOM_*`` environment variable that the code, scripts, Makefile, CI or container files name is declared
once in ``pipeline/switches.py`` (and so in docs/configuration.md), and every declared one is named somewhere."""

from __future__ import annotations

import re

from tests.conftest import REPO

NAME = re.compile(r"MINDLOOM_[A-Z0-9_]*[A-Z0-9]")
WHERE = ("pipeline", "operators", "dags", "scripts", "benchmarks", "tests", "docker", ".ci")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".env", ".txt", ""}
#: a name the Slurm test makes up to prove that the worker's variables do not reach the ranks
NOT_SWITCHES = {"MINDLOOM_TEST__TOKEN"}


def _named() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    files = [REPO / "Makefile"] + [p for d in WHERE for p in (REPO / d).rglob("*")
                                   if p.is_file() and (p.suffix in SUFFIXES or p.name.endswith("Dockerfile"))
                                   and "__pycache__" not in p.parts and p.name != "switches.py"]
    for path in files:
        for name in NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
            out.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return out


def test_every_variable_is_declared_once_and_used():
    from pipeline.switches import SWITCHES

    names = [s.name for s in SWITCHES]
    assert len(names) == len(set(names))
    named = _named()
    undeclared = {n: sorted(w)[:3] for n, w in named.items() if n not in names and n not in NOT_SWITCHES}
    assert not undeclared, f"declare these in pipeline/switches.py: {undeclared}"
    unused = [n for n in names if n not in named]
    assert not unused, f"declared but named nowhere: {unused}"
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert all(f"| `{n}` |" in page for n in names)
