"""MinHash signatures: exactly datasketch's, from both engines, over our documented shingles."""

from __future__ import annotations

import pathlib
import sysconfig

import numpy as np
import pytest
from datasketch import MinHash, MinHashLSH
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.configkit import ConfigError
from pipeline.dedup.minhash import MinhashConfig, ShingleRule, SignatureEngine, check_config, minhash_config_from_dict
from pipeline.dedup.minhash import shingles as sh
from pipeline.dedup.minhash.config import PRESETS, candidate_probability, curve_threshold
from pipeline.dedup.minhash.signatures import band_keys, doc_kinds, numba_available, permutations, to_minhash

ENGINES = ["numpy"] + (["numba"] if numba_available() else [])
STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"])


def _datasketch(shingle_list: list[str], num_perm: int, seed: int, scheme: str) -> np.ndarray:
    m = MinHash(num_perm=num_perm, seed=seed, scheme=scheme)
    m.update_batch([s.encode("utf-8") for s in shingle_list])
    return m.hashvalues


def _real_texts() -> list[str]:
    """Real prose, code and Chinese: stdlib sources/docs plus CJK text shipped with CPython's test suite."""
    from pydoc_data.topics import topics

    texts = [topics[k] for k in sorted(topics)[:6]]
    texts += [(STDLIB / name).read_text(encoding="utf-8") for name in ("bisect.py", "colorsys.py")]
    cjk = STDLIB / "test" / "cjkencodings" / "gb2312-utf8.txt"
    if cjk.exists():
        texts.append(cjk.read_text(encoding="utf-8"))
    return texts + ["", "   ", "one", "Hello, World! 2024-11-29", "x=1;y=22;foo_bar(x)"]


@pytest.mark.parametrize("scheme", ["affine32", "legacy", "affine64"])
@pytest.mark.parametrize("seed", [1, 42])
def test_permutations_are_datasketchs(scheme, seed):
    a, b = permutations(64, seed, scheme)
    ref = MinHash(num_perm=64, seed=seed, scheme=scheme).permutations
    assert np.array_equal(a, ref[0]) and np.array_equal(b, ref[1])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("scheme", ["affine32", "legacy", "affine64"])
@pytest.mark.parametrize("kind", ["word", "code", "char"])
def test_real_documents_match_datasketch(engine, scheme, kind):
    cfg = MinhashConfig(scheme=scheme, shingle_kind=kind, domain_shingles=[])
    texts = _real_texts()
    res = SignatureEngine(cfg, engine).compute(texts)
    for i, text in enumerate(texts):
        shs = sh.shingles(text, kind, cfg.ngram_for(kind))
        assert res.count[i] == len(shs)
        if shs:
            assert np.array_equal(res.sig[i], _datasketch(shs, 112, 1, scheme)), (i, text[:40])
        else:
            assert (res.sig[i] == np.iinfo(res.sig.dtype).max).all()


_ALPHABET = st.sampled_from(list("abcXYZ  \t\n.,;:!?-_()[]=+*/'\"0123456789") +
                            list("éÀßİıσΣ中文字测试。，日本語カナ한국٣٤") +
                            ["\u00a0", "\u3000", "\U0001F600", "\ufb01"])


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(_ALPHABET, max_size=120), kind=st.sampled_from(["word", "code", "char"]),
       n=st.integers(1, 7), scheme=st.sampled_from(["affine32", "legacy", "affine64"]),
       lower=st.booleans(), numbers=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_property_signature_equals_datasketch(text, kind, n, scheme, lower, numbers, seed):
    cfg = MinhashConfig(bands=4, rows=4, seed=seed, scheme=scheme, shingle_kind=kind, domain_shingles=[],
                        word_ngram=n, char_ngram=n, code_ngram=n, lowercase=lower, normalize_numbers=numbers)
    shs = sh.shingles(text, kind, n, lower, numbers)
    want = _datasketch(shs, 16, seed, scheme)
    for engine in ENGINES:
        res = SignatureEngine(cfg, engine).compute([text, text + " tail words here"])
        assert res.count[0] == len(shs)
        assert np.array_equal(res.sig[0], want), engine


@pytest.mark.parametrize("engine", ENGINES)
def test_shingle_sets_give_exact_jaccard(engine):
    from pydoc_data.topics import topics

    cfg = MinhashConfig(shingle_kind="word", domain_shingles=[])
    w = topics["assert"].split() + topics["import"].split()
    texts = [" ".join(w[:300]), " ".join(w[40:340]), " ".join(w[:300] * 2), "", "short text"]
    values, offs = SignatureEngine(cfg, engine).shingle_sets(texts)
    sets = [set(sh.shingles(t, "word", 5)) for t in texts]
    for i in range(len(texts)):
        part = values[offs[i]:offs[i + 1]]
        assert len(part) == len(sets[i]) and np.all(part[1:] > part[:-1])
    for i, j in ((0, 1), (0, 2), (1, 2), (0, 4)):
        a, b = set(values[offs[i]:offs[i + 1]].tolist()), set(values[offs[j]:offs[j + 1]].tolist())
        assert len(a & b) / len(a | b) == len(sets[i] & sets[j]) / len(sets[i] | sets[j])


