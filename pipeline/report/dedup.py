"""The run report's near-duplicate section: what MinHash found, and example pairs with their similarity.

A reader judges near-dedup by looking at pairs: which document was kept, which one was removed as its near
duplicate, how similar they are (exact Jaccard of the shingle sets, or the estimate for pairs with an earlier
release) and where they differ.  The numbers come from ``minhash/report.json`` (pipeline/minhash/report.py).
"""

from __future__ import annotations

import html

from pipeline.report.plots import bar_chart

_SPAN_CHARS = 90


def _e(v) -> str:
    return html.escape("" if v is None else str(v))


def _span(sp: dict) -> str:
    """'…context [kept → removed]' of one differing span, shortened and PII-masked (removed text is never
    masked by the chain, and the report may be read by more people than the corpus)."""
    from pipeline.quality.filters.pii import PiiMasker

    masker = PiiMasker()

    def cut(t: str) -> str:
        t = masker.mask(t)[0]
        return t if len(t) <= _SPAN_CHARS else t[:_SPAN_CHARS] + "…"

    ctx = sp.get("context", "")
    return (f"…{_e(cut(ctx[-40:]))} <del>{_e(cut(sp.get('kept', '')))}</del> → "
            f"<ins>{_e(cut(sp.get('removed', '')))}</ins>")


def near_duplicate_section(rep: dict) -> str:
    removed = rep.get("removed") or {}
    facts = [("documents", rep.get("docs")), ("clusters", rep.get("clusters")),
             ("documents in clusters", rep.get("docs_in_clusters")), ("largest cluster", rep.get("largest_cluster")),
             ("removed", sum(removed.values())), ("candidate pairs", rep.get("distinct_pairs")),
             ("false positives rejected", rep.get("false_positives_rejected")),
             ("member pairs checked behind a rejected anchor", rep.get("member_pairs")),
             ("threshold (Jaccard)", (rep.get("config") or {}).get("threshold"))]
    parts = ["<h3>Near-duplicate clusters</h3><table>"
             + "".join(f"<tr><th>{_e(k)}</th><td>{_e(f'{v:,}' if isinstance(v, int) else v)}</td></tr>"
                       for k, v in facts if v is not None) + "</table>"]
    rows = []
    for ex in rep.get("examples") or []:
        sim = ex.get("similarity")
        spans = ex.get("differing_spans") or []
        diff = "<br>".join(_span(sp) for sp in spans[:3]) or _e(ex.get("note", "identical after normalization"))
        rows.append(f"<tr><td>{_e(ex.get('kept'))}</td><td>{_e(ex.get('compared') or (ex.get('removed') or [''])[0])}"
                    f"</td><td>{'–' if sim is None else f'{sim:.3f}'}</td><td>{ex.get('removed_count', 0) + 1}</td>"
                    f"<td style='text-align:left'>{diff}</td></tr>")
    if rows:
        parts.append("<h4>Example pairs (largest clusters)</h4><table><tr><th>kept</th><th>removed</th>"
                     "<th>similarity</th><th>cluster size</th><th>where they differ (kept → removed)</th></tr>"
                     + "".join(rows) + "</table>")
    sizes = rep.get("cluster_sizes") or {}
    if sizes:
        groups = {f"{k} docs": {"clusters": float(v)} for k, v in sorted(sizes.items(), key=lambda kv: int(kv[0]))}
        parts.append('<div class="charts">' + bar_chart(groups, "Clusters by size", "clusters") + "</div>")
    return "".join(parts)
