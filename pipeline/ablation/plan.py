"""An ablation run's folder and its first steps: one shared ingest, the references held out before any arm reads
the documents, and each arm's config.

Layout under ``<data_root>/ablation/<run id>/``::

    shared/            the deployment's sources ingested once, through their own readers (MediaWiki, WARC...)
    references/        <domain>.jsonl: held-out documents (id, source, domain, text capped in bytes)
    sources/           <domain>.jsonl: every other ingested document, what every arm reads
    sources_control/   the same with ablation.control_share of them planted with junk (the positive control)
    arms/<arm>/        the arm's data_root (its corpus run ``<arm>``, its own dedup index)
    train/<arm>/seed<k>/   one proxy training run
    scores/<arm>-seed<k>.json  its bits per byte on every reference document
    report.json, report.md

Why ingest once: the readers (HTML extraction, MediaWiki conversion) are the same for every arm, and the references
must be drawn before any arm's chain sees a document. Each arm then re-reads the ingested text as JSONL, so its own
chain (dedup, filters, mixture, tokenizer, packing) is the only thing that differs.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import MindloomConfig, config_from_dict
from pipeline.io import safe_run_id, write_json
from pipeline.quality.corruptions import CONTROL_KINDS, corrupt, navigation

REFERENCE_KEY = "ablation-reference"
NGRAM = 13            # words per n-gram of the reference overlap check (GPT-3, DCLM)


def ablation_dir(data_root: str | Path, run_id: str) -> Path:
    return Path(data_root) / "ablation" / safe_run_id(run_id)


def _docs(rdir: Path, specs: list[dict], columns: list[str]):
    """Every ingested document of the shared run, in plan order: dicts of ``columns``."""
    from pipeline.ingest.output import doc_path, output_shards
    from pipeline.io import read_parquet

    for spec in specs:
        for part in output_shards(rdir, spec["shard"]):
            t = read_parquet(doc_path(rdir, part), columns=columns)
            yield from t.to_pylist()


def _cap_bytes(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[:limit].decode("utf-8", errors="ignore")


def pieces_of(text: str, limit: int) -> list[str]:
    """``text`` cut at line ends into pieces of at most ``limit`` UTF-8 bytes (a longer line is cut inside), so a
    matched mixture can meet each domain's tokens closely even where a domain is a handful of whole books: it
    selects whole documents, and one 300,000-token novel against a 30,000-token target is all or nothing.
    ``limit`` 0: the text as it is."""
    if not limit or len(text.encode("utf-8")) <= limit:
        return [text]
    out, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        n = len(line.encode("utf-8"))
        if size and size + n > limit:
            out.append("".join(cur))
            cur, size = [], 0
        while n > limit:                                  # one line longer than a piece
            head = line.encode("utf-8")[:limit].decode("utf-8", errors="ignore") or line[0]
            out.append(head)
            line = line[len(head):]
            n = len(line.encode("utf-8"))
        if line:
            cur.append(line)
            size += n
    if cur:
        out.append("".join(cur))
    return out


def split_references(cfg: MindloomConfig, root: Path) -> dict:
    """Ingest the sources once and split every domain into references and the documents the arms read.

    Per domain the references are the ``ablation.reference_docs`` documents with the lowest key
    ``unit_key(seed, domain, doc_id)`` (at most half the domain), so the choice depends on the document, not on
    the order of the files. Training documents that share a word 13-gram with a reference are dropped
    (``overlaps_reference``), except n-grams that are the reference's source boilerplate: those found in at least
    ``max(3, 10 %)`` of that source's training documents (navigation, licence headers), which would otherwise
    remove every page of a manual. Passes over the ingested parquet: ids, references, then the training side
    twice (count boilerplate, write); memory is one shard plus the references' n-grams. Idempotent: a finished
    split (``split.json``) is returned as it is.
    """
    import numpy as np

    from pipeline.tasks import corpus as chain

    done = root / "split.json"
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    shared = config_from_dict({**cfg.to_dict(), "data_root": str(root / "shared")})
    specs = chain.prepare_run(shared, "ingest")
    for spec in specs:
        chain.ingest_shard(spec)
    rdir = Path(specs[0]["run_dir"])
    domains, chosen = _choose_references(cfg, rdir, specs)
    counts = {d: {"references": 0, "sources": 0, "pieces": 0, "overlaps_reference": 0, "reference_sources": set()}
              for d in domains}
    cols = ["doc_id", "domain", "source", "text", "meta"]
    ref_grams: dict[str, set] = {}
    with _Writers(root, "references") as out:
        for d in _docs(rdir, specs, cols):
            if d["doc_id"] in chosen:
                text = _cap_bytes(d["text"], cfg.ablation.reference_max_bytes)
                out.write(d["domain"], {"id": d["doc_id"], "source": d["source"], "domain": d["domain"],
                                        "text": text})
                ref_grams.setdefault(d["source"], set()).update(_grams(d["text"]).tolist())
                counts[d["domain"]]["references"] += 1
                counts[d["domain"]]["reference_sources"].add(d["source"])
    boilerplate = _drop_boilerplate(rdir, specs, chosen, ref_grams)
    index = np.asarray(sorted(set().union(*ref_grams.values())) if ref_grams else [], dtype=np.uint64)
    with _Writers(root, "sources") as out:
        for d in _docs(rdir, specs, cols):
            if d["doc_id"] in chosen:
                continue
            if len(index) and np.isin(_grams(d["text"]), index).any():
                counts[d["domain"]]["overlaps_reference"] += 1
                continue
            meta = json.loads(d["meta"] or "{}")
            pieces = pieces_of(d["text"], cfg.ablation.piece_bytes)
            for k, piece in enumerate(pieces):
                out.write(d["domain"], {"id": d["doc_id"] if len(pieces) == 1 else f"{d['doc_id']}#{k}",
                                        "source": d["source"], "text": piece, "meta": meta})
            counts[d["domain"]]["sources"] += 1
            counts[d["domain"]]["pieces"] += len(pieces)
    control = None
    if cfg.ablation.control_share > 0:
        from pipeline.ingest.templates import page_templates

        control = plant_junk(root, cfg.seed, cfg.ablation.control_share, cfg.ablation.piece_bytes,
                             page_templates(cfg))
    split = {"control": control,
             "domains": {d: {**{k: v for k, v in c.items() if k != "reference_sources"},
                             "reference_sources": len(c["reference_sources"])} for d, c in sorted(counts.items())},
             "boilerplate_ngrams": boilerplate, "shared_run": str(rdir)}
    write_json(done, split)
    return split


def _choose_references(cfg: MindloomConfig, rdir: Path, specs: list[dict]) -> tuple[list[str], set[str]]:
    """First pass (ids): the domains in the order they come, and the reference documents: per domain the
    ``ablation.reference_docs`` with the lowest key (at most half the domain)."""
    from pipeline.sink.validation import unit_key

    keys: dict[str, list[tuple[float, str]]] = {}
    for d in _docs(rdir, specs, ["doc_id", "domain"]):
        keys.setdefault(d["domain"], []).append((unit_key(REFERENCE_KEY, cfg.seed, d["domain"], d["doc_id"]),
                                                 d["doc_id"]))
    chosen = set()
    for ks in keys.values():
        n = min(cfg.ablation.reference_docs, len(ks) // 2)
        chosen.update(doc for _, doc in sorted(ks)[:n])
    return list(keys), chosen


def _drop_boilerplate(rdir: Path, specs: list[dict], chosen: set[str], ref_grams: dict[str, set]) -> int:
    """Third pass (training side, counting): removes from ``ref_grams`` (in place) every n-gram of a source found in
    at least ``max(3, 10 %)`` of that source's training documents; returns how many were removed."""
    cols = ["doc_id", "domain", "source", "text", "meta"]
    seen: dict[str, dict[int, int]] = {src: {} for src in ref_grams}
    docs_of: dict[str, int] = {}
    for d in _docs(rdir, specs, cols):
        if d["doc_id"] not in chosen:
            docs_of[d["source"]] = docs_of.get(d["source"], 0) + 1
            if d["source"] in ref_grams:
                hits = seen[d["source"]]
                for h in set(_grams(d["text"]).tolist()) & ref_grams[d["source"]]:
                    hits[h] = hits.get(h, 0) + 1
    boilerplate = 0
    for src, grams in ref_grams.items():
        floor = max(3, -(-docs_of.get(src, 0) // 10))
        common = {h for h, c in seen[src].items() if c >= floor}
        boilerplate += len(common)
        grams -= common
    return boilerplate


def plant_junk(root: Path, seed: int, share: float, piece_bytes: int = 0, templates: list | None = None) -> dict:
    """``sources_control/``: the split's training documents with ``share`` of them planted with junk, the kind
    chosen per document by its key (``CONTROL_KINDS`` in turn: a copy, lines repeated, words shuffled, or inside
    one of ``templates``, the navigation and footers of the sources' own HTML pages), cut again into pieces of
    ``piece_bytes`` (a piece with every line four times is four pieces); returns the counts per domain and kind."""
    import random

    from pipeline.sink.validation import unit_key

    counts: dict[str, dict[str, int]] = {}
    with _Writers(root, "sources_control") as out:
        for path in sorted((root / "sources").glob("*.jsonl")):
            domain = path.stem
            c = counts[domain] = {"documents": 0, **{k: 0 for k in CONTROL_KINDS}}
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    rec = json.loads(line)
                    c["documents"] += 1
                    key = unit_key("ablation-junk", seed, domain, rec["id"])
                    if key >= share:
                        out.write(domain, rec)
                        continue
                    kind = CONTROL_KINDS[min(int(key / share * len(CONTROL_KINDS)), len(CONTROL_KINDS) - 1)]
                    c[kind] += 1
                    rng = random.Random(f"{seed}/{rec['id']}")
                    planted = ([navigation(rec["text"], templates or [], rng)] if kind == "navigation"
                               else corrupt(rec["text"], kind, rng))
                    texts = [p for t in planted for p in pieces_of(t, piece_bytes)]
                    for k, text in enumerate(texts):
                        out.write(domain, {**rec, "id": rec["id"] if k == 0 else f"{rec['id']}#copy{k}", "text": text})
            if not c["documents"]:
                out.write(domain, None)
    return {"share": share, "page_templates": len(templates or []), "domains": counts}


def _grams(text: str):
    from pipeline.quality.decontaminate import ngram_hashes, words

    return ngram_hashes(words(text), NGRAM)


class _Writers:
    """One JSONL file per domain under ``root/sub``, written to a temporary name and renamed on success."""

    def __init__(self, root: Path, sub: str):
        self.dir, self.files = root / sub, {}

    def __enter__(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        return self

    def write(self, domain: str, rec: dict | None) -> None:
        """Append ``rec`` to the domain's file (None: only make sure the file exists)."""
        fh = self.files.get(domain)
        if fh is None:
            fh = self.files[domain] = open(self.dir / f"{domain}.jsonl.tmp", "w", encoding="utf-8")
        if rec is not None:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def __exit__(self, exc_type, *_):
        for fh in self.files.values():
            fh.close()
        for domain in self.files:
            tmp = self.dir / f"{domain}.jsonl.tmp"
            if exc_type is None:
                tmp.replace(self.dir / f"{domain}.jsonl")
            else:
                tmp.unlink(missing_ok=True)


def arm_config(cfg: MindloomConfig, root: Path, arm: str) -> MindloomConfig:
    """The arm's config: the deployment's, reading the split's documents (the junk-planted ones for a ``_control``
    arm, with its base arm's overrides), with the arm's overrides, in the arm's own data root, with a matched
    mixture (the same tokens per domain in every arm) and one training stage."""
    ab = cfg.ablation
    base, docs = (arm.removesuffix("_control"), "sources_control") if arm.endswith("_control") else (arm, "sources")
    data = cfg.to_dict()
    by_domain = {}
    for src in data["sources"]:
        by_domain.setdefault(src["domain"], src)
    data["sources"] = [{"domain": d, "reader": "jsonl", "paths": [str(root / docs / f"{d}.jsonl")],
                        "name": by_domain[d].get("name") or d, "lang": by_domain[d].get("lang", "")}
                       for d in sorted(by_domain) if (root / docs / f"{d}.jsonl").is_file()]
    data["data_root"] = str(root / "arms" / arm)
    data["minhash"] = {**data["minhash"], "use_index": False}
    total = ab.total_tokens or ab.steps * data["train"]["batch_size"] * data["pack"]["seq_len"]
    weights = data["mixture"]["weights"] or {s["domain"]: 1.0 for s in data["sources"]}
    data["mixture"] = {**data["mixture"], "weights": weights, "total_tokens": total, "matched": True}
    data["train"] = {**data["train"], "steps": ab.steps, "stages": [], "from_release": "scratch",
                     "replay_share": 0.0}
    return config_from_dict(data, ab.arms[base])


def arm_runs(cfg: MindloomConfig) -> list[dict]:
    """Every proxy training run: each arm (and the control pair) at seeds ``seed .. seed + seeds - 1``, and with
    ``ablation.aa`` the baseline again at seeds offset by 1000 (arm ``<baseline>_aa``, on the baseline's corpus)."""
    ab = cfg.ablation
    runs = [{"arm": arm, "corpus_arm": arm, "seed": cfg.seed + k} for arm in [*ab.arms, *ab.control_arms()]
            for k in range(ab.seeds)]
    if ab.aa:
        runs += [{"arm": f"{ab.baseline()}_aa", "corpus_arm": ab.baseline(), "seed": cfg.seed + 1000 + k}
                 for k in range(ab.seeds)]
    return runs
