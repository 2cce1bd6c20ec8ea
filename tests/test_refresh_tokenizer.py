"""#53: an incremental refresh keeps the tokenizer of the release it extends, and a different one is refused.

Two real runs of the chain through the CLI path (:func:`pipeline.tasks.corpus.run_all`): a full build publishes
release ``r1``; the sources then gain new documents and a refresh with ``minhash.use_index`` runs. Its tokenizer is
``r1``'s byte for byte (even with another ``tokenizer.vocab_size`` in its config), the corpus manifest names the
release it extends, and the index records every release's tokenizer digest.
"""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("mindspore")


def _run(path, run_id: str) -> dict:
    from pipeline.config import load_config
    from pipeline.tasks.corpus import run_all

    return run_all(load_config(path), run_id, progress=False)


def test_an_incremental_refresh_keeps_the_release_tokenizer_and_refuses_another(tmp_path):
    from conftest import stdlib_records, tiny_config, write_jsonl

    from pipeline.configkit import ConfigError
    from pipeline.io import sha256_file

    path = tiny_config(tmp_path)
    first = _run(path, "r1")
    r1 = tmp_path / "data" / "runs" / "r1"
    r1_sha = sha256_file(r1 / "tokenizer" / "spm.model")

    write_jsonl(tmp_path / "in" / "code.jsonl", stdlib_records(24))        # 12 old documents, 12 new ones
    cfg = yaml.safe_load(path.read_text())
    cfg["minhash"] = {"use_index": True}
    cfg["tokenizer"]["vocab_size"] = 700                                  # a refresh does not retrain
    path.write_text(yaml.safe_dump(cfg))
    second = _run(path, "r2")
    r2 = tmp_path / "data" / "runs" / "r2"
    assert sha256_file(r2 / "tokenizer" / "spm.model") == r1_sha
    manifest = json.loads((r2 / "mindrecord" / "manifest.json").read_text())
    assert manifest["tokenizer_sha256"] == r1_sha
    assert manifest["extends_release"] == {"name": "r1", "tokenizer_sha256": r1_sha}
    assert "extends_release" not in json.loads((r1 / "mindrecord" / "manifest.json").read_text())
    stats = second["dedup_release"]
    assert stats["releases"] == 2 and first["dedup_release"]["releases"] == 1
    listing = json.loads(next((tmp_path / "data" / "dedup_index").rglob("releases.json")).read_text())
    assert [(r["name"], r["tokenizer_sha256"]) for r in listing["releases"]] == [("r1", r1_sha), ("r2", r1_sha)]
    removed = json.loads((r2 / "corpus_summary.json").read_text())["stats"]["minhash"]["code"]["removed"]
    assert removed["near_duplicate_of_previous_release"] == 12

    _training_continues_the_release(tmp_path, path, r1, r2)

    other = tmp_path / "other.model"                    # r2's rerun extends r1 still; another tokenizer is refused
    other.write_bytes((r1 / "tokenizer" / "spm.model").read_bytes() + b"\n")
    cfg["tokenizer"]["model_path"] = str(other)
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"tokenizer.model_path: .*other.model \(sha256 [0-9a-f]{12}\) is not the "
                                          r"tokenizer of release r1 .*sha256 " + r1_sha[:12]):
        _run(path, "r2")


def _training_continues_the_release(tmp_path, path, r1, r2) -> None:
    """#53: with ``train.from_release: weights``, a stage on r2 before any training run on r1 finished is a clear
    error (the continued training itself runs through Airflow in ``test_refresh_airflow.py``)."""
    from pipeline.config import load_config
    from pipeline.tasks.pretrain import build_job, stage_dir

    cfg = yaml.safe_load(path.read_text())
    cfg["train"].update(from_release="weights")
    path.write_text(yaml.safe_dump(cfg))
    cfg = load_config(path)
    s1, s2 = (json.loads((r / "corpus_summary.json").read_text()) for r in (r1, r2))
    assert s2["extends_release"]["name"] == "r1" and s1["extends_release"] is None
    with pytest.raises(FileNotFoundError, match=r"train.from_release: weights: no training run on release 'r1' "
                                                r"finished stage 'main'"):
        build_job(cfg, s2, stage_dir(cfg.data_root, "t2", "main"))
