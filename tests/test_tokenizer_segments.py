"""Encoding by whitespace segment (pipeline/tokenizer/segments.py) gives exactly the ids of encoding whole texts:
on code and prose, on generated edge cases and random strings, with a small cache that keeps starting over, and
for a whole tokenize shard (byte-identical Parquet).  A model whose pieces may span a space is encoded whole."""

from __future__ import annotations

import hashlib
import io
import random

import numpy as np
import pytest
from conftest import prose_records, stdlib_records
from test_tokenizer import SMALL, write_quality_shards

from pipeline.tokenizer import encode, segments
from pipeline.tokenizer import run as tokenizer
from pipeline.tokenizer.segments import SegmentEncoder, splittable

ZH = ["数据管道把文本变成模型：北京、忠诚，12345。", "机器 学习  与 数据", "第一行\n 第二行\t第三行 "]
EDGES = ["", " ", "  ", "a ", "a  ", " a", "  a", "a b", "a  b", "a\tb", "a \tb", "a\n b", "\n", " \n ",
         "\u2581", "a\u2581 b", "a \u2581b", "\u2581 \u2581", "a\u2581\u2581 b", "12 345  6", "x" * 40 + " y",
         "    def f():\n        return 1\n", "end\n  ", "tab\t \t tab", "\u3000全角 空格", "e\u0301 e\u0301"]


def _whole(sp, texts):
    ids = [sp.encode(t) for t in texts]
    return np.array([i for x in ids for i in x], np.int32), np.array([len(x) for x in ids], np.int64)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    rdir = tmp_path_factory.mktemp("tok")
    shards = write_quality_shards(rdir, {"code": stdlib_records(30), "prose": prose_records(50),
                                         "zh": [{"id": f"z{i}", "text": t * 20} for i, t in enumerate(ZH)]})
    info = tokenizer.train_tokenizer(SMALL, rdir, shards, seed=3)
    proto = open(info["model"], "rb").read()
    return tokenizer.load(info["model"]), proto, rdir, shards


def _assert_same(enc, sp, texts):
    flat, lens = enc.encode(texts)
    ref_flat, ref_lens = _whole(sp, texts)
    assert lens.tolist() == ref_lens.tolist()
    assert flat.dtype == np.int32 and flat.tolist() == ref_flat.tolist()


def test_the_project_model_splits_and_equals_whole_encoding(model):
    sp, proto, _, _ = model
    enc = SegmentEncoder(sp, proto)
    assert enc.split                                              # else the test would compare whole with whole
    texts = [r["text"] for r in stdlib_records(30)] + [r["text"] for r in prose_records(50)] + ZH + EDGES
    _assert_same(enc, sp, texts)
    n = len(enc.cache)
    assert n > 100
    _assert_same(enc, sp, texts[::-1])                            # again, now from the cache
    assert len(enc.cache) == n
    for t in EDGES:                                               # and one text at a time
        _assert_same(enc, sp, [t])


def test_random_strings_of_spaces_tabs_newlines_and_marks(model):
    sp, proto, _, _ = model
    rng = random.Random(7)
    alphabet = ["a", "b", "e", "th", " ", " ", "  ", "\n", "\t", "\u2581", "1", "数", "据", ".", "def", "\u0301"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30))) for _ in range(3000)]
    _assert_same(SegmentEncoder(sp, proto), sp, texts)


def test_a_chunk_holding_the_sentinel_is_encoded_whole(model):
    sp, proto, _, _ = model
    enc = SegmentEncoder(sp, proto)
    _assert_same(enc, sp, ["a b", "x\x00y z"])
    assert not enc.cache                                          # nothing went through the segment path


def test_a_small_cache_that_starts_over_gives_the_same_ids(model, monkeypatch):
    sp, proto, _, _ = model
    monkeypatch.setattr(segments, "MAX_ENTRIES", 50)
    enc = SegmentEncoder(sp, proto)
    texts = [r["text"] for r in prose_records(50)]
    for i in range(0, len(texts), 5):
        _assert_same(enc, sp, texts[i:i + 5])
        assert len(enc.cache) <= 50


def _train(**kw) -> bytes:
    import sentencepiece as spm

    kw.setdefault("model_type", "bpe")
    lines = [ln for r in prose_records(50) for ln in r["text"].split("\n") if ln.strip()]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=600,
                                   minloglevel=2, **kw)
    return out.getvalue()


def test_models_whose_pieces_may_span_a_space_are_encoded_whole():
    import sentencepiece as spm

    across = _train(split_by_whitespace=False)                    # pieces such as "s▁of" or "▁of▁the"
    sp = spm.SentencePieceProcessor(model_proto=across)
    assert any("\u2581" in sp.id_to_piece(i)[1:] and sp.id_to_piece(i).strip("\u2581")
               for i in range(sp.get_piece_size()))
    assert not splittable(across)
    assert not splittable(_train())                               # default nmt_nfkc normalizer folds whitespace
    assert not splittable(_train(model_type="unigram", normalization_rule_name="identity"))
    enc = SegmentEncoder(sp, across)
    _assert_same(enc, sp, [r["text"] for r in prose_records(10)] + EDGES)
    assert not enc.cache


def test_tokenize_shard_is_byte_identical_to_whole_encoding(model, tmp_path, monkeypatch):
    import shutil

    _, _, rdir, shards = model
    digests = {}
    for mode in ("segments", "whole"):
        run = tmp_path / mode
        shutil.copytree(rdir / "quality", run / "quality")
        shutil.copytree(rdir / "tokenizer", run / "tokenizer")
        if mode == "whole":
            monkeypatch.setattr(segments, "splittable", lambda proto: False)
        encode._WORKER.clear()
        digests[mode] = [hashlib.sha256((run / "tokenize" / f"{s}.parquet").read_bytes()).hexdigest()
                         for s in shards if tokenizer.run_tokenize_shard(run, s, workers=1)]
    assert len(digests["whole"]) == len(shards) and digests["segments"] == digests["whole"]


def test_a_tasks_shards_share_one_encode_pool_and_match_one_process(model, tmp_path, monkeypatch):
    import functools
    import shutil

    from pipeline import pools

    _, _, rdir, shards = model
    monkeypatch.setattr(tokenizer, "Encoder", functools.partial(encode.Encoder, chunk_chars=5_000))   # many chunks
    digests = {}
    for workers in (1, 2):
        run = tmp_path / f"w{workers}"
        shutil.copytree(rdir / "quality", run / "quality")
        shutil.copytree(rdir / "tokenizer", run / "tokenizer")
        with pools.task_pools():
            for s in shards:
                tokenizer.run_tokenize_shard(run, s, workers=workers, batch_chars=20_000)
            scope = pools._SCOPES[-1]
            assert len(scope) == (1 if workers == 2 else 0)        # one pool for every shard of the task
            pids = {p.pid for pool in scope.values() for p in pool._processes.values()}
            assert len(pids) == (1 if workers == 2 else 0)
        digests[workers] = [hashlib.sha256((run / "tokenize" / f"{s}.parquet").read_bytes()).hexdigest()
                            for s in shards]
    assert digests[1] == digests[2]