def test_shingle_definitions():
    assert sh.shingles("Hello, World! It's 2024.", "word", 2) == ["hello world", "world it", "it s", "s 0"]
    assert sh.shingles("foo_bar(x)=12;", "code", 3) == ["foo_bar ( x", "( x )", "x ) =", ") = 0", "= 0 ;"]
    assert sh.shingles("中文，测试", "char", 3) == ["中文 ", "文 测", " 测试"]
    assert sh.shingles("two words", "word", 5) == ["two words"]
    assert sh.shingles(" ... ", "word", 5) == []
    assert sh.resolve_kind("这是一个中文的句子。", "auto", 0.3) == "char"
    assert sh.resolve_kind("An English sentence with 一 char.", "auto", 0.3) == "word"


def test_per_domain_rules_and_auto():
    cfg = MinhashConfig(domain_shingles=[ShingleRule(domain="code", kind="code"),
                                         ShingleRule(domain="zh", kind="char", n=3)])
    modes, ngrams = doc_kinds(["x = 1"], "code", cfg)
    assert (modes.tolist(), ngrams.tolist()) == ([sh.KIND_CODES["code"]], [8])
    modes, ngrams = doc_kinds(["中文"], "zh", cfg)
    assert (modes.tolist(), ngrams.tolist()) == ([sh.KIND_CODES["char"]], [3])
    modes, ngrams = doc_kinds(["这是中文的句子", "plain English words"], "web", cfg)
    assert modes.tolist() == [sh.KIND_CODES["char"], sh.KIND_CODES["word"]] and ngrams.tolist() == [5, 5]


def test_to_minhash_works_with_datasketch_lsh():
    cfg = MinhashConfig()
    from pydoc_data.topics import topics

    base = topics["assert"] + " " + topics["pass"]
    texts = [base, base.replace("statement", "stmt", 1), topics["import"]]
    res = SignatureEngine(cfg).compute(texts)
    lsh = MinHashLSH(num_perm=cfg.num_perm, params=(cfg.bands, cfg.rows))
    for i, row in enumerate(res.sig):
        lsh.insert(str(i), to_minhash(row, cfg))
    assert sorted(lsh.query(to_minhash(res.sig[0], cfg))) == ["0", "1"]
    assert to_minhash(res.sig[0], cfg).jaccard(to_minhash(res.sig[1], cfg)) > 0.9


def test_band_keys_equal_exactly_when_band_values_are_equal():
    rng = np.random.default_rng(0)
    sig = rng.integers(0, 2**32, size=(3, 112), dtype=np.uint64).astype(np.uint32)
    sig[1, :8] = sig[0, :8]                  # band 0 shared
    sig[2, 8:16] = sig[0, 8:16]              # band 1 shared
    keys = band_keys(sig, 14, 8)
    assert keys.dtype == np.uint64 and keys.shape == (3, 14)
    assert keys[0, 0] == keys[1, 0] and keys[0, 1] != keys[1, 1]
    assert keys[0, 1] == keys[2, 1] and keys[0, 0] != keys[2, 0]
    assert len(set(keys[0].tolist())) == 14


def test_band_math_matches_fineweb_curve():
    assert [round(candidate_probability(s, 14, 8), 3) for s in (0.7, 0.75, 0.8, 0.85)] == [0.565, 0.772, 0.924,
                                                                                              0.988]
    assert round(curve_threshold(14, 8), 2) == 0.72


def test_config_checks_name_the_field():
    with pytest.raises(ConfigError, match=r"minhash.survivor_order\[1\]"):
        check_config(MinhashConfig(survivor_order=["longest", "tallest"]))
    with pytest.raises(ConfigError, match=r"minhash.domain_shingles\[1\].domain"):
        check_config(MinhashConfig(domain_shingles=[ShingleRule("code", "code"), ShingleRule("code", "word")]))
    with pytest.raises(ConfigError, match=r"minhash.rows"):
        minhash_config_from_dict({"rows": 0})
    with pytest.raises(ConfigError, match=r"minhash.bogus"):
        minhash_config_from_dict({"bogus": 1})
    cfg = minhash_config_from_dict({"preset": "nemo", "threshold": 0.85})
    assert (cfg.bands, cfg.rows, cfg.shingle_kind, cfg.char_ngram, cfg.threshold) == (20, 13, "char", 24, 0.85)
    assert set(PRESETS) == {"fineweb", "nemo", "datasketch_0.8", "high_recall", "strict"}
