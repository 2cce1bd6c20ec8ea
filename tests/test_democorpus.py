"""Tests for pipeline.democorpus: the offline ``code`` domain always runs; network domains skip without PyPI."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from pipeline import democorpus as dc

ROOT = Path(__file__).resolve().parents[1]
# Downloads are cached across test runs (the cache is git-ignored) so only the first run pays for them.
NET_CACHE = Path(os.environ.get("MINDLOOM_DEMO_CACHE", ROOT / ".cache" / "demo-sources"))
META_KEYS = {"package", "version", "path", "license", "lang"}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _check_records(recs: list[dict], domain: str) -> None:
    assert recs, f"no records in {domain}"
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)), "ids must be unique"
    assert ids == sorted(ids)
    for r in recs:
        assert set(r) == {"id", "text", "source", "domain", "meta"}
        assert r["domain"] == domain and r["id"].startswith(f"{domain}/{r['source']}/")
        assert isinstance(r["text"], str) and r["text"].strip()
        assert META_KEYS <= set(r["meta"]) and all(r["meta"][k] for k in META_KEYS)


def _build_or_skip(tmp_path: Path, domains: list[str], max_docs: int) -> dict:
    try:
        return dc.build_demo_corpus(tmp_path / "out", NET_CACHE, domains=domains, max_docs_per_domain=max_docs)
    except dc.SourceUnavailable as exc:
        pytest.skip(f"PyPI unreachable: {exc}")


def test_code_domain_is_deterministic_and_has_provenance(tmp_path: Path) -> None:
    a = dc.build_demo_corpus(tmp_path / "a", tmp_path / "cache", domains=["code"], max_docs_per_domain=30)
    b = dc.build_demo_corpus(tmp_path / "b", tmp_path / "cache", domains=["code"], max_docs_per_domain=30)
    assert a["docs"] == b["docs"] == {"code": 30}
    assert _sha(a["files"]["code"]) == _sha(b["files"]["code"])
    assert a["bytes"]["code"] == a["files"]["code"].stat().st_size
    recs = _records(a["files"]["code"])
    _check_records(recs, "code")
    for r in recs:
        assert r["meta"]["license"] == "PSF-2.0" and r["meta"]["lang"] == "python"
        assert r["meta"]["path"].startswith("Lib/") and r["meta"]["path"].endswith(".py")
        assert "/test/" not in r["meta"]["path"] and "/tests/" not in r["meta"]["path"]
    # atomic write: nothing but the final file is left behind
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["code.jsonl"]
    # another seed picks another sample
    c = dc.build_demo_corpus(tmp_path / "c", tmp_path / "cache", domains=["code"], max_docs_per_domain=30, seed=1)
    assert _sha(c["files"]["code"]) != _sha(a["files"]["code"])


def test_main_cli_code_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = dc.main(["--out", str(tmp_path / "o"), "--cache", str(tmp_path / "c"), "--domains", "code",
                  "--max-docs", "3"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["docs"] == {"code": 3} and Path(summary["files"]["code"]).is_file()


def test_unknown_domain_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bogus"):
        dc.build_demo_corpus(tmp_path, tmp_path, domains=["bogus"])


def test_download_failure_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # closed loopback port: fails fast
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no extra index or find-links from a pip.conf
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(dc.SourceUnavailable, match=r"could not download gensim==4\.3\.3 from PyPI"):
        dc.build_demo_corpus(tmp_path / "o", tmp_path / "empty-cache", domains=["encyclopedia"])


def test_po_msgstrs() -> None:
    po = ('msgid ""\nmsgstr ""\n"Project-Id-Version: Django\\n"\n\nmsgid "Yes"\nmsgstr "是"\n\n'
          'msgid "a"\nmsgid_plural "b"\nmsgstr[0] "第一"\n"行\\"二\\""\n')
    assert dc._po_msgstrs(po) == ["是", '第一行"二"']


def test_encyclopedia_dump_from_gensim_wheel(tmp_path: Path) -> None:
    """k sampled articles plus every redirect and project page, unchanged, as a dump the mediawiki reader reads."""
    import bz2

    import mwxml

    res = _build_or_skip(tmp_path, ["encyclopedia"], 8)
    path = res["files"]["encyclopedia"]
    assert path.name == "encyclopedia.xml.bz2" and res["docs"]["encyclopedia"] == 8
    pages = [(p.namespace, bool(p.redirect)) for p in mwxml.Dump.from_file(bz2.open(path))]
    assert pages.count((0, False)) == 8 and pages.count((0, True)) == 99 and pages.count((4, True)) == 1
    again = _build_or_skip(tmp_path / "again", ["encyclopedia"], 8)
    assert _sha(again["files"]["encyclopedia"]) == _sha(path)


@pytest.mark.slow
def test_docs_and_zh_domains(tmp_path: Path) -> None:
    res = _build_or_skip(tmp_path, ["docs", "zh"], 30)
    docs = _records(res["files"]["docs"])
    _check_records(docs, "docs")
    pages = [r["meta"]["doc"] for r in docs]
    assert len(set(pages)) < len(pages), "the same page from several releases gives near-duplicates"
    assert {r["meta"]["version"] for r in docs} == set(dc.DJANGO_VERSIONS)
    zh = _records(res["files"]["zh"])
    _check_records(zh, "zh")
    assert {r["source"] for r in zh} == {"ctcpc", "django-po"}
    assert all(sum("\u4e00" <= ch <= "\u9fff" for ch in r["text"]) > 20 for r in zh)
