"""What a person reads before approving a corpus for training: the run's headline, from its own files.

The approval task (``operators/approval.py``) waits between the sink and ``publish``: a rejected corpus is never
registered as the latest corpus or as a dedup release, and no ``pretrain`` run starts. This module holds what does
not need Airflow: whether a DAG's runs wait (``approval`` in the config), and the headline they show.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.io import read_json

REFRESH_DAG = "corpus_refresh"
#: The stages that count documents, in chain order: the last one a domain reaches holds what it keeps.
CHAIN_ORDER = ("ingest", "exact_dedup", "minhash", "quality", "tokenize", "mixture", "overlaps_heldout")


def needs_approval(setting: str, dag_id: str) -> bool:
    """``approval: refresh`` makes ``corpus_refresh`` runs wait, ``always`` every corpus DAG, ``never`` none."""
    if setting not in ("refresh", "always", "never"):
        raise ValueError(f"approval: {setting!r} is not one of refresh, always, never")
    return setting == "always" or (setting == "refresh" and dag_id == REFRESH_DAG)


def release_headline(rdir: str | Path, report_url: str = "") -> str:
    """Markdown: per domain, documents in and kept and removals by reason over the whole chain; the MindRecord
    set's rows and tokens; the release it extends (an incremental refresh: the set is that release's delta)."""
    from pipeline.sink import mindrecord
    from pipeline.tasks.corpus import collect_stats

    rdir = Path(rdir)
    found = collect_stats(rdir)
    order = [s for s in CHAIN_ORDER if s in found] + sorted(set(found) - set(CHAIN_ORDER))
    stats = {s: found[s] for s in order}
    first = stats.get("ingest", {})
    domains = sorted({d for stage in stats.values() for d in stage})
    lines = ["| domain | documents in | kept | removed (reason: documents) |", "|---|---|---|---|"]
    for d in domains:
        n_in = first.get(d, {}).get("in_docs", 0)
        last = next((stage[d] for stage in reversed(list(stats.values())) if d in stage), {"kept_docs": 0})
        removed: dict[str, int] = {}
        for stage in stats.values():
            for reason, n in stage.get(d, {}).get("removed", {}).items():
                removed[reason] = removed.get(reason, 0) + n
        why = ", ".join(f"{r}: {n:,}" for r, n in sorted(removed.items(), key=lambda kv: -kv[1])) or "none"
        lines.append(f"| {d} | {n_in:,} | {last['kept_docs']:,} | {why} |")
    manifest_path = rdir / "mindrecord" / mindrecord.MANIFEST
    manifest = read_json(manifest_path) if manifest_path.exists() else {}
    extends = (manifest.get("extends_release") or {}).get("name")
    size = (f"MindRecord: {manifest.get('samples', 0):,} rows, {manifest.get('tokens', 0):,} tokens"
            if manifest else "MindRecord: not written")
    what = f"the delta of release `{extends}`" if extends else "a whole corpus (it extends no release)"
    head = [f"Corpus run `{rdir.name}`: {what}. {size}.", ""]
    tail = ["", f"Report: {report_url}"] if report_url else []
    return "\n".join(head + lines + tail)


def prepare_approval(rdir: str | Path, report_url: str = "") -> str:
    """Write the run's report (``publish`` writes it again, with the summary) so the link works while the run
    waits, and return the headline a person approves."""
    from pipeline.report.html import write_report
    from pipeline.tasks.run_state import load_run_config

    rdir = Path(rdir)
    cfg = load_run_config(rdir)
    write_report(rdir / "report.html", f"mindloom corpus {cfg.run_name} ({rdir.name}), awaiting approval",
                 corpus_run_dir=rdir)
    return release_headline(rdir, report_url)
