"""Page templates of a deployment's HTML sources: the navigation, breadcrumbs and footers that main-content
extraction drops, read back from the raw pages (``Reader.template``).

The ablation's positive control plants them around other documents, so its navigation junk is what real pages
carry (issue 51), not a made-up list. Reading stops after ``limit`` pages with a template, in plan order, so the
cost is bounded whatever the corpus' size; the same config gives the same templates.
"""

from __future__ import annotations

from pipeline.config import MindloomConfig
from pipeline.ingest.readers import RawRecord, Reader, make_reader
from pipeline.ingest.readers.storage import Storage
from pipeline.ingest.run import plan_ingest, shard_records


def page_templates(cfg: MindloomConfig, limit: int = 200) -> list[tuple[list[str], list[str]]]:
    """(lines before, lines after) the main content of the first ``limit`` pages that have any, over the sources
    whose reader reads pages (html, warc); [] when none does."""
    out: list[tuple[list[str], list[str]]] = []
    for spec in plan_ingest(cfg):
        src = cfg.sources[spec["source_index"]]
        reader = make_reader(src, cfg.ingest.max_record_bytes)
        if type(reader).template is Reader.template:  # records that are no pages
            continue
        for item in shard_records(reader, Storage(src.fs_options), spec):
            if not isinstance(item, RawRecord):
                continue
            try:
                before, after = reader.template(item)
            except Exception:  # noqa: BLE001 - a page the reader would reject gives no template, nothing more
                continue
            if before or after:
                out.append((before, after))
                if len(out) >= limit:
                    return out
    return out
