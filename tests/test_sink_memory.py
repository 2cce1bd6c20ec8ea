"""The sink's memory does not grow with the corpus: a writer task over twice the data peaks within 25 %.

Synthetic tokenized shards (real packing, real MindRecord files) at 1x and 2x the tokens, with the same
``pack.shard_mb``: the corpus doubles the number of output files, never the size of one, and each of the two
scatter tasks merges twice the shards into its part (its runs set to two shards' tokens, so both sizes write
several).  Each scatter and writer task runs in a fresh process: the writers' peak RSS of the process tree
(:func:`pipeline.profile.measured`; a writer verifies its file in a child) and each scatter process's own high-water
mark (``VmHWM``) are compared.  The old single-task sink held every token (about 37 bytes per token: 16M tokens would
add ~600 MB), so it fails this.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.io import write_json, write_marker, write_parquet

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SHARD_TOKENS = 1_000_000
DOC_TOKENS = 2_000
SHARD_MB = 4                     # 1M tokens per output file

CHILD = r"""
import json, sys
from pathlib import Path
from pipeline.profile import measured
from pipeline.sink import scatter, shards
rdir, step, arg = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
with measured(rdir, step, str(arg["unit"])) as m:
    if step == "scatter":
        scatter.RUN_TOKENS = arg["run_tokens"]
        scatter.run_scatter_part(rdir, arg["part"], arg["shards"], seed=7, n_files=arg["n_files"], domains=["a", "b"])
    else:
        e = shards.write_output_file(rdir, arg["k"], arg["n_files"], arg["parts"], seq_len=2047, eos_id=2,
                                     bos_id=None, pad_id=3, remainder="drop", domain_field=True, boundaries=False,
                                     n_domains=2)
        m["samples"] = e["samples"]
from pipeline.profile import own_peak_rss_mb
m["maxrss_mb"] = own_peak_rss_mb()     # this process's exact high-water mark (VmHWM), no sampling
print(json.dumps(m))
"""


def make_run(rdir: Path, n_shards: int) -> list[str]:
    rng = np.random.default_rng(n_shards)
    names = []
    for s in range(n_shards):
        name = f"a-{s:05d}"
        docs = SHARD_TOKENS // DOC_TOKENS
        ids = [f"{name}-{i}" for i in range(docs)]
        toks = rng.integers(4, 32000, size=(docs, DOC_TOKENS), dtype=np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(np.arange(docs + 1, dtype=np.int32) * DOC_TOKENS),
                                          pa.array(toks.reshape(-1)))
        path = rdir / "tokenize" / f"{name}.parquet"
        write_marker(path, sha256=write_parquet(pa.table({"doc_id": ids, "domain": ["a" if i % 3 else "b"
                                                                                    for i in range(docs)],
                                                          "tokens": tokens}), path))
        write_parquet(pa.table({"doc_id": ids, "copies": pa.array([1] * docs, pa.int32())}),
                      rdir / "mixture" / f"{name}.parquet")
        names.append(name)
    write_json(rdir / "mixture" / "report.json", {"total_selected_tokens": n_shards * SHARD_TOKENS,
                                                 "total_selected_docs": n_shards * SHARD_TOKENS // DOC_TOKENS})
    return names


def child(rdir: Path, step: str, arg: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(rdir), step, json.dumps(arg)], capture_output=True,
                         text=True, cwd=REPO, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def peaks(rdir: Path, n_shards: int) -> tuple[float, float, int]:
    from pipeline.sink.scatter import n_output_files, part_name

    shards = make_run(rdir, n_shards)
    n_files = n_output_files(n_shards * SHARD_TOKENS, SHARD_MB, 2)
    parts = [part_name(t, 2) for t in range(2)]        # two scatter tasks: twice the data, twice the shards each
    half = n_shards // 2
    # a scatter task is one process and lasts a second or two: its exact high-water mark, since the 0.2 s
    # samples of measured() catch its peak or not by chance (and twice the shards gave twice the chances)
    scat = [child(rdir, "scatter", {"unit": p, "part": p, "shards": shards[t * half:(t + 1) * half],
                                    "n_files": n_files, "run_tokens": 2 * SHARD_TOKENS})["maxrss_mb"]
            for t, p in enumerate(parts)]
    written = [child(rdir, "write", {"unit": k, "k": k, "n_files": n_files, "parts": parts}) for k in (0, 1)]
    assert all(w["samples"] > 0 for w in written)
    return max(scat), max(w["peak_rss_mb"] for w in written), n_files


def test_sink_task_memory_does_not_grow_with_the_corpus(tmp_path):
    scatter1, write1, files1 = peaks(tmp_path / "x1", 8)
    scatter2, write2, files2 = peaks(tmp_path / "x2", 16)
    print(f"peak RSS MB: scatter {scatter1} -> {scatter2}, writer {write1} -> {write2}; files {files1} -> {files2}")
    assert files2 == 2 * files1                    # more data: more files of the same size
    assert write2 <= 1.25 * write1, (write1, write2)
    assert scatter2 <= 1.25 * scatter1, (scatter1, scatter2)
