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
    assert code == {"references": 3, "sources": 17, "pieces": 17, "overlaps_reference": 1, "reference_sources": 1}
    assert split["boilerplate_ngrams"] > 0          # the navigation block's n-grams did not count
    refs = [json.loads(line) for line in (root / "references" / "code.jsonl").read_text().splitlines()]
    assert all(len(r["text"].encode()) <= 300 and r["source"] == "manual" for r in refs)
    kept = [json.loads(line)["id"] for line in (root / "sources" / "code.jsonl").read_text().splitlines()]
    assert len(kept) == 17 and not any("copy-of" in k for k in kept)
    assert split_references(cfg, root) == split                   # a finished split is kept as it is
    prose = split["domains"]["prose"]
    assert prose["references"] == 3 and prose["sources"] + prose["overlaps_reference"] == 43 - 3


def test_training_documents_are_cut_into_pieces_at_line_ends():
    """A matched mixture selects whole documents: a whole book against a domain's target is all or nothing, so the
    split cuts training documents into pieces of at most ``ablation.piece_bytes`` at line ends."""
    from pipeline.ablation.plan import pieces_of

    text = "".join(f"line {i:03d} " + "ä" * 20 + "\n" for i in range(100))      # 50 bytes a line
    pieces = pieces_of(text, 500)
    assert "".join(pieces) == text and len(pieces) == 10
    assert all(len(p.encode()) <= 500 and p.endswith("\n") for p in pieces)
    long_line = "漢" * 400                                            # 1,200 bytes, no line end
    cut = pieces_of(long_line, 500)
    assert "".join(cut) == long_line and [len(p.encode()) for p in cut] == [498, 498, 204]
    assert pieces_of(text, 0) == [text] and pieces_of("short", 500) == ["short"]


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
    assert [(r["arm"], r["seed"]) for r in arm_runs(cfg)] == [
        ("raw", 7), ("raw", 8), ("shipped", 7), ("shipped", 8), ("raw_control", 7), ("raw_control", 8),
        ("shipped_control", 7), ("shipped_control", 8), ("raw_aa", 1007), ("raw_aa", 1008)]
    (root / "sources_control").mkdir()
    for d in ("code", "prose"):
        (root / "sources_control" / f"{d}.jsonl").write_text("")
    control = arm_config(cfg, root, "raw_control")     # the raw chain over the junk-planted documents
    assert not control.quality.enabled and control.sources[0].paths == [str(root / "sources_control" / "code.jsonl")]
    assert control.data_root.endswith("arms/raw_control")
    with pytest.raises(ConfigError, match=r"ablation.arms.x_aa: names ending in _aa or _control"):
        load_config(tiny_config(tmp_path, ablation={"arms": {"raw": {}, "x_aa": {}}}))
    with pytest.raises(ConfigError, match=r"ablation.arms.bad.mixture.weights: an arm may change what the chain"):
        load_config(tiny_config(tmp_path, ablation={"arms": {"raw": {}, "bad": {"mixture.weights": {"a": 1}}}}))


def test_the_positive_control_plants_a_known_share_of_junk(tmp_path):
    from collections import Counter

    from pipeline.ablation.plan import CONTROL_KINDS, plant_junk

    root = tmp_path / "abl"
    (root / "sources").mkdir(parents=True)
    docs = [{"id": f"d{i:03d}", "source": "s", "text": f"line one of {i}\nthe second line here {i}", "meta": {}}
            for i in range(400)]
    (root / "sources" / "web.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    templates = [(["Navigation", "• index", "• modules |"], ["© Copyright 2003-2023, LLVM Project."]),
                 (["Modules | Directives | FAQ"], ["Copyright 2026 The Apache Software Foundation.", "Sitemap"])]
    control = plant_junk(root, 7, 0.25, templates=templates)
    c = control["domains"]["web"]
    planted = sum(c[k] for k in CONTROL_KINDS)
    assert c["documents"] == 400 and 80 <= planted <= 120 and all(c[k] > 12 for k in CONTROL_KINDS)
    assert control["page_templates"] == 2
    out = [json.loads(line) for line in (root / "sources_control" / "web.jsonl").read_text().splitlines()]
    assert len(out) == 400 + c["exact_copy"]                    # an exact copy is added beside its document
    by_id = {d["id"]: d["text"] for d in docs}
    kinds = Counter()
    for rec in out:
        base = rec["id"].split("#")[0]
        wrapped = {"\n".join([*before, by_id[base], *after]) for before, after in templates}
        if "#copy" in rec["id"]:
            assert rec["text"] == by_id[base]
            kinds["exact_copy"] += 1
        elif rec["text"] in wrapped:                                 # inside one real page's template
            kinds["navigation"] += 1
        elif rec["text"].count("\n") == 7:
            assert rec["text"].split("\n")[:4] == [by_id[base].split("\n")[0]] * 4
            kinds["repeated_lines"] += 1
        elif rec["text"] != by_id[base]:
            assert sorted(rec["text"].split()) == sorted(by_id[base].split())
            kinds["scrambled_words"] += 1
    assert kinds["exact_copy"] == c["exact_copy"] and kinds["repeated_lines"] == c["repeated_lines"]
    assert kinds["navigation"] == c["navigation"]
    assert kinds["scrambled_words"] <= c["scrambled_words"]      # a shuffle can leave a short line as it was
    assert plant_junk(root, 7, 0.25, templates=templates) == control  # by key: the same documents every time


def test_planted_junk_is_cut_into_pieces_again(tmp_path):
    """A piece with every line four times is four times a piece: cut again, so the control arms' matched mixture
    meets its targets as closely as the others'."""
    from pipeline.ablation.plan import plant_junk

    root = tmp_path / "abl"
    (root / "sources").mkdir(parents=True)
    text = "".join(f"line {j} of a page that is long enough\n" for j in range(12))        # 456 bytes
    docs = [{"id": f"d{i:03d}", "source": "s", "text": text, "meta": {}} for i in range(200)]
    (root / "sources" / "web.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    template = (["Navigation | Home | Modules | Index | Search this site"], ["Copyright 2026, All rights reserved."])
    c = plant_junk(root, 7, 0.25, piece_bytes=500, templates=[template])["domains"]["web"]  # 550 bytes: 2 pieces
    out = [json.loads(line) for line in (root / "sources_control" / "web.jsonl").read_text().splitlines()]
    assert max(len(r["text"].encode()) for r in out) <= 500 and len({r["id"] for r in out}) == len(out)
    repeated = [r for r in out if r["text"].startswith("line 0 of a page that is long enough\nline 0")]
    assert len(repeated) == c["repeated_lines"]             # the first piece of each; 1,824 bytes make 4 pieces
    assert len(out) == 200 + c["exact_copy"] + 3 * c["repeated_lines"] + c["navigation"]
