"""``scripts/file_seconds.py``: seconds per test file from a JUnit report, wall (the start order ``make test``
uses) or CPU (each case's ``cpu_s`` property, which ``tests/conftest.py`` records)."""

from __future__ import annotations

import json

from conftest import REPO, load_file_module

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="one" time="10.5">
  <properties><property name="cpu_s" value="4.0" /></properties></testcase>
<testcase classname="tests.test_a" name="two" time="30.0">
  <properties><property name="cpu_s" value="25.5" /></properties></testcase>
<testcase classname="tests.test_b" name="one" time="2.0" />
<testcase classname="conftest" name="collect" time="9.0" />
</testsuite></testsuites>
"""


def _module():
    return load_file_module(REPO / "scripts" / "file_seconds.py")


def test_wall_and_cpu_seconds_per_file(tmp_path, capsys):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    mod = _module()
    assert mod.file_seconds(str(path)) == {"test_a.py": 40.5, "test_b.py": 2.0}
    assert mod.file_seconds(str(path), cpu=True) == {"test_a.py": 29.5, "test_b.py": 0.0}   # no property: 0
    assert mod.main([str(path), "--cpu", "--min", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"test_a.py": 30}


def test_every_case_of_this_run_records_its_cpu_seconds(request):
    """The property the report gets comes from this conftest's hooks: a test that has run its setup carries the
    start figure that the teardown report turns into ``cpu_s``."""
    assert isinstance(getattr(request.node, "_mindloom_cpu0", None), float)
