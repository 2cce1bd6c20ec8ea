"""Confined paths: sources, data roots and corpus summaries outside the deployment's allowed roots are refused,
naming the field and the roots (`..`, absolute paths, symlinks out of a root, s3:// URIs vs allowed buckets)."""

from __future__ import annotations

import os

import pytest
import yaml
from conftest import prose_records, write_jsonl

from pipeline.config import load_config
from pipeline.confine import ENV, PathNotAllowed, allowed_roots, check_path, static_root
from pipeline.tasks.corpus import prepare_run


def _config(tmp, paths: list[str]) -> str:
    cfg = {"data_root": str(tmp / "deploy" / "data"), "sources": [{"domain": "prose", "paths": paths}]}
    path = tmp / "deploy" / "mindloom.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return str(path)


@pytest.fixture
def outside(tmp_path):
    return write_jsonl(tmp_path / "elsewhere" / "secret.jsonl", prose_records(3))


def test_sources_inside_the_config_folder_are_planned(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    write_jsonl(tmp_path / "deploy" / "in" / "a.jsonl", prose_records(3))
    cfg_path = _config(tmp_path, [str(tmp_path / "deploy" / "in" / "*.jsonl")])
    specs = prepare_run(load_config(cfg_path), "ok", cfg_path)
    assert [u["path"] for s in specs for u in s["units"]] == [str(tmp_path / "deploy" / "in" / "a.jsonl")]


@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_dotdot_and_absolute_paths_out_of_the_roots_are_refused(tmp_path, monkeypatch, outside, kind):
    monkeypatch.delenv(ENV, raising=False)
    path = str(tmp_path / "deploy" / ".." / "elsewhere" / "secret.jsonl") if kind == "dotdot" else str(outside)
    cfg_path = _config(tmp_path, [path])
    with pytest.raises(PathNotAllowed, match=r"sources\[0\]\.paths\[0\]: .*secret\.jsonl.* is outside the allowed "
                                             r"roots .*deploy.*MINDLOOM_ALLOWED_ROOTS"):
        prepare_run(load_config(cfg_path), "bad", cfg_path)
    assert not (tmp_path / "deploy" / "data" / "runs" / "bad").exists()     # refused before anything was written


def test_a_symlink_inside_a_root_pointing_out_is_refused(tmp_path, monkeypatch, outside):
    monkeypatch.delenv(ENV, raising=False)
    (tmp_path / "deploy" / "in").mkdir(parents=True)
    os.symlink(outside, tmp_path / "deploy" / "in" / "link.jsonl")
    cfg_path = _config(tmp_path, [str(tmp_path / "deploy" / "in" / "*.jsonl")])
    with pytest.raises(PathNotAllowed, match=r"sources\[0\] \(prose\): .*link\.jsonl \(resolves to .*elsewhere/"
                                             r"secret\.jsonl\) is outside the allowed roots"):
        prepare_run(load_config(cfg_path), "link", cfg_path)


def test_declared_roots_replace_the_defaults_and_cover_the_data_root(tmp_path, monkeypatch, outside):
    write_jsonl(tmp_path / "deploy" / "in" / "a.jsonl", prose_records(3))
    cfg_path = _config(tmp_path, [str(tmp_path / "deploy" / "in" / "a.jsonl")])
    monkeypatch.setenv(ENV, str(outside.parent))
    with pytest.raises(PathNotAllowed, match=r"^data_root: "):
        prepare_run(load_config(cfg_path), "declared", cfg_path)
    monkeypatch.setenv(ENV, ",".join([str(tmp_path / "deploy"), str(outside.parent)]))
    assert prepare_run(load_config(cfg_path), "declared", cfg_path)


def test_uris_must_lie_under_an_allowed_bucket_prefix(monkeypatch):
    monkeypatch.setenv(ENV, "s3://lake/fineweb, /srv/data")
    roots = allowed_roots("/srv/data/mindloom")
    assert check_path("s3://lake/fineweb/part-1.jsonl.zst", roots, "x") == "s3://lake/fineweb/part-1.jsonl.zst"
    for bad in ("s3://lake/other/part-1.jsonl", "s3://lakehouse/fineweb/a", "s3://lake/fineweb/../secret/a",
                "gs://lake/fineweb/a"):
        with pytest.raises(PathNotAllowed, match="x: "):
            check_path(bad, roots, "x")
    assert static_root("s3://lake/fineweb/**/*.jsonl") == "s3://lake/fineweb"


def test_a_corpus_summary_pointing_out_of_the_data_root_is_refused(tmp_path, monkeypatch):
    from pipeline.tasks.corpus_choice import resolve_corpus

    monkeypatch.delenv(ENV, raising=False)
    cfg = load_config(_config(tmp_path, [str(tmp_path / "deploy" / "in" / "a.jsonl")]))
    event = {"mindrecord_dir": "/etc", "run_dir": str(tmp_path / "deploy" / "data" / "runs" / "r")}
    with pytest.raises(PathNotAllowed, match=r"corpus mindrecord_dir: /etc is outside"):
        resolve_corpus({}, [event], cfg=cfg)
