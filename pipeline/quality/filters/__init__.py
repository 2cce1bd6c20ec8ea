"""Quality filters: small classes that score a document first and decide keep/drop with a reason later.

Modules: ``text`` (shared measurements, CJK-aware words), ``params`` (parameters, published defaults, sources),
``base`` (the interface), ``gopher``, ``c4`` (C4 + FineWeb), ``basic`` (code, length, language), ``pii`` (masking),
``chain`` (per-domain chains, stored-score re-application) and ``audit`` (removed samples and the report).
The stage entry point is :func:`pipeline.quality.run.run_quality_shard`.

The stage's settings (``QualityConfig``) are in :mod:`pipeline.quality.config`, which imports ``params`` from here.
"""
