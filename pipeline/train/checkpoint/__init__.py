"""Checkpoints: writing them, agreeing on them across ranks, loading them.

``checkpoint`` (per step a weights file and a state file, each with its sha256 sidecar), ``ckpt_write`` (a ``.ckpt``
written while its bytes are hashed), ``commit`` (a step counts only when every rank has written and verified its
file), ``resume`` (what each rank loads at start, and how it saves a step) and ``tp_merge`` (the per-rank shards of a
TP run merged into one TP=1 weights file, ``python -m pipeline.train.checkpoint.tp_merge``).
"""
