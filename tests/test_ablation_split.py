"""#51: the ablation's references are held out before any arm reads the documents, and decontamination removes a
training page that copies a reference but keeps pages that share only their source's boilerplate with it."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config, write_jsonl

NAV = ("Home Contents Index Modules Next Previous Python Documentation Library Reference Language Reference "
       "Tutorial Glossary Search Copyright Python Software Foundation licence terms and conditions apply here")


def _manual(n: int) -> list[dict]:
    """A manual whose every page carries the same navigation block, and unique prose."""
    import random

    rng = random.Random(5)                 # letters only: the overlap check maps every digit run to 0
    pages = []
    for i in range(n):
        body = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(60))
        pages.append({"id": f"page{i:02d}", "text": f"{NAV}\n\nPage {i}. {body}", "source": "manual"})
    return pages


def test_references_are_held_out_and_only_real_overlap_is_removed(tmp_path):
    from pipeline.ablation.plan import REFERENCE_KEY, split_references
    from pipeline.config import load_config
    from pipeline.sink.validation import unit_key

    pages = _manual(20)
    cfg = load_config(tiny_config(tmp_path, ablation={"reference_docs": 3, "reference_max_bytes": 300}))
    keys = sorted((unit_key(REFERENCE_KEY, cfg.seed, "code", p["id"]), p["id"]) for p in pages)
    leak = dict(pages[[p["id"] for p in pages].index(keys[0][1])])       # the first reference, copied
    write_jsonl(tmp_path / "in" / "code.jsonl", pages + [{**leak, "id": "copy-of-a-reference"}])
    root = tmp_path / "abl"
    split = split_references(cfg, root)
    code = split["domains"]["code"]
    assert code == {"references": 3, "sources": 17, "overlaps_reference": 1, "reference_sources": 1}
    assert split["boilerplate_ngrams"] > 0          # the navigation block's n-grams did not count
    refs = [json.loads(line) for line in (root / "references" / "code.jsonl").read_text().splitlines()]
    assert all(len(r["text"].encode()) <= 300 and r["source"] == "manual" for r in refs)
    kept = [json.loads(line)["id"] for line in (root / "sources" / "code.jsonl").read_text().splitlines()]
    assert len(kept) == 17 and not any("copy-of" in k for k in kept)
    assert split_references(cfg, root) == split                   # a finished split is kept as it is
    prose = split["domains"]["prose"]
    assert prose["references"] == 3 and prose["sources"] + prose["overlaps_reference"] == 43 - 3


def test_arm_configs_share_everything_but_the_chain(tmp_path):
    from pipeline.ablation.plan import arm_config, arm_runs
    from pipeline.config import load_config
    from pipeline.configkit import ConfigError

    cfg = load_config(tiny_config(tmp_path, ablation={"seeds": 2, "steps": 5}))
    root = tmp_path / "abl"
    (root / "sources").mkdir(parents=True)
    for d in ("code", "prose"):
        (root / "sources" / f"{d}.jsonl").write_text("")
    raw, shipped = arm_config(cfg, root, "raw"), arm_config(cfg, root, "shipped")
    assert not raw.quality.enabled and not raw.dedup.exact and not raw.minhash.enabled and shipped.quality.enabled
    for arm in (raw, shipped):
        assert arm.mixture.matched and arm.mixture.total_tokens == 5 * 4 * 32
        assert arm.mixture.weights == {"code": 1.0, "prose": 1.0} and arm.train.steps == 5
        assert [s.paths for s in arm.sources] == [[str(root / "sources" / "code.jsonl")],
                                                  [str(root / "sources" / "prose.jsonl")]]
    assert raw.data_root != shipped.data_root
    assert [(r["arm"], r["seed"]) for r in arm_runs(cfg)] == [("raw", 7), ("raw", 8), ("shipped", 7), ("shipped", 8),
                                                             ("raw_aa", 1007), ("raw_aa", 1008)]
    with pytest.raises(ConfigError, match=r"ablation.arms.bad.mixture.weights: an arm may change what the chain"):
        load_config(tiny_config(tmp_path, ablation={"arms": {"raw": {}, "bad": {"mixture.weights": {"a": 1}}}}))
