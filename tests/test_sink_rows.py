"""Rows, not documents, are dealt to the corpus' MindRecord files (#23).

Synthetic tokenized shards (real packing, real MindRecord files): the files in manifest order hold exactly the rows
of packing every copy in key order as one stream, each file ``R // n`` or ``R // n + 1`` consecutive rows, so two
documents fill two files; a corpus with fewer rows than files fails with one line that says so.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.io import write_marker, write_parquet
from pipeline.sink import mindrecord, packing, shards

pytest.importorskip("mindspore")


def tokenized(rdir: Path, docs: dict[str, list[np.ndarray]]) -> list[str]:
    """``tokenize/<shard>.parquet`` (with markers) from token arrays, one shard per key, domain = shard prefix."""
    for shard, toks in docs.items():
        ids = [f"{shard}/{i}" for i in range(len(toks))]
        offsets = np.concatenate([[0], np.cumsum([len(t) for t in toks])]).astype(np.int32)
        flat = np.concatenate(toks).astype(np.int32) if toks else np.zeros(0, np.int32)
        path = rdir / "tokenize" / f"{shard}.parquet"
        sha = write_parquet(pa.table({"doc_id": ids, "domain": [shard.rsplit("-", 1)[0]] * len(ids),
                                      "n_tokens": pa.array([len(t) for t in toks], pa.int64()),
                                      "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))}), path)
        write_marker(path, config="test", sha256=sha)
    return sorted(docs)


def build(rdir: Path, docs: dict, *, seq_len: int, shard_num: int, shard_mb: int = 256, **kw) -> dict:
    names = tokenized(rdir, docs)
    return mindrecord.write_mindrecord(rdir, names, seq_len=seq_len, shard_num=shard_num, add_bos=kw.pop("bos", False),
                                       seed=11, tokenizer_sha256="t", config_sha256="c", eos_id=2, bos_id=1,
                                       vocab_size=500, pad_id=0, shard_mb=shard_mb, **kw)


def read_rows(mr_dir: Path) -> list[np.ndarray]:
    import mindspore.dataset as ds

    return [np.stack([r for (r,) in ds.MindDataset(f, columns_list=["input_ids"], shuffle=False)
                      .create_tuple_iterator(output_numpy=True, num_epochs=1)])
            for f in mindrecord.dataset_files(mr_dir)]


def expected_stream(docs: dict, seq_len: int, remainder: str, bos: bool) -> np.ndarray:
    """Every document once, in key order over the whole corpus, packed as one stream."""
    ids = [f"{s}/{i}" for s in sorted(docs) for i in range(len(docs[s]))]
    toks = [t for s in sorted(docs) for t in docs[s]]
    _, keys = packing.order_keys(11, ids, [1] * len(ids))
    order = np.argsort(keys, kind="stable")
    lens = np.asarray([len(t) for t in toks], np.int64)
    return packing.pack(np.concatenate(toks).astype(np.int32), np.cumsum(lens) - lens, lens,
                        np.zeros(len(toks), np.int32), order, seq_len=seq_len, eos_id=2, bos_id=1 if bos else None,
                        pad_id=0, remainder=remainder)["rows"]


def test_two_documents_fill_two_files_with_consecutive_rows(tmp_path):
    rng = np.random.default_rng(3)
    docs = {"web-00000": [rng.integers(3, 500, 3_000, dtype=np.int32), rng.integers(3, 500, 4_000, dtype=np.int32)]}
    m = build(tmp_path, docs, seq_len=63, shard_num=2)       # 7_002 stream tokens: 109 rows of 64, 26 dropped
    assert [s["samples"] for s in m["shards"]] == [54, 55]
    assert m["samples"] == 109 and m["dropped_tail_tokens"] == 7_002 - 109 * 64 == 26 and m["documents"] == 2
    got = read_rows(tmp_path / "mindrecord")
    want = expected_stream(docs, 63, "drop", False)
    assert np.array_equal(np.concatenate(got), want)
    assert [hashlib.sha256(r.tobytes()).hexdigest() for r in got] == [s["rows_sha256"] for s in m["shards"]]


@pytest.mark.parametrize("n_docs, shard_num, remainder, bos", [(1, 3, "drop", False), (40, 4, "pad", True),
                                                               (7, 6, "drop", True)])
def test_any_corpus_fills_every_file_within_one_row(tmp_path, n_docs, shard_num, remainder, bos):
    """Lumpy corpora (one long document; many short ones over several shards; tiny files) deal rows evenly."""
    rng = np.random.default_rng(n_docs)
    sizes = rng.integers(1, 600, n_docs) if n_docs > 1 else [2_000]
    toks = [rng.integers(3, 500, int(n), dtype=np.int32) for n in sizes]
    docs = {f"a-{i:05d}": toks[i::3] for i in range(min(3, n_docs))}
    m = build(tmp_path, docs, seq_len=15, shard_num=shard_num, remainder=remainder, bos=bos)
    counts = [s["samples"] for s in m["shards"]]
    assert len(counts) == shard_num and max(counts) - min(counts) <= 1 and min(counts) >= 1
    want = expected_stream(docs, 15, remainder, bos)
    assert np.array_equal(np.concatenate(read_rows(tmp_path / "mindrecord")), want)
    assert m["documents"] == n_docs


def test_rows_straddle_buckets_and_files_straddle_documents(tmp_path):
    """Five files over three shards: file boundaries fall inside documents and key-range buckets alike, and the
    files still hold the one stream (copies are fed by stream position, not by bucket)."""
    rng = np.random.default_rng(5)
    docs = {f"b-{s:05d}": [rng.integers(3, 500, int(n), dtype=np.int32) for n in rng.integers(50, 3_000, 30)]
            for s in range(3)}
    m = build(tmp_path, docs, seq_len=127, shard_num=5)
    stream = sum(len(t) + 1 for ts in docs.values() for t in ts)
    counts = [s["samples"] for s in m["shards"]]
    assert len(counts) == 5 and sum(counts) == stream // 128 and max(counts) - min(counts) <= 1
    assert np.array_equal(np.concatenate(read_rows(tmp_path / "mindrecord")),
                          expected_stream(docs, 127, "drop", False))


def test_a_scatter_task_merges_its_shards_into_one_part_and_the_rows_do_not_depend_on_the_parts(tmp_path,
                                                                                                 monkeypatch):
    """A scatter task's part holds, per bucket, its shards' copies in the order given, and nothing else is left in
    the scatter folder; a rerun reads no tokens; the rows written from two parts are the rows written from one."""
    import pyarrow as pa

    from pipeline.sink import scatter

    rng = np.random.default_rng(8)
    docs = {f"b-{s:05d}": [rng.integers(3, 500, int(n), dtype=np.int32) for n in rng.integers(50, 3_000, 30)]
            for s in range(3)}
    args = dict(seed=11, n_files=4, domains=["b"])
    runs = {}
    for layout, groups in (("one", [[0, 1, 2]]), ("two", [[0, 1], [2]]), ("shards", None)):
        rdir = tmp_path / layout
        names = tokenized(rdir, docs)
        for n in names:
            write_parquet(pa.table({"doc_id": [f"{n}/{i}" for i in range(30)], "copies": [1, 2, 0] * 10}),
                          rdir / "mixture" / f"{n}.parquet")
        if groups is None:
            runs[layout] = [scatter.scatter_shard(rdir, n, **args) for n in names]
            continue
        parts = [scatter.part_name(t, len(groups)) for t in range(len(groups))]
        runs[layout] = [scatter.run_scatter_part(rdir, p, [names[i] for i in g], **args)
                        for p, g in zip(parts, groups, strict=True)]
        assert sorted(f.name for f in (rdir / scatter.SCATTER_DIR).iterdir()) == sorted(
            f"{p}.arrow{d}" for p in parts for d in ("", ".done"))            # no run is left behind

    def bucket(h, b):
        lo, hi = int(h.bounds[b]), int(h.bounds[b + 1])
        return pa.table({"key": h.keys[lo:hi], "domain": h.dom[lo:hi], "tokens": h.tokens.slice(lo, hi - lo)})
    for part, group in zip(runs["two"], [[0, 1], [2]], strict=True):
        assert [s["shard"] for s in part["shards"]] == [sorted(docs)[i] for i in group]
        for b in range(4):
            got = scatter.open_batch(scatter.part_path(tmp_path / "two", part["part"]), b)
            want = pa.concat_tables([bucket(runs["shards"][i], b) for i in group]).combine_chunks()
            assert pa.Table.from_batches([got]).cast(want.schema).equals(want)
            assert part["copies"][b] == sum(runs["shards"][i].marker["copies"][b] for i in group) == got.num_rows
    assert sum(sum(p["copies"]) for p in runs["two"]) == 3 * 30           # copies 1, 2, 0: 30 per shard

    def no_scatter(*_a, **_k):
        raise AssertionError("a finished part was scattered again")
    monkeypatch.setattr(scatter, "scatter_shard", no_scatter)
    assert scatter.run_scatter_part(tmp_path / "one", "part-00000-of-00001", sorted(docs), **args) == runs["one"][0]
    monkeypatch.undo()
    write_parquet(pa.table({"doc_id": [f"b-00002/{i}" for i in range(30)], "copies": [1] * 15 + [0] * 15}),
                  tmp_path / "one" / "mixture" / "b-00002.parquet")                # a changed input: scattered again
    redone = scatter.run_scatter_part(tmp_path / "one", "part-00000-of-00001", sorted(docs), **args)
    assert redone["config"] != runs["one"][0]["config"] and sum(redone["copies"]) == 30 + 30 + 15

    write = dict(seq_len=127, eos_id=2, bos_id=None, pad_id=0, remainder="drop", domain_field=True, boundaries=False,
                 n_domains=1)
    two = [shards.write_output_file(tmp_path / "two", k, 4, [p["part"] for p in runs["two"]], **write)
           for k in range(4)]
    for n in sorted(docs):                          # "one" again as it was before the change
        write_parquet(pa.table({"doc_id": [f"{n}/{i}" for i in range(30)], "copies": [1, 2, 0] * 10}),
                      tmp_path / "one" / "mixture" / f"{n}.parquet")
    scatter.run_scatter_part(tmp_path / "one", "part-00000-of-00001", sorted(docs), **args)
    one = [shards.write_output_file(tmp_path / "one", k, 4, ["part-00000-of-00001"], **write) for k in range(4)]
    assert [e["rows_sha256"] for e in one] == [e["rows_sha256"] for e in two]
    assert [e["samples"] for e in one] == [e["samples"] for e in two] and sum(e["samples"] for e in one) > 4


def test_a_scatter_task_whose_shards_ship_no_copy_writes_empty_buckets(tmp_path):
    """A part whose shards all have zero copies (sampled out, or every document overlaps a held-out one) holds
    ``n_files`` empty buckets and counts zero copies: writers read it like any other part."""
    from pipeline.sink import scatter

    names = tokenized(tmp_path, {"b-00000": [np.arange(3, 40, dtype=np.int32)] * 4})
    write_parquet(pa.table({"doc_id": [f"{names[0]}/{i}" for i in range(4)], "copies": [0] * 4}),
                  tmp_path / "mixture" / f"{names[0]}.parquet")
    for shard_list in (names, []):
        part = scatter.run_scatter_part(tmp_path, "part-00000-of-00001", shard_list, seed=11, n_files=3,
                                        domains=["b"])
        assert part["copies"] == part["tokens"] == [0, 0, 0]
        assert [scatter.open_batch(scatter.part_path(tmp_path, part["part"]), b).num_rows for b in range(3)] == [0] * 3


def test_fewer_rows_than_files_fails_with_one_line(tmp_path):
    docs = {"web-00000": [np.arange(3, 103, dtype=np.int32), np.arange(3, 200, dtype=np.int32)]}
    with pytest.raises(shards.RowDealError) as err:               # 299 stream tokens: 4 rows of 64
        build(tmp_path, docs, seq_len=63, shard_num=8)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg == ("pack.shard_num: the corpus packs into 4 rows of 64 tokens, fewer than its 8 output files "
                   "(pack.shard_num 8); lower pack.shard_num or add data")
    assert not (tmp_path / "sink" / "scatter").exists()           # refused before any work


def two_documents(tmp: Path, **pack):
    """Two real documents (about 60 KB of Python source, one domain) through the whole chain with seed 1, under
    which the former per-document deal put both into file 0 and stopped ("output file 2 of 2 packs into 0 rows")."""
    import sysconfig

    from conftest import write_jsonl

    from pipeline.config import config_from_dict

    root = Path(sysconfig.get_paths()["stdlib"])
    write_jsonl(tmp / "in.jsonl", [{"id": n, "text": (root / n).read_text(encoding="utf-8")}
                                   for n in ("tempfile.py", "ntpath.py")])
    return config_from_dict({
        "data_root": str(tmp / "data"), "seed": 1, "parallelism": 2,
        "sources": [{"domain": "code", "paths": [str(tmp / "in.jsonl")], "lang": "code"}],
        "tokenizer": {"vocab_size": 2000, "sample_chars": 200_000},
        "mixture": {"val_fraction": 0.0, "val_min_docs": 0}, "pack": {"shard_num": 2, **pack}})


@pytest.mark.slow
def test_two_real_documents_fill_two_files_through_the_chain(tmp_path):
    from pipeline.io import read_json, read_parquet
    from pipeline.tasks.corpus import run_all

    summary = run_all(two_documents(tmp_path), "two", progress=False)
    m = read_json(summary["manifest"])
    tok = [n for f in sorted(Path(summary["run_dir"], "tokenize").glob("*.parquet"))
           for n in read_parquet(f, columns=["n_tokens"]).column(0).to_pylist()]
    rows = (sum(tok) + len(tok)) // 129          # seq_len 128: the stream of both documents, each with its EOS
    assert len(tok) == 2 and m["documents"] == 2 and 100 <= rows <= 150
    assert [s["samples"] for s in m["shards"]] == [rows // 2, rows - rows // 2]
    assert m["samples"] == rows and m["dropped_tail_tokens"] == sum(tok) + 2 - rows * 129


@pytest.mark.slow
def test_fewer_rows_than_shard_num_stops_the_chain_with_one_line(tmp_path):
    from pipeline.tasks.corpus import run_all

    with pytest.raises(shards.RowDealError, match=r"^pack.shard_num: the corpus packs into \d+ rows of 129 tokens, "
                                                  r"fewer than its 256 output files \(pack.shard_num 256\); lower "
                                                  r"pack.shard_num or add data$"):
        run_all(two_documents(tmp_path, shard_num=256), "two", progress=False)
