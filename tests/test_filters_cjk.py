"""Chinese text through the word-based rules: counted per character, never deleted wholesale.

Both samples are real text quoted from ../shared/corpora/zh.jsonl: a Tang poem (Zhang Jiuling, 《感遇・其一》,
public domain, from fortunes-zh) and a paragraph of the Debian New Maintainers' Guide in Simplified Chinese
(maint-guide-zh-cn, dreq.zh-cn.html, GPL-2+ OR MIT).
"""

from __future__ import annotations

from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.quality.filters.c4 import C4Quality, FineWebQuality
from pipeline.quality.filters.chain import Chain
from pipeline.quality.filters.gopher import GopherQuality, GopherRepetition
from pipeline.quality.filters.params import C4Params, FineWebParams, GopherQualityParams, GopherRepetitionParams
from pipeline.quality.filters.text import Doc

POEM = ("《感遇・其一》\n作者：张九龄\n兰叶春葳蕤，桂华秋皎洁。\n欣欣此生意，自尔为佳节。\n"
        "谁知林栖者，闻风坐相悦。\n草木有本心，何求美人折？")
PROSE = ("你可能已经注意到，Debian 仓库被分为几个类别：main (自由软件)、non-free (非自由软件)以及 "
         "contrib (依赖于非自由软件的自由软件)。在这些大的分类之下还有多个逻辑上的子分类，"
         "用以简短描述软件包的用途类别。admin 为供系统管理员使用的程序，devel 为开发工具，"
         "doc 为文档，libs 为库，mail 为电子邮件阅读器或邮件系统守护程序，"
         "net 为网络应用程序或网络服务守护进程，x11 为不属于其他分类的为 X11 程序，此外还有很多很多。")


def _chain(domain: str) -> Chain:
    chain = Chain.build(load_config(DEFAULT_CONFIG).quality, domain)
    chain.filters = [f for f in chain.filters if f.name != "language"]    # no language-ID columns here
    return chain


def test_whitespace_words_would_delete_chinese_prose():
    assert len(PROSE.split()) < 50                    # a whitespace word count sees a handful of "words"
    s = GopherQuality(GopherQualityParams()).score(Doc(PROSE))
    assert s["n_words"] == 150 + 13                   # 150 Han characters + 13 Latin words ("non-free" is two)
    assert s["cjk_ratio"] >= 0.3 and s["cjk_stop_words"] == 7   # 的 在 为 有 被 他 由, from the FineWeb-2 list
    assert s["stop_words"] == 0                       # the English list finds nothing, and is not applied
    assert GopherQuality(GopherQualityParams()).decide(s) is None


def test_prose_passes_every_default_chain_it_could_land_in():
    for domain in ("zh", "*", "encyclopedia"):
        chain = _chain(domain)
        assert chain.decide(chain.score(Doc(PROSE))) is None, domain


def test_poem_counts_each_character_and_is_short_by_exactly_one_word():
    s = GopherQuality(GopherQualityParams()).score(Doc(POEM))
    assert s["n_words"] == 49                         # its 49 Han characters; punctuation is not a word
    assert s["cjk_stop_words"] == 3                   # 为 有 人: classical verse still has some
    assert GopherQuality(GopherQualityParams()).decide(s) == ("gopher_short_doc", "n_words=49 < min_words=50")
    assert GopherQuality(GopherQualityParams(min_words=49)).decide(s) is None
    rep = GopherRepetition(GopherRepetitionParams()).score(Doc(POEM))
    # a 4-gram of Han characters is 4 characters long, not 7 (no spaces between them in the text)
    assert rep["top_4_gram"] == 4 / len(POEM)
    assert GopherRepetition(GopherRepetitionParams()).decide(rep) is None


def test_c4_and_fineweb_see_chinese_lines_and_sentences():
    doc = Doc(POEM)
    s = C4Quality(C4Params()).score(doc)
    assert s["lines_removed"] == 0                    # every line has >= 3 words (characters)
    assert s["n_sentences"] == 6                      # 。 and ？ end sentences; title and author lines count one each
    fw = FineWebQuality(FineWebParams()).score(Doc(POEM))
    assert fw["line_punct_ratio"] == 4 / 6            # lines ending in 。 or ？
