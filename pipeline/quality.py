"""Quality filter: the Gopher quality rules, scored first and decided second.

:func:`gopher_scores` computes the named measurements of a document; :func:`gopher_decide` compares them with the
thresholds of :class:`pipeline.config.QualityConfig` and returns the first failing rule as the drop reason (the
reason names follow datatrove's ``GopherQualityFilter``).  Scores are stored as ``q_*`` columns of the kept shard,
so thresholds can be re-tuned later without recomputing them.

CJK awareness: Chinese and Japanese have no spaces, so every CJK character counts as one word, the mean word
length rule is skipped and the English stop-word rule is not applied when most of the text is CJK.  Without this
the word-count and stop-word rules delete all Chinese prose.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.config import QualityConfig
from pipeline.io import completed, count_removed, new_stats, read_parquet, write_marker, write_parquet, write_stats
from pipeline.normalize import cjk_ratio

STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
BULLETS = ("•", "-", "*", "·", "‣", "◦", "▪")
_CJK_CHAR = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_PUNCT_ONLY = re.compile(r"^[\W_]+$")
CJK_TEXT_RATIO = 0.3

SCORE_NAMES = ("n_words", "mean_word_len", "symbol_word_ratio", "bullet_lines_ratio", "ellipsis_lines_ratio",
               "alpha_words_ratio", "stop_words", "cjk_ratio")


def _words(text: str) -> list[str]:
    """Whitespace tokens with CJK runs split into single characters."""
    out: list[str] = []
    for tok in text.split():
        if _CJK_CHAR.search(tok):
            out.extend(p for p in re.split(f"({_CJK_CHAR.pattern})", tok) if p and not p.isspace())
        else:
            out.append(tok)
    return out


def gopher_scores(text: str) -> dict[str, float]:
    words = _words(text)
    content = [w for w in words if not _PUNCT_ONLY.match(w)]
    n = len(content)
    lines = [ln for ln in text.split("\n") if ln.strip()]
    n_lines = max(len(lines), 1)
    latin = [w for w in content if not _CJK_CHAR.search(w)]
    cjk = cjk_ratio(text)
    # CJK punctuation splits into separate tokens; count the alphabetic share over content words there.
    alpha_base = content if cjk >= CJK_TEXT_RATIO else words
    return {
        "n_words": float(n),
        "mean_word_len": sum(len(w) for w in latin) / len(latin) if latin else 0.0,
        "symbol_word_ratio": (text.count("#") + text.count("...") + text.count("…")) / max(n, 1),
        "bullet_lines_ratio": sum(ln.lstrip().startswith(BULLETS) for ln in lines) / n_lines,
        "ellipsis_lines_ratio": sum(ln.rstrip().endswith(("...", "…")) for ln in lines) / n_lines,
        "alpha_words_ratio": sum(any(c.isalpha() for c in w) for w in alpha_base) / max(len(alpha_base), 1),
        "stop_words": float(sum(w.lower() in STOP_WORDS for w in words)),
        "cjk_ratio": cjk,
    }


def gopher_decide(s: dict[str, float], q: QualityConfig) -> str:
    """The drop reason, or "" to keep."""
    cjk = s["cjk_ratio"] >= CJK_TEXT_RATIO
    if s["n_words"] < q.min_words:
        return "gopher_short_doc"
    if s["n_words"] > q.max_words:
        return "gopher_long_doc"
    if not cjk and s["mean_word_len"] < q.min_mean_word_length:
        return "gopher_below_avg_word_len"
    if not cjk and s["mean_word_len"] > q.max_mean_word_length:
        return "gopher_above_avg_word_len"
    if s["symbol_word_ratio"] > q.max_symbol_word_ratio:
        return "gopher_too_many_symbols"
    if s["bullet_lines_ratio"] > q.max_bullet_lines_ratio:
        return "gopher_too_many_bullets"
    if s["ellipsis_lines_ratio"] > q.max_ellipsis_lines_ratio:
        return "gopher_too_many_end_ellipsis"
    if s["alpha_words_ratio"] < q.min_alpha_words_ratio:
        return "gopher_below_alpha_threshold"
    if not cjk and s["stop_words"] < q.min_stop_words:
        return "gopher_enough_stop_words"
    return ""


def run_quality_shard(q: QualityConfig, rdir: Path, shard: str) -> dict:
    """Score every document of the shard, keep the passing ones with their ``q_*`` scores, count the rest."""
    import pyarrow as pa

    out = rdir / "quality" / f"{shard}.parquet"
    if done := completed(out):
        return done["stats"]
    table = read_parquet(rdir / "exact_dedup" / f"{shard}.parquet")
    domain = table.column("domain")[0].as_py() if table.num_rows else shard.rsplit("-", 1)[0]
    stats = new_stats(domain)
    apply_rules = q.enabled and domain not in q.skip_domains
    keep_mask: list[bool] = []
    scores: dict[str, list[float]] = {f"q_{k}": [] for k in SCORE_NAMES}
    removed_rows: list[dict] = []
    for i, text in enumerate(table.column("text").to_pylist()):
        nbytes = len(text.encode("utf-8"))
        stats["in_docs"] += 1
        stats["in_bytes"] += nbytes
        s = gopher_scores(text)
        reason = gopher_decide(s, q) if apply_rules else ""
        keep_mask.append(not reason)
        if reason:
            count_removed(stats, reason, nbytes)
            removed_rows.append({"doc_id": table.column("doc_id")[i].as_py(), "reason": reason,
                                 "snippet": text[:300]})
        else:
            stats["kept_docs"] += 1
            stats["kept_bytes"] += nbytes
        for k in SCORE_NAMES:
            scores[f"q_{k}"].append(s[k])
    for name, values in scores.items():
        table = table.append_column(name, pa.array(values, pa.float64()))
    kept = table.filter(pa.array(keep_mask, pa.bool_()))
    write_parquet(kept, out)
    if removed_rows:
        write_parquet(pa.Table.from_pylist(removed_rows), rdir / "removed" / "quality" / f"{shard}.parquet")
    stats = write_stats(rdir, "quality", shard, stats)
    write_marker(out, {"stats": stats})
    return stats
