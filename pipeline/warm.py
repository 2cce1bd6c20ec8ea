"""Compiled kernels and the language-ID model loaded once per process, and before a pool's server forks workers.

Why: the quality filters and MinHash run numba kernels compiled with ``cache=True``.  A fresh process loads each
one from the on-disk cache on its first call (a task's cold cost against its warm one:
``task_cost.filter.quality_filter_cold_cpu_s`` and ``task_cost.filter.quality_filter_warm_cpu_s``), and every pool
worker is a fresh process.  A per-shard task started its pool's workers and each paid that again, so at the shipped
``parallelism`` (64 tasks per stage) the loading cost more than the scoring of a 1 MB shard.

:mod:`pipeline.pools` lists this module in the forkserver's preload: importing it calls every cached kernel once
on a few small documents (prose, Chinese, code), so the server holds them loaded and every worker it forks inherits
them.  The same goes for the fastText language-ID model that ingest's workers use (a fresh process pays for
importing and loading it).  A process that calls :func:`warm_kernels` itself pays the loading once (it does
nothing the second time).  A failure here never stops a server: the kernels then load on first use, as before.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
_DONE: list[bool] = []

_PROSE = ("The committee met on Tuesday to review the budget, and the members agreed that the new library should "
          "open in the spring. Several speakers asked about the cost of the roof; the chair said it was covered.\n"
          "* One more line with a bullet...\n# A heading line\n") * 4
_ZH = "今天天气很好，我们去公园散步。孩子们在草地上玩耍，老人在树下下棋。\n" * 6
_CODE = "def add(a, b):\n    # sum of two numbers 12 and 3.5\n    return a + b\n\nprint(add(1, 2))\n" * 5


def warm_kernels() -> None:
    """Call the quality filters' and MinHash's compiled kernels once each, on every document kind."""
    if _DONE:
        return
    _DONE.append(True)
    try:
        from pipeline.dedup.minhash.config import MinhashConfig
        from pipeline.dedup.minhash.signatures import SignatureEngine, numba_available
        from pipeline.ingest import langid
        from pipeline.quality.config import QualityConfig
        from pipeline.quality.filters.chain import FILTER_CLASSES, Chain
        from pipeline.quality.filters.text import Doc

        langid.identify(_PROSE)
        if not numba_available():
            return
        q = QualityConfig()
        every = [cls(q.params("*", name)) for name, cls in FILTER_CLASSES.items()]
        columns = {"lang": "en", "lang_score": 0.99}
        for domain, text in (("web", _PROSE), ("zh", _ZH), ("code", _CODE)):
            Chain(domain, every).score(Doc(text, "warm", domain, None, columns))
        engine = SignatureEngine(MinhashConfig())
        for domain, text in (("web", _PROSE), ("zh", _ZH), ("code", _CODE)):
            engine.compute([text, text[:200]], domain)
            engine.shingle_sets([text], domain)
    except Exception as exc:        # noqa: BLE001 - a warm-up must never take a pool down
        log.warning("kernel warm-up failed (%s: %s); kernels load on first use", type(exc).__name__, exc)


warm_kernels()
