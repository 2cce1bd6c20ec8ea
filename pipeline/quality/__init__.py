"""Quality filtering: per-domain chains of published rule sets (``filters/``), run per shard by ``run``.

``config`` holds ``QualityConfig``; each filter's parameters and published defaults are in ``filters/params.py``.
"""
