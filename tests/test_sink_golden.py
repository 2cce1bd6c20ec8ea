"""The sink writes the same bytes as before the stage packages (#17): golden sha256 of a small fixed token set.

The values were recorded with the pre-#17 ``pipeline/mindrecord.py`` (flat layout) and reproduced by the current
``pipeline.sink`` writer; they depend only on the packing code, numpy and the pinned MindSpore ``FileWriter``.  A
change here is a change of the shipped shards: it needs a reason, not a new recording.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pipeline.sink import mindrecord

GOLDEN = {
    "full/golden-00000-of-00003.mindrecord": "88ae196259acfca8d2c41afe918ed9ae3be77aa5f168f803d48cabcde8745c04",
    "full/golden-00000-of-00003.mindrecord.db": "8e129fd0b0e327268d31ff3af619aef3b76231dc9accc7abf94e374c9f15a1a0",
    "full/golden-00001-of-00003.mindrecord": "c39868a8113152c2c2e8c80ff2cdc69ed3f780655de4e260e6ff8f9b4e60f01e",
    "full/golden-00001-of-00003.mindrecord.db": "5a168e938d9bce0ff1ecb1f719a4480c160667cae0d3c3db310271499ce31041",
    "full/golden-00002-of-00003.mindrecord": "799df39e57e45a6aea0029023b2b50898138bade946d509a84b15ff75b2a3a79",
    "full/golden-00002-of-00003.mindrecord.db": "e21e4986c1fb2a235e618795c92358aca18661c0540a800c292345996d8f18be",
    "full/manifest.json": "8f5bfba4f8b3aefe09bd39c9b0519f90b64ce1ab965838506de8a081b6de284c",
    "plain/golden-00000-of-00003.mindrecord": "474bc8a04252cc0f73b49d0c66fddedb4784981861c2c2dbeba4f531baa0640f",
    "plain/golden-00000-of-00003.mindrecord.db": "a392fc39c211fd374058455acf45074a014e5fd7421dd178131a63cbee93d889",
    "plain/golden-00001-of-00003.mindrecord": "b23dba8b2e179db9b1e41f1007d7ad9b13e104424f7502be8bc2f150a8a89279",
    "plain/golden-00001-of-00003.mindrecord.db": "45b8550d15121235557c8f628ee7daf454385510342714f2cf934cba65d4c1cd",
    "plain/golden-00002-of-00003.mindrecord": "c9c156f6cedbfe9cb469a5ebbbfa2e687fdcb00737d735f3feaea6f665847b65",
    "plain/golden-00002-of-00003.mindrecord.db": "e1f68fdd5c3f299c17767a76c9efecd48ee7915e64bd6a380a62954c6986121a",
    "plain/manifest.json": "467fec43e056fad058309cfe4febd3d5ce1b572165afb4f389c7c1f8edf372d0",
}


def test_token_sets_are_byte_identical_to_the_recorded_ones(tmp_path):
    pytest.importorskip("mindspore")
    rng = np.random.default_rng(7)
    docs = [rng.integers(3, 500, size=int(n), dtype=np.int32) for n in rng.integers(5, 90, size=60)]
    domains = ["code" if i % 3 == 0 else "web" if i % 3 == 1 else "zh" for i in range(60)]
    for name, kw in {"plain": {}, "full": {"boundaries": True, "remainder": "pad", "bos_id": 1}}.items():
        args = {"seq_len": 31, "shard_num": 3, "name": "golden", "eos_id": 2, "bos_id": None, "pad_id": 0,
                "domain_field": True, **kw}
        mindrecord.write_token_set(tmp_path / name, domains, docs, **args)
    got = {str(p.relative_to(tmp_path)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    assert got == GOLDEN
