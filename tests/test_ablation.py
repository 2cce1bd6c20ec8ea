"""The ablation's parts that decide what it can tell (``make ablation`` itself trains 12 models and is a benchmark):
reference texts held out before ingest, the multiple-choice items built from them, and the seed intervals."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import ablation_data  # noqa: E402
import ablation_eval  # noqa: E402


def _corpus(tmp_path, domains=("alpha", "beta"), n=30):
    src = tmp_path / "src"
    src.mkdir()
    for d in domains:
        lines = [json.dumps({"id": f"{d}{i}", "text": f"{d} document {i} " + "word " * (20 + i)}) for i in range(n)]
        lines[5] = "not json"
        (src / f"{d}.jsonl").write_text("\n".join(lines) + "\n")
    return src


def test_split_holds_out_before_ingest_and_is_stable(tmp_path):
    src = _corpus(tmp_path)
    m = ablation_data.split_sources(src, tmp_path / "split", seed=7)
    for d in ("alpha", "beta"):
        held = [json.loads(x) for x in (tmp_path / "split" / "heldout" / f"{d}.jsonl").read_text().splitlines()]
        train = (tmp_path / "split" / "train" / f"{d}.jsonl").read_text().splitlines()
        assert m["domains"][d]["heldout_docs"] == len(held) == 3          # 10 % of 30 lines
        assert len(train) == 27 and "not json" in train                   # a bad line stays for ingest to report
        assert not {h["text"] for h in held} & {json.loads(x)["text"] for x in train if x != "not json"}
        assert all(h["id"].startswith(f"{d}:") for h in held)
    before = {p.name: p.read_bytes() for p in (tmp_path / "split").rglob("*.jsonl")}
    assert ablation_data.split_sources(src, tmp_path / "split", seed=7) == m
    ablation_data.split_sources(src, tmp_path / "again", seed=7)
    assert {p.name: p.read_bytes() for p in (tmp_path / "again").rglob("*.jsonl")} == before
    other = ablation_data.split_sources(src, tmp_path / "seed8", seed=8)
    assert other["domains"]["alpha"]["heldout_docs"] == 3
    assert (tmp_path / "seed8" / "heldout" / "alpha.jsonl").read_bytes() != before["alpha.jsonl"] or \
        (tmp_path / "seed8" / "heldout" / "beta.jsonl").read_bytes() != before["beta.jsonl"]


def test_filtered_arms_are_decontaminated_against_the_references():
    base = {"quality": {"decontamination": {"enabled": False, "paths": []}, "classifier": {"enabled": False},
                        "chains": [{"domain": "*", "filters": ["length"]}]}, "tokenizer": {"model_path": ""}}
    b = ablation_data.arm_config(base, "heuristics", ["/r/a.jsonl"], None)
    c = ablation_data.arm_config(base, "classifier", ["/r/a.jsonl"], "/t/spm.model")
    d = ablation_data.arm_config(base, "classifier_only", ["/r/a.jsonl"], "/t/spm.model")
    assert b["quality"]["decontamination"] == {"enabled": True, "paths": ["/r/a.jsonl"], "max_items_per_ngram": 1}
    assert not b["quality"]["classifier"]["enabled"] and b["tokenizer"]["model_path"] == ""
    assert c["quality"]["classifier"]["enabled"] and c["quality"]["chains"] == base["quality"]["chains"]
    assert d["quality"]["classifier"]["enabled"] and d["quality"]["chains"] == [{"domain": "*", "filters": []}]
    assert c["tokenizer"]["model_path"] == d["tokenizer"]["model_path"] == "/t/spm.model"
    assert base["quality"]["decontamination"]["paths"] == []              # the base is not modified


def test_multiple_choice_items(tmp_path, monkeypatch):
    from pipeline.tokenizer import run as tokenizer

    # one token per character (code point + 10), so the test can find each candidate in the texts
    def encode(_model, texts, workers=0):
        toks = [np.array([ord(c) % 5000 + 10 for c in t], np.int32) for t in texts]
        return np.concatenate(toks), np.array([len(t) for t in toks], np.int64)

    monkeypatch.setattr(tokenizer, "encode_texts", encode)
    held = tmp_path / "heldout"
    held.mkdir()
    rng = np.random.default_rng(0)
    texts = ["".join(chr(97 + x) for x in rng.integers(0, 26, 20 + 40 * i)) for i in range(6)]
    (held / "dom.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    seq = 16
    summary = ablation_eval.build_items(held, "unused", tmp_path / "items", seq_len=seq, max_tokens=64, eos_id=2,
                                        pad_id=3, seed=1)
    data = np.load(tmp_path / "items" / "dom.npz")
    rows, mc, answers = data["rows"], data["mc"], data["answers"]
    assert summary["dom"]["docs"] == 6 and summary["dom"]["loss_tokens"] == 64
    assert rows.shape == (4, seq + 1) and (rows[:, :-1].reshape(-1)[:64] != 3).all()
    n = len(answers)
    assert n == summary["dom"]["mc_items"] == sum(min(ablation_eval.WINDOWS_PER_DOC, len(t) // seq) for t in texts)
    assert mc.shape == (n * ablation_eval.CHOICES, seq + 1) and (mc[:, -1] == 3).all()
    half = seq // 2
    decode = lambda a: "".join(chr(int(c) - 10) for c in a)                         # noqa: E731
    assert sorted(set(answers.tolist())) == [0, 1, 2, 3]                  # the true one is not always first
    for k, ans in enumerate(answers):
        group = mc[k * 4:(k + 1) * 4]
        assert (group[:, :half] == group[0, :half]).all()                  # one context for all four
        whole = decode(group[ans, :seq])
        src = [i for i, t in enumerate(texts) if whole in t]
        assert len(src) == 1                                               # the true continuation, in one document
        for c in range(4):
            if c != ans:
                cont = decode(group[c, half:seq])
                assert not any(cont in texts[i] and (decode(group[0, :half]) + cont) in texts[i] for i in src)
                assert any(cont in t for i, t in enumerate(texts) if i != src[0])   # from another document


def test_mean_and_interval_over_seeds():
    s = ablation_eval.mean_ci([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["n"] == 3
    assert s["ci"] == pytest.approx(4.303 / 3 ** 0.5)                      # t(0.975, 2) x sd 1 / sqrt(3)
    assert ablation_eval.mean_ci([0.5]) == {"mean": 0.5, "ci": None, "n": 1}
    assert ablation_eval.mean_ci([None, None])["mean"] is None
