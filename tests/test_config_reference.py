"""docs/configuration.md is generated from the config classes (pipeline/config_reference.py): it is current, and it
lists every field of every section with its description."""

from __future__ import annotations

from tests.conftest import REPO


def test_the_reference_is_current_and_lists_every_field():
    from pipeline.config import MindloomConfig
    from pipeline.config_reference import fields_of, render

    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == render(), "docs/configuration.md is stale: run .venv/bin/python -m pipeline.config_reference " \
                             "> docs/configuration.md"
    names = [n for n, _, _ in fields_of(MindloomConfig)]
    assert len(names) > 100
    assert {"train.backend", "train.nodes", "minhash.threshold", "train.stages[].init"} <= set(names)
    missing = [n for n in names if f"| `{n}` |" not in page]
    assert not missing, missing
    import dataclasses

    undocumented = [n for n, tp, f in fields_of(MindloomConfig) if not f.metadata.get("desc")
                    and not dataclasses.is_dataclass(tp)]  # a section's fields carry the descriptions
    assert not undocumented, f"fields without a description: {undocumented}"
