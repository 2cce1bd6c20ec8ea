"""The sink: domain mixture and held-out split, packing into rows, the MindRecord writer and its manifest.

``mixture`` decides how often each document is used, ``validation`` holds out the evaluation documents,
``mindrecord`` packs token ids into rows and writes, verifies and reads the shards; ``config`` holds
``PackConfig`` and ``MixtureConfig``.
"""
