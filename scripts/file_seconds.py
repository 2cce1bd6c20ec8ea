"""Seconds per test file from a pytest JUnit XML report, for ``tests/fixtures/file_seconds.json``.

``make test`` hands whole test files to its xdist workers, longest first (``tests/conftest.py``); the weights come
from a measured run::

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    .venv/bin/python scripts/file_seconds.py /tmp/junit.xml > tests/fixtures/file_seconds.json

Only files of at least ``--min`` seconds are listed (the rest keep their collection order after them).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def file_seconds(junit_path: str, cpu: bool = False) -> dict[str, float]:
    """Sum of the ``time`` of every test case (setup, call and teardown) per test file name; with ``cpu``, of its
    ``cpu_s`` property instead (CPU seconds of the worker and the children it waited for, ``tests/conftest.py``)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((m for m in module if m.startswith("test_")), None)
        if not name:
            continue
        if cpu:
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            totals[f"{name}.py"] += float(props.get("cpu_s") or 0.0)
        else:
            totals[f"{name}.py"] += float(case.get("time") or 0.0)
    return dict(totals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", help="pytest --junitxml output")
    ap.add_argument("--min", type=float, default=20.0, help="leave out files shorter than this (seconds)")
    ap.add_argument("--cpu", action="store_true", help="CPU seconds per file (the cases' cpu_s) instead of wall")
    args = ap.parse_args(argv)
    totals = {k: round(v) for k, v in sorted(file_seconds(args.junit, args.cpu).items(), key=lambda kv: -kv[1])
              if v >= args.min}
    json.dump(totals, sys.stdout, indent=0)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
