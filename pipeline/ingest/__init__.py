"""Ingest: readers per input format, text normalization and language ID, one Parquet shard per input group.

``run`` plans the shards and runs one (``run_ingest_shard``); ``readers/`` parse files; ``normalize`` and ``langid``
clean and label each document; ``config`` holds ``SourceConfig`` and ``IngestConfig``.
"""
