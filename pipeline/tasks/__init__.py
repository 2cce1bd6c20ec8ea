"""One function per DAG task: ``corpus`` (the corpus_build chain) and ``pretrain`` (one training job per stage).

The DAGs and the ``mindloom`` CLI both call these, so a task does the same work wherever it runs.
"""
