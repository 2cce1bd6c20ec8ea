"""Packing and the MindRecord sink on real text: exact packing, exact round trips through MindDataset (training
and validation sets), byte-identical reruns, and a verify that names the damaged shard."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import prose_records, stdlib_records
from test_tokenizer import SMALL, write_quality_shards

from pipeline.io import read_json, read_parquet, write_json
from pipeline.sink import mindrecord, mixture, packing, validation
from pipeline.sink.config import MixtureConfig
from pipeline.sink.mindrecord import ShardError
from pipeline.tokenizer import run as tokenizer

SEQ = 63
MIX = MixtureConfig(weights={"code": 0.5, "prose": 0.5}, val_min_docs=2)


def build(rdir: Path, seed: int = 5, workers: int = 1) -> dict:
    """quality shards -> tokenizer -> tokenize -> mixture -> training and validation MindRecord sets."""
    shards = write_quality_shards(rdir, {"code": stdlib_records(20), "prose": prose_records(40)}, per_shard=20)
    tok = tokenizer.train_tokenizer(SMALL, rdir, shards, seed, weights=MIX.weights)
    for s in shards:
        tokenizer.run_tokenize_shard(rdir, s)
    mixture.plan_mixture(MIX, rdir, shards, seed)
    common = dict(eos_id=tok["eos_id"], bos_id=tok["bos_id"], pad_id=tok["pad_id"], vocab_size=tok["vocab_size"],
                  tokenizer_sha256=tok["sha256"], config_sha256="cfg", boundaries=True)
    train = mindrecord.write_mindrecord(rdir, shards, seq_len=SEQ, shard_num=3, add_bos=False, seed=seed,
                                        mixture=True, workers=workers, **common)
    val = validation.write_validation(rdir, seq_len=SEQ, add_bos=False, **common)
    return {"shards": shards, "tok": tok, "train": train, "val": val}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    rdir = tmp_path_factory.mktemp("mr")
    return rdir, build(rdir)


def read_rows(mr_dir: Path) -> list[dict]:
    """Every row of every shard (manifest order), all fields, through MindDataset."""
    import mindspore.dataset as ds

    manifest = read_json(mr_dir / "manifest.json")
    out = []
    for f in mindrecord.dataset_files(mr_dir):
        d = ds.MindDataset(f, columns_list=manifest["fields"], shuffle=False)
        out += [dict(zip(manifest["fields"], r, strict=True)) for r in d.create_tuple_iterator(output_numpy=True,
                                                                                               num_epochs=1)]
    return out


def split_at(stream: list[int], eos: int) -> list[list[int]]:
    """Documents terminated by EOS; an unterminated tail is left out."""
    docs, cur = [], []
    for t in stream:
        if t == eos:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs


def test_pack_cuts_exact_rows_with_eos_bos_padding_and_boundaries():
    docs = [np.array(t, np.int32) for t in ([5, 6, 7], [8], [9, 10, 11, 12])]
    lens = np.array([3, 1, 4])
    flat, starts, dom = np.concatenate(docs), np.array([0, 3, 4]), np.array([0, 1, 0], np.int32)
    p = packing.pack(flat, starts, lens, dom, np.arange(3), seq_len=3, eos_id=2, bos_id=None, pad_id=3,
                        boundaries=True)
    assert p["rows"].tolist() == [[5, 6, 7, 2], [8, 2, 9, 10]] and p["dropped_tail_tokens"] == 3
    assert p["row_domain"].tolist() == [0, 1] and p["tokens_per_domain"].tolist() == [6, 2]
    assert [s.tolist() for s in p["row_starts"]] == [[0], [0, 2]]
    p = packing.pack(flat, starts, lens, dom, np.array([2, 0]), seq_len=3, eos_id=2, bos_id=1, pad_id=3,
                        remainder="pad", boundaries=True)
    assert p["rows"].tolist() == [[1, 9, 10, 11], [12, 2, 1, 5], [6, 7, 2, 3]] and p["padded_tokens"] == 1
    assert [s.tolist() for s in p["row_starts"]] == [[0], [0, 2], [0]]
    assert p["tokens_per_domain"].tolist() == [11, 0]


def test_training_rows_round_trip_exactly_and_hold_the_selected_documents(run):
    rdir, built = run
    manifest = built["train"]
    rows = read_rows(rdir / "mindrecord")
    assert len(rows) == manifest["samples"] == sum(s["samples"] for s in manifest["shards"])
    ordered, offset, per_file = [], 0, []      # the files in order are the one packed stream (layout "contiguous")
    assert manifest["layout"] == "contiguous"
    for s in manifest["shards"]:
        part = np.stack([r["input_ids"] for r in rows[offset:offset + s["samples"]]])
        assert hashlib.sha256(part.tobytes()).hexdigest() == s["rows_sha256"]
        per_file.append(part)
        ordered += rows[offset:offset + s["samples"]]
        offset += s["samples"]
    ids = np.stack([r["input_ids"] for r in ordered])
    assert ids.dtype == np.int32 and ids.shape[1] == SEQ + 1
    joined = "".join(s["rows_sha256"] for s in manifest["shards"])
    assert hashlib.sha256(joined.encode()).hexdigest() == manifest["rows_sha256"]
    eos = built["tok"]["eos_id"]
    for r in ordered:               # boundaries: 0, then every position right after an EOS
        after_eos = (np.flatnonzero(r["input_ids"][:-1] == eos) + 1).tolist()
        assert r["segment_starts"].tolist() == [0] + after_eos
    # split the stream at EOS: every complete document is one selected copy; only the stream's tail copy is cut
    complete = Counter(map(tuple, split_at(ids.reshape(-1).tolist(), eos)))
    selected = Counter()
    for s in built["shards"]:
        tok = read_parquet(rdir / "tokenize" / f"{s}.parquet", columns=["tokens"]).column("tokens").to_pylist()
        copies = read_parquet(rdir / "mixture" / f"{s}.parquet", columns=["copies"]).column("copies").to_pylist()
        for t, c in zip(tok, copies, strict=True):
            selected[tuple(t)] += c
    # rows are dealt to files: documents continue across file boundaries, and only the stream's tail is dropped
    assert not complete - selected and sum((selected - complete).values()) == 1
    counts = [s["samples"] for s in manifest["shards"]]
    assert max(counts) - min(counts) <= 1
    assert manifest["tokens_per_domain"]["code"] + manifest["tokens_per_domain"]["prose"] == ids.size
    assert manifest["domains"] == ["code", "prose"]
    assert {r["domain_id"].item() for r in rows} == {0, 1}


def test_validation_sets_hold_exactly_the_heldout_documents(run):
    rdir, built = run
    held = read_parquet(rdir / "mixture" / "heldout.parquet").to_pylist()
    assert set(built["val"]["sets"]) == {"code", "prose"}
    for dom, info in built["val"]["sets"].items():
        sub = read_json(rdir / "mindrecord_val" / info["dir"] / "manifest.json")
        want_ids = [h["doc_id"] for h in held if h["domain"] == dom]
        assert sub["doc_ids"] == want_ids and sub["remainder"] == "pad" and sub["split"] == "validation"
        stream = np.concatenate([r["input_ids"] for r in read_rows(rdir / "mindrecord_val" / info["dir"])])
        assert (stream[len(stream) - sub["padded_tokens"]:] == built["tok"]["pad_id"]).all()
        body = stream[:len(stream) - sub["padded_tokens"]].tolist()
        assert body[-1] == built["tok"]["eos_id"]
        tokens = {}
        for s in built["shards"]:
            t = read_parquet(rdir / "tokenize" / f"{s}.parquet", columns=["doc_id", "tokens"])
            tokens.update(zip(t.column("doc_id").to_pylist(), t.column("tokens").to_pylist(), strict=True))
        assert split_at(body, built["tok"]["eos_id"]) == [tokens[i] for i in want_ids]


def _hashes(rdir: Path) -> dict[str, str]:
    """sha256 of every output file except the ``.done`` markers (they hold the run's own paths)."""
    return {str(p.relative_to(rdir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for sub in ("mindrecord", "mindrecord_val", "mixture", "tokenizer")
            for p in sorted((rdir / sub).rglob("*")) if p.is_file() and p.suffix != ".done"}


@pytest.mark.slow
def test_same_seed_gives_byte_identical_shards_also_with_parallel_writers(run, tmp_path):
    rdir, built = run
    first = _hashes(rdir)
    build(tmp_path / "again", workers=2)
    assert _hashes(tmp_path / "again") == first and len([k for k in first if k.endswith(".mindrecord")]) == 5
    other = build(tmp_path / "seed6", seed=6)
    assert other["train"]["rows_sha256"] != built["train"]["rows_sha256"]


def test_verify_reads_every_shard_and_every_rank(run):
    rdir, built = run
    samples = built["train"]["samples"]
    res = mindrecord.verify(rdir / "mindrecord", full_read=True, num_shards=4)
    assert res["read"] == samples and res["reader_max_rss_mb"] < 2048
    assert res["ranks"] == {"num_shards": 4, "rows_per_rank": -(-samples // 4), "padding_rows": -samples % 4}
    val = mindrecord.verify(rdir / "mindrecord_val", full_read=True)
    assert {k: v["read"] for k, v in val["sets"].items()} == {k: v["samples"] for k, v in built["val"]["sets"].items()}


def test_the_reader_reports_its_own_peak_not_its_parents(run):
    """subprocess starts the reader with vfork: ``ru_maxrss`` would fold this process's peak in at exec."""
    import numpy as np

    from pipeline.profile import own_peak_rss_mb

    rdir, _ = run
    ballast = np.ones(1 << 30, np.uint8)                # 1 GiB resident in this process
    res = mindrecord.verify(rdir / "mindrecord", full_read=True)
    assert ballast[-1] == 1 and own_peak_rss_mb() > 1024
    assert res["reader_max_rss_mb"] < own_peak_rss_mb() - 900, res


def test_a_collection_is_read_in_one_child_and_a_damaged_set_is_named(run, tmp_path, monkeypatch):
    """Every set of ``mindrecord_val`` (one per domain) is read by one reader process (one MindSpore start, not
    one per domain: 7 starts cost 10 CPU-s of write_validation at any corpus size), and a silently wrong row in
    the last set still names that set's file."""
    from pipeline.sink import verify as verify_mod

    rdir, _ = run
    shutil.copytree(rdir / "mindrecord_val", tmp_path / "val")
    calls = []
    real = verify_mod._read_in_child
    monkeypatch.setattr(verify_mod, "_read_in_child", lambda dirs, *a: calls.append(len(dirs)) or real(dirs, *a))
    sets = read_json(tmp_path / "val" / "manifest.json")["sets"]
    assert len(sets) >= 2
    res = mindrecord.verify(tmp_path / "val", full_read=True)
    assert calls == [len(sets)] and {k: v["read"] for k, v in res["sets"].items()} == {
        k: v["samples"] for k, v in sets.items()}
    last = tmp_path / "val" / sets[max(sets)]["dir"]
    name = read_json(last / "manifest.json")["shards"][0]["file"]
    _flip(last / name, (1 << 20) + 5000, 1)
    _rebless(last, name)
    with pytest.raises(ShardError, match=rf"{last / name}: decoded rows differ from what was written"):
        mindrecord.verify(tmp_path / "val", full_read=True)
    assert calls == [len(sets)] * 2


@pytest.fixture
def damaged(run, tmp_path):
    rdir, _ = run
    shutil.copytree(rdir / "mindrecord", tmp_path / "mr")
    return tmp_path / "mr", read_json(tmp_path / "mr" / "manifest.json")["shards"][1]["file"]


def _rebless(mr: Path, name: str) -> None:
    """Rewrite the manifest's size and sha256 of ``name``, as if the shard had been damaged before hashing."""
    manifest = read_json(mr / "manifest.json")
    entry = next(s for s in manifest["shards"] if s["file"] == name)
    entry["bytes"] = (mr / name).stat().st_size
    entry["sha256"] = hashlib.sha256((mr / name).read_bytes()).hexdigest()
    write_json(mr / "manifest.json", manifest)


def _flip(path: Path, offset: int, n: int = 4096) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        block = fh.read(n)
        fh.seek(offset)
        fh.write(bytes(b ^ 0x5A for b in block))


def test_corrupt_truncated_or_missing_shard_is_named(damaged):
    mr, name = damaged
    _flip(mr / name, (1 << 20) + 100)
    with pytest.raises(ShardError, match=rf"{name}: sha256 differs from the manifest"):
        mindrecord.verify(mr, full_read=False)
    size = (mr / name).stat().st_size
    with open(mr / name, "r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(ShardError, match=rf"{name}: {size // 2} bytes, manifest says {size}"):
        mindrecord.verify(mr, full_read=False)
    (mr / f"{name}.db").unlink()
    with pytest.raises(ShardError, match=rf"{name}.db: missing"):
        mindrecord.verify(mr, full_read=False)


def test_silently_wrong_rows_are_caught_by_the_content_hash(damaged):
    mr, name = damaged
    _flip(mr / name, (1 << 20) + 5000, 1)      # one byte of row data: MindDataset decodes it without any error
    _rebless(mr, name)
    with pytest.raises(ShardError, match=rf"{name}: decoded rows differ from what was written"):
        mindrecord.verify(mr, full_read=True)


def test_a_shard_that_makes_the_reader_allocate_without_bound_is_named_not_fatal(damaged):
    mr, name = damaged
    _flip(mr / name, (1 << 20) + 100)          # 4 KB of row data: the reader asks for more memory than exists
    _rebless(mr, name)
    with pytest.raises(ShardError, match=rf"{name}: unreadable through MindDataset \(Out of memory"):
        mindrecord.verify(mr, full_read=True, mem_limit_mb=3072)


def test_truncated_shard_fails_the_read_by_name_and_memory_limit_is_enforced(damaged):
    mr, name = damaged
    with open(mr / name, "r+b") as fh:
        fh.truncate((1 << 20) + 5000)
    _rebless(mr, name)
    with pytest.raises(ShardError, match=rf"{name}: unreadable through MindDataset"):
        mindrecord.verify(mr, full_read=True)
    with pytest.raises(ShardError, match=r"address-space limit 200 MB"):
        mindrecord.verify(mr, full_read=True, mem_limit_mb=200)


def test_verify_command_exit_codes(run, damaged, capsys):
    from pipeline.cli import main

    rdir, _ = run
    assert main(["verify", str(rdir / "mindrecord"), "--ranks", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"]["num_shards"] == 2
    mr, name = damaged
    (mr / name).write_bytes(b"")
    assert main(["verify", str(mr)]) == 2
    assert name in capsys.readouterr().err


def test_test_sets_and_repacks_use_the_sink_writer_and_manifest(tmp_path):
    """One writer, one manifest format: a set written by ``write_rows`` (test data, long-context re-packs) is
    verified like the corpus, decoded rows included."""
    from bytes_data import pack_bytes, stdlib_text, write_mindrecord

    rows = pack_bytes(stdlib_text("json.decoder"), 63)
    write_mindrecord(rows, str(tmp_path / "set"), shards=2)
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert manifest["fields"] == ["input_ids"] and manifest["row_length"] == 64
    assert all(s["content_sha256"] for s in manifest["shards"])
    assert mindrecord.verify(tmp_path / "set", num_shards=2)["read"] == len(rows)


def test_long_context_repacking_reads_the_corpus_files_as_contiguous_streams(run):
    from pipeline.train.repack import stream_rows

    rdir, built = run
    digest: dict = {}
    rows = list(stream_rows(str(rdir / "mindrecord"), digest))
    assert digest == {"rows": built["train"]["samples"], "sha256": built["train"]["rows_sha256"],
                      "contiguous_verified": True}
    assert len(rows) == built["train"]["samples"]


@pytest.mark.parametrize("remainder,bos,boundaries", [("drop", None, False), ("pad", 1, True)])
def test_stream_packer_gives_the_same_rows_in_any_chunking(remainder, bos, boundaries):
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 40, size=300).astype(np.int64)
    flat = rng.integers(4, 900, size=int(lens.sum())).astype(np.int32)
    starts, dom = np.cumsum(lens) - lens, rng.integers(0, 3, size=300).astype(np.int32)
    order = rng.permutation(300)
    kw = dict(seq_len=15, eos_id=2, bos_id=bos, pad_id=0)
    whole = packing.pack(flat, starts, lens, dom, order, remainder=remainder, boundaries=boundaries, **kw)
    packer = packing.StreamPacker(boundaries=boundaries, n_domains=3, **kw)
    parts = []
    for chunk in np.split(order, [1, 2, 50, 51, 200]):
        parts += list(packer.feed(flat, starts, lens, dom, chunk))
    parts += list(packer.finish(remainder))
    assert np.array_equal(np.concatenate([p[0] for p in parts]), whole["rows"])
    assert np.array_equal(np.concatenate([p[1] for p in parts]), whole["row_domain"])
    assert packer.tokens_per_domain.tolist() == whole["tokens_per_domain"].tolist()
    assert (packer.dropped_tail_tokens, packer.padded_tokens) == (whole["dropped_tail_tokens"],
                                                                   whole["padded_tokens"])
    if boundaries:
        got = [s.tolist() for p in parts for s in p[2]]
        assert got == [s.tolist() for s in whole["row_starts"]]
