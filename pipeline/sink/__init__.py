"""The sink: domain mixture and held-out split, packing into rows, the MindRecord writer and its manifest.

``mixture`` decides how often each document is used, ``validation`` holds out the evaluation documents,
``scatter`` and ``shards`` deal the corpus' packed rows to its files, ``mindrecord`` writes token sets,
``verify`` checks them against their manifest; ``config`` holds
``PackConfig`` and ``MixtureConfig``.
"""
