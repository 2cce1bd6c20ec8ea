"""The sink holds a bounded number of files open, whatever the shard count (#49).

4,096 tokenized shards in two scatter parts, then every writer (with its MindSpore read-back child) and the set,
in a process limited to 256 open files (``ulimit -n 256``).  Each part writes its shards in runs of a few hundred
tokens, so it merges more runs than it may open at once (``MERGE_FAN_IN``) and takes a second merge pass.  The
rows are the corpus stream packed in key order, as from one process without the limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_sink_rows import expected_stream, read_rows, tokenized

pytestmark = pytest.mark.slow
pytest.importorskip("mindspore")
REPO = Path(__file__).resolve().parents[1]
SHARDS = 4096

CHILD = r"""
import json, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from pipeline.sink import mindrecord, scatter, shards
rdir, n_shards = Path(sys.argv[1]), int(sys.argv[2])
scatter.RUN_TOKENS = 300
names = sorted(p.name[:-len(".parquet")] for p in (rdir / "tokenize").glob("*.parquet"))
layout = mindrecord.sink_layout(rdir, seq_len=63, shard_mb=1, shard_num=2, add_bos=False)
n = layout["n_files"]
parts = [scatter.part_name(t, 2) for t in range(2)]
for t, p in enumerate(parts):
    scatter.run_scatter_part(rdir, p, names[t * n_shards // 2:(t + 1) * n_shards // 2], seed=11, n_files=n,
                             domains=layout["domains"])
for k in range(n):
    shards.write_output_file(rdir, k, n, parts, seq_len=63, eos_id=2, bos_id=None, pad_id=0, remainder="drop",
                             domain_field=True, boundaries=False, n_domains=len(layout["domains"]))
m = shards.finalize_set(rdir, n, parts, seq_len=63, domains=layout["domains"], domain_field=True, boundaries=False,
                        extra={"config_sha256": "c"})
print(json.dumps({"files": n, "samples": m["samples"], "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


def test_scatter_and_writers_over_4096_shards_under_ulimit_256(tmp_path):
    import pyarrow as pa

    from pipeline.io import read_json, write_json, write_parquet

    rng = np.random.default_rng(4)
    docs = {f"web-{s:05d}": [rng.integers(3, 500, int(k), dtype=np.int32) for k in rng.integers(5, 60, 3)]
            for s in range(SHARDS)}
    names = tokenized(tmp_path, docs)
    for name in names:
        write_parquet(pa.table({"doc_id": [f"{name}/{i}" for i in range(3)], "copies": [1, 1, 1]}),
                      tmp_path / "mixture" / f"{name}.parquet")
    stream = sum(len(t) for ts in docs.values() for t in ts)
    write_json(tmp_path / "mixture" / "report.json", {"total_selected_tokens": stream,
                                                     "total_selected_docs": 3 * SHARDS, "domains": ["web"],
                                                     "per_domain": {"web": {}}})
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), str(SHARDS)], capture_output=True, text=True,
                         cwd=REPO, check=False, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["limit"] == 256 and res["files"] == 2
    got = read_rows(tmp_path / "mindrecord")
    assert np.array_equal(np.concatenate(got), expected_stream(docs, 63, "drop", False))
    assert (sum(len(r) for r in got) == res["samples"]
            == read_json(tmp_path / "mindrecord" / "manifest.json")["samples"])
