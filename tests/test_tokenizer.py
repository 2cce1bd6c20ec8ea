"""SentencePiece stage on real text: exact round trips (Chinese included), the stratified sample, special tokens,
loading an existing model, and parallel encoding that equals serial encoding.

``write_quality_shards`` (used by the mixture and MindRecord tests too) writes what the quality stage hands on:
``quality/<domain>-<i>.parquet`` with doc_id, domain, text, n_chars and text_hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import SHARED_CORPORA, prose_records, stdlib_records

from pipeline.configkit import ConfigError
from pipeline.io import read_json, read_parquet, write_parquet
from pipeline.sink.validation import heldout_key
from pipeline.tokenizer import run as tokenizer
from pipeline.tokenizer.config import TokenizerConfig


def write_quality_shards(rdir: Path, records: dict[str, list[dict]], per_shard: int = 25) -> list[str]:
    import pyarrow as pa

    shards = []
    for dom, recs in sorted(records.items()):
        for i in range(0, len(recs), per_shard):
            part = recs[i:i + per_shard]
            name = f"{dom}-{i // per_shard:05d}"
            write_parquet(pa.table({
                "doc_id": [r["id"] for r in part], "domain": [dom] * len(part), "text": [r["text"] for r in part],
                "n_chars": pa.array([len(r["text"]) for r in part], pa.int64()),
                "text_hash": [hashlib.sha1(r["text"].encode()).hexdigest() for r in part]}),
                rdir / "quality" / f"{name}.parquet")
            shards.append(name)
    return shards


def shared_records(domain: str, n: int) -> list[dict]:
    path = SHARED_CORPORA / f"{domain}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines[::max(1, len(lines) // n)][:n]]   # spread over every source


def stdlib_corpus() -> dict[str, list[dict]]:
    return {"code": stdlib_records(30), "prose": prose_records(50)}


SMALL = TokenizerConfig(vocab_size=800, sample_chars=150_000)


def _decode_all(rdir: Path, shard: str, sp) -> tuple[list[str], list[str]]:
    tok = read_parquet(rdir / "tokenize" / f"{shard}.parquet")
    text = read_parquet(rdir / "quality" / f"{shard}.parquet", columns=["text"]).column("text").to_pylist()
    return text, [sp.decode(ids) for ids in tok.column("tokens").to_pylist()]


def test_code_and_prose_round_trip_exactly_and_stats_add_up(tmp_path):
    shards = write_quality_shards(tmp_path, stdlib_corpus())
    info = tokenizer.train_tokenizer(SMALL, tmp_path, shards, seed=3)
    assert (info["unk_id"], info["bos_id"], info["eos_id"], info["pad_id"]) == (0, 1, 2, 3)
    assert info["trained"] and info["vocab_size"] == 800
    sp = tokenizer.load(info["model"])
    for shard in shards:
        stats = tokenizer.run_tokenize_shard(tmp_path, shard)
        text, decoded = _decode_all(tmp_path, shard, sp)
        assert decoded == text                       # indentation, tabs, newlines, digits: all exact
        t = read_parquet(tmp_path / "tokenize" / f"{shard}.parquet")
        lens = [len(x) for x in t.column("tokens").to_pylist()]
        assert t.column("n_tokens").to_pylist() == lens and stats["tokens"] == sum(lens)
        assert t.column("n_bytes").to_pylist() == [len(x.encode()) for x in text]
        assert stats["bytes_per_token"] == pytest.approx(stats["in_bytes"] / stats["tokens"])
        assert stats["in_docs"] == stats["kept_docs"] == len(text) and stats["lossy_docs"] == 0


@pytest.mark.corpus
def test_chinese_survives_encode_decode_exactly(tmp_path):
    recs = {"zh": shared_records("zh", 160), "code": shared_records("code", 40),
            "encyclopedia": shared_records("encyclopedia", 80)}
    shards = write_quality_shards(tmp_path, recs, per_shard=80)
    tc = TokenizerConfig(vocab_size=3000, sample_chars=400_000)
    info = tokenizer.train_tokenizer(tc, tmp_path, shards, seed=1, weights={"zh": 0.5, "code": 0.25,
                                                                             "encyclopedia": 0.25})
    assert info["sample_chars_per_domain"]["zh"] == 200_000
    sp = tokenizer.load(info["model"])
    zh_chars = zh_tokens = zh_bytes = 0
    for shard in shards:
        stats = tokenizer.run_tokenize_shard(tmp_path, shard)
        text, decoded = _decode_all(tmp_path, shard, sp)
        assert decoded == text, shard
        if shard.startswith("zh"):
            zh_chars += sum(len(t) for t in text)
            zh_tokens += stats["tokens"]
            zh_bytes += stats["byte_fallback_tokens"]
    assert zh_chars > 300_000
    # the vocabulary serves Chinese: measured 3.6 % byte-fallback tokens (4.8 % with an unweighted sample)
    assert zh_bytes < 0.05 * zh_tokens
    ids = sp.encode("数据管道把文本变成模型：北京、忠诚，12345。")
    assert sp.decode(ids) == "数据管道把文本变成模型：北京、忠诚，12345。"
    assert [sp.id_to_piece(i) for i in ids[-6:-1]] == ["1", "2", "3", "4", "5"]     # digits split


def test_sample_follows_weights_with_a_floor_and_avoids_heldout_end(tmp_path):
    assert tokenizer.sample_budgets({"a": 10, "b": 10, "c": 10}, 1000, {}, 0.05) == {"a": 333, "b": 333, "c": 333}
    assert tokenizer.sample_budgets({"a": 1, "b": 1}, 1000, {"a": 0.99, "b": 0.01}, 0.1) == {"a": 900, "b": 100}
    recs = stdlib_corpus()
    shards = write_quality_shards(tmp_path, recs)
    lines, budgets = tokenizer._sample_lines(tmp_path, shards, 60_000, 5, {"code": 3, "prose": 1}, 0.05)
    assert budgets == {"code": 45_000, "prose": 15_000}
    sample = "\n".join(lines)
    # documents are taken from the largest held-out keys down: the smallest-key document (first to be held out)
    # of each domain is not in the sample
    for dom, docs in recs.items():
        first_heldout = min(docs, key=lambda r: heldout_key(5, dom, r["id"]))
        longest_line = max(first_heldout["text"].split("\n"), key=len)
        assert longest_line not in sample


def test_special_tokens_get_fixed_ids_and_never_come_from_text(tmp_path):
    shards = write_quality_shards(tmp_path, stdlib_corpus())
    tc = TokenizerConfig(vocab_size=800, sample_chars=100_000, special_tokens=["<|im_start|>", "<|im_end|>"])
    info = tokenizer.train_tokenizer(tc, tmp_path, shards, seed=3)
    assert info["special_ids"] == {"<|im_start|>": 4, "<|im_end|>": 5}
    sp = tokenizer.load(info["model"])
    ids = sp.encode("<|im_start|>user")
    assert 4 not in ids and sp.decode(ids) == "<|im_start|>user"


def test_existing_model_is_used_as_is(tmp_path):
    shards = write_quality_shards(tmp_path / "a", stdlib_corpus())
    first = tokenizer.train_tokenizer(SMALL, tmp_path / "a", shards, seed=3)
    write_quality_shards(tmp_path / "b", stdlib_corpus())
    tc = TokenizerConfig(model_path=first["model"])
    info = tokenizer.train_tokenizer(tc, tmp_path / "b", shards, seed=99)
    assert info["sha256"] == first["sha256"] and not info["trained"] and info["eos_id"] == 2
    assert read_json(tmp_path / "b" / "tokenizer" / "spm.model.done")["info"]["source"] == str(Path(first["model"]))
    with pytest.raises(ConfigError, match=r"tokenizer\.model_path: .*nope\.model is not a file"):
        tokenizer.train_tokenizer(TokenizerConfig(model_path=str(tmp_path / "nope.model")), tmp_path / "c", [], 1)
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="is not a SentencePiece model"):
        tokenizer.train_tokenizer(TokenizerConfig(model_path=str(tmp_path / "junk.model")), tmp_path / "d", [], 1)


def test_retraining_in_another_run_gives_the_same_model_bytes(tmp_path):
    infos = []
    for run in ("r1", "r2"):
        shards = write_quality_shards(tmp_path / run, stdlib_corpus())
        infos.append(tokenizer.train_tokenizer(SMALL, tmp_path / run, shards, seed=3))
    assert infos[0]["sha256"] == infos[1]["sha256"]


def test_bpe_model_bytes_do_not_depend_on_training_threads(tmp_path):
    shards = write_quality_shards(tmp_path / "r", stdlib_corpus())
    infos = []
    for threads in (1, 2):
        shutil.copytree(tmp_path / "r" / "quality", tmp_path / f"t{threads}" / "quality")
        tc = dataclasses.replace(SMALL, train_threads=threads)
        infos.append(tokenizer.train_tokenizer(tc, tmp_path / f"t{threads}", shards, seed=3))
    assert infos[0]["sha256"] == infos[1]["sha256"] and infos[1]["train_threads"] == 2
    assert tokenizer.train_threads(SMALL) >= 1
    assert tokenizer.train_threads(TokenizerConfig(model_type="unigram")) == 1   # unigram changes with threads


def test_parallel_encoding_equals_serial(tmp_path):
    shards = write_quality_shards(tmp_path, stdlib_corpus())
    info = tokenizer.train_tokenizer(SMALL, tmp_path, shards, seed=3)
    texts = [r["text"] for r in stdlib_records(30)]
    flat1, lens1 = tokenizer.encode_texts(info["model"], texts, workers=1, chunk_chars=50_000)
    flat2, lens2 = tokenizer.encode_texts(info["model"], texts, workers=2, chunk_chars=50_000)
    assert (flat1 == flat2).all() and (lens1 == lens2).all() and len(lens1) == 30
    sp = tokenizer.load(info["model"])
    assert flat1[:lens1[0]].tolist() == sp.encode(texts[0])


def test_sample_memory_does_not_grow_with_the_corpus(tmp_path):
    """The sample equals sorting each whole domain by key, but only about a budget's worth of entries is held."""
    import tracemalloc

    def corpus(n_docs: int) -> dict[str, list[dict]]:
        return {dom: [{"id": f"{dom}-{i}", "text": f"{dom} document {i} " + "word " * (20 + i % 50)}
                      for i in range(n_docs)] for dom in ("a", "b")}

    budget, peaks = 40_000, {}
    for mult in (0, 1, 4):                                       # 0: warm-up (imports, pyarrow kernels)
        rdir = tmp_path / f"x{mult}"
        recs = corpus(1000 * max(mult, 1))
        shards = write_quality_shards(rdir, recs, per_shard=250)
        budgets = tokenizer.sample_budgets({"a": 1, "b": 1}, budget, {}, 0.05)
        chosen = tokenizer._select_sample(rdir, shards, budgets, seed=2)
        for dom, docs in recs.items():                           # what sorting the whole domain would take
            ranked = sorted(docs, key=lambda r: -heldout_key(2, dom, r["id"]))
            used, want = 0, []
            for r in ranked:
                if used >= budgets[dom]:
                    break
                want.append(r["id"])
                used += len(r["text"])
            assert [c[1] for c in chosen[dom]][:len(want)] == want
            assert len(chosen[dom]) <= len(want) + 1             # the heap held one document past the budget
        tracemalloc.start()
        tokenizer._sample_lines(rdir, shards, budget, 2, {}, 0.05)
        peaks[mult] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # measured: 0.11 MB for 2,000 and for 8,000 documents (sorting every document's key: 0.3 → 1.0 MB)
    assert peaks[4] < 1.25 * peaks[1], peaks


def test_tokenize_in_batches_writes_the_same_rows_and_stats(tmp_path):
    shards = write_quality_shards(tmp_path, {"prose": prose_records(50)}, per_shard=50)
    tokenizer.train_tokenizer(SMALL, tmp_path, shards, seed=3)
    whole = tokenizer.run_tokenize_shard(tmp_path, shards[0], workers=1)
    table = read_parquet(tmp_path / "tokenize" / f"{shards[0]}.parquet")
    shutil.rmtree(tmp_path / "tokenize")
    batches = list(tokenizer._text_batches(tmp_path / "quality" / f"{shards[0]}.parquet", ["doc_id", "text"], 5_000))
    assert len(batches) >= 15 and [t for _, b in batches for t in b] == [r["text"] for r in prose_records(50)]
    parts = tokenizer.run_tokenize_shard(tmp_path, shards[0], workers=2, batch_chars=5_000)   # one pool throughout
    assert parts == whole and read_parquet(tmp_path / "tokenize" / f"{shards[0]}.parquet").equals(table)
