"""The Megatron sink (pack.formats: [mindrecord, megatron]): each output file's documents as Megatron's .bin/.idx,
written in the same pass as the MindRecord file, read back by megatron-core's own ``IndexedDataset``.

Synthetic tokenized shards through the real sink (test_sink_rows' harness): three files, documents that straddle
files. Every document copy is in exactly one .bin, as ``[BOS] tokens EOS`` in stream order; the documents of all
files, concatenated and cut into rows of seq_len + 1, are the MindRecord rows; the manifest records both formats'
digests and the ``data_path`` blend."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from pipeline.io import sha256_file
from pipeline.sink import megatron, mindrecord
from tests.conftest import require

pytest.importorskip("mindspore")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from test_sink_rows import build, read_rows  # noqa: E402

SEQ = 16


def _docs():
    rng = np.random.default_rng(3)
    return {f"{dom}-{i}": [rng.integers(3, 500, rng.integers(5, 60)).astype(np.int32) for _ in range(12)]
            for dom in ("web", "code") for i in range(2)}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    rdir = tmp_path_factory.mktemp("mega")
    manifest = build(rdir, _docs(), seq_len=SEQ, shard_num=3, bos=True, megatron_dtype="uint16")
    return rdir / "mindrecord", manifest


def test_documents_in_the_bin_files_are_the_mindrecord_stream(written):
    mr, manifest = written
    files = manifest["shards"]
    assert len(files) == 3 and all(f["megatron"]["dtype"] == "uint16" for f in files)
    docs = [d for f in files for d in megatron.read_documents(mr / f["megatron"]["prefix"])]
    assert len(docs) == manifest["documents"] == sum(f["megatron"]["documents"] for f in files) == 48
    assert all(d[0] == 1 and d[-1] == 2 for d in docs)  # BOS ... EOS around every document
    stream = np.concatenate(docs).astype(np.int32)
    rows = np.concatenate([r.reshape(-1) for r in read_rows(mr)])
    assert np.array_equal(stream[:len(rows)], rows)
    assert len(stream) - len(rows) == manifest["dropped_tail_tokens"]
    for f in files:  # the manifest's digests are the files'
        assert sha256_file(mr / f"{f['megatron']['prefix']}.bin") == f["megatron"]["bin_sha256"]
        assert sha256_file(mr / f"{f['megatron']['prefix']}.idx") == f["megatron"]["idx_sha256"]
    blend = manifest["megatron"]["data_path"]
    assert blend[1::2] == [f["megatron"]["prefix"] for f in files]
    assert abs(sum(blend[::2]) - 1) < 1e-9 and manifest["megatron"]["documents"] == 48


def test_megatron_cores_own_reader_sees_the_same_documents(written):
    from megatron_core import ensure

    root, how = ensure()
    require(root is not None, how)
    mr, manifest = written
    prefixes = [str(mr / f["megatron"]["prefix"]) for f in manifest["shards"]]
    script = (f"import sys, json; sys.path.insert(0, {str(root)!r})\n"
              "from megatron.core.datasets.indexed_dataset import IndexedDataset\n"
              "out = []\n"
              "for p in json.loads(sys.argv[1]):\n"
              "    ds = IndexedDataset(p, multimodal=False, mmap=True)\n"
              "    out.append({'n': len(ds), 'docs': int(ds.document_indices.shape[0]) - 1,\n"
              "                'dtype': str(ds.index.dtype),\n"
              "                'tokens': [ds[i].astype('int64').tolist() for i in range(len(ds))]})\n"
              "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", script, json.dumps(prefixes)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    for p, got in zip(prefixes, theirs, strict=True):
        ours = megatron.read_documents(p)
        assert got["n"] == got["docs"] == len(ours) and "uint16" in got["dtype"]
        assert got["tokens"] == [d.astype(np.int64).tolist() for d in ours]


def test_the_formats_field_is_checked_and_mindrecord_stays():
    from pipeline.configkit import ConfigError
    from pipeline.sink.config import PackConfig

    assert PackConfig().formats == ["mindrecord"]
    with pytest.raises(ConfigError, match="pack.formats: 'webdataset' is not a format"):
        PackConfig(formats=["mindrecord", "webdataset"])
    with pytest.raises(ConfigError, match="must include mindrecord"):
        PackConfig(formats=["megatron"])
    assert megatron.token_dtype(65535) == "uint16" and megatron.token_dtype(65536) == "int32"
    assert mindrecord.FILE_PAD is not None
