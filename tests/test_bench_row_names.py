"""The metric rows of ``benchmarks/results.json`` keep their names (issue 35).

``tests/fixtures/bench_row_names.txt`` froze the names of every row results.json held when the benchmark harness
became one package (one runner, one results writer, one report).  A refactor of the harness, or a re-run of a
topic, may add rows but must not rename or drop one: readers of results.json, BENCHMARKS.md and the README block
find figures by these names.  Every frozen name must also still belong to a topic the harness can produce.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import run_all  # noqa: E402

FROZEN = REPO / "tests" / "fixtures" / "bench_row_names.txt"
RESULTS = REPO / "benchmarks" / "results.json"
HOW_TO_UPDATE = (
    "If the rename or removal is intended, update tests/fixtures/bench_row_names.txt in the same commit, e.g.\n"
    "  .venv/bin/python -c \"import json; r = json.load(open('benchmarks/results.json')); "
    "print(*sorted(m['name'] for m in r['metrics']), sep='\\n')\" > tests/fixtures/bench_row_names.txt\n"
    "and say in the commit message which rows were renamed or dropped and why.")


def _frozen() -> list[str]:
    return [ln.strip() for ln in FROZEN.read_text(encoding="utf-8").splitlines() if ln.strip()]


def test_frozen_names_are_sorted_and_unique():
    names = _frozen()
    assert names, f"{FROZEN} is empty"
    assert names == sorted(set(names)), f"{FROZEN}: keep one name per line, sorted, no repeats"


def test_every_frozen_row_is_still_in_results_json():
    current = {m["name"] for m in json.loads(RESULTS.read_text(encoding="utf-8"))["metrics"]}
    missing = [n for n in _frozen() if n not in current]
    assert not missing, (f"{len(missing)} metric row(s) of {FROZEN.name} are no longer in benchmarks/results.json "
                         f"(renamed or dropped): {missing}\n{HOW_TO_UPDATE}")


def test_every_frozen_row_belongs_to_a_topic_the_harness_still_produces():
    producible = set(run_all.TOPIC_ORDER) | set(run_all.OPT_IN) | {"ablation"}   # ablation: make ablation
    orphans = [n for n in _frozen() if n.split(".", 1)[0] not in producible]
    assert not orphans, (f"rows whose topic no run_all topic, opt-in topic or the ablation produces any more: "
                         f"{orphans}\n{HOW_TO_UPDATE}")
