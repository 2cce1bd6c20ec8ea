"""The benchmark figures in docs/benchmarks.md come from benchmarks/results.json: the marked block is exactly what
benchmarks/readme_block.py renders from it, and every number in the block is a number of results.json."""

from __future__ import annotations

import re
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import common  # noqa: E402
import readme_block  # noqa: E402

NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?")


def _block() -> str:
    text = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert text.count(readme_block.START) == 1 and text.count(readme_block.END) == 1
    return text[text.index(readme_block.START):text.index(readme_block.END) + len(readme_block.END)]


def _numbers_of(obj, out: list[float]) -> list[float]:
    """Every number in results.json: numeric leaves and numbers inside its strings (versions, dates, labels)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            _numbers_of(k, out)
            _numbers_of(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _numbers_of(v, out)
    elif isinstance(obj, bool):
        pass
    elif isinstance(obj, int | float):
        out.append(float(obj))
    elif isinstance(obj, str):
        out += [float(m.replace(",", "")) for m in NUMBER.findall(obj)]
    return out


def test_readme_block_is_generated_from_results_json():
    results = common.read_results(REPO / "benchmarks" / "results.json")
    assert _block() == readme_block.render_block(results), "run benchmarks/run_all.py --report-only"


def test_every_number_in_the_readme_block_is_in_results_json():
    results = common.read_results(REPO / "benchmarks" / "results.json")
    # what the block shows: the metrics (values, targets, labels), the extractor comparison and the run's start;
    # not every number of the raw results, so a stale figure cannot match some unrelated value by chance
    extractors = results["topics"]["ingest"]["results"]["html_extractors.json"]
    known = _numbers_of([results["metrics"], results["started"], results["mode"], extractors["pages"],
                         extractors["extractors"]], [])
    known += [float(len(m["runs"])) for m in results["metrics"]]         # the Runs column
    body = re.sub(r"<!--.*?-->", "", _block(), flags=re.S)
    missing = []
    for token in NUMBER.findall(body):
        shown = float(token.replace(",", ""))
        digits = len(token.split(".")[1]) if "." in token else 0
        tol = 0.5 * 10 ** -digits + 1e-9
        if not any(abs(v - shown) <= tol or abs(100 * v - shown) <= tol for v in known):   # shares shown as %
            missing.append(token)
    assert not missing, f"numbers in the README block that results.json does not hold: {missing}"
    assert "0.14×" in body                     # the end-to-end ingest ratio against datatrove is not left out


def test_readme_ablation_table_is_generated_from_results_json():
    results = common.read_results(REPO / "benchmarks" / "results.json")
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start, end = readme_block.ABL_START, readme_block.ABL_END
    assert text.count(start) == 1 and text.count(end) == 1
    block = text[text.index(start):text.index(end) + len(end)]
    assert block == readme_block.render_ablation(results), "run benchmarks/run_all.py --report-only"
    known = _numbers_of(results["topics"]["ablation"]["results"], [])   # the one copy: results/ablation.json
    known += [95.0, 25.0, 4.0]                 # labels: the intervals' level, the cloze's chance and its choices
    body = re.sub(r"<!--.*?-->", "", block, flags=re.S)
    missing = []
    for t in NUMBER.findall(body):
        shown, tol = float(t.replace(",", "")), 0.5 * 10 ** -(len(t.split(".")[1]) if "." in t else 0) + 1e-9
        if not any(abs(v - shown) <= tol or abs(100 * v - shown) <= tol or abs(v / 60 - shown) <= 0.5
                   for v in known):                        # shares shown as %, the wall time in minutes
            missing.append(t)
    assert not missing, f"numbers in the README's ablation table that results.json does not hold: {missing}"
