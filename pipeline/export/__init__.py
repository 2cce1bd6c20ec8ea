"""Checkpoints for the clients mindloom's users train and serve with: mindformers and Hugging Face transformers.

``run.export_stage`` is the entry point (``mindloom export``, the pretrain DAG's ``export`` task); ``source`` finds
a stage's final committed checkpoint and merges tensor-parallel shards; ``names`` maps parameter names; ``hf`` and
``mindformers`` write each client's files.
"""
