"""Document boundaries as the model's graph computes them from the tokens (``eod_id`` ends a document).

Kept apart from ``model.py`` so the flash-attention path's inputs, which only an Ascend kernel consumes, can be
checked on CPU against their numpy twins in ``pipeline.train.documents`` (``document_ends``, ``document_positions``).
Both use only ops with CPU kernels (compare, where, sort, cummax) and static shapes.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops


def document_ends(tokens, eod_id: int, k: int):
    """``actual_seq_qlen`` of flash attention's TND layout for ``[B, S]`` rows: int64 ``[B * min(k, S)]``.

    Per row: its first ``k - 1`` document ends (one past each ``eod_id``; a final one is the row's end), then ``S``
    repeated to ``k`` entries (mindformers pads its ``actual_seq_len`` the same way), offset by ``row * S`` since
    TND puts every row's tokens on one axis. Documents past the ``k - 1``-th end share the row's last segment:
    ``ModelConfig.max_documents_per_row`` is ``k``, and the trainer counts rows that go over it."""
    b, s = tokens.shape
    k = min(k, s)
    pos = ops.arange(1, s + 1, dtype=ms.int32)
    interior = ops.logical_and(tokens == eod_id, pos < s)
    ends = ops.sort(ops.where(interior, pos, s), 1)[0][:, :k - 1]
    ends = ops.concat((ends, ops.full((b, 1), s, dtype=ms.int32)), 1)
    offsets = ops.expand_dims(ops.arange(b, dtype=ms.int32) * s, 1)
    return (ends + offsets).reshape(-1).astype(ms.int64)


def document_positions(tokens, eod_id: int):
    """int32 ``[B, S]``: each token's position counted from the start of its document (``reset_position_ids``)."""
    b, s = tokens.shape
    pos = ops.arange(s, dtype=ms.int32)
    begins = ops.concat((ops.ones((b, 1), ms.bool_), tokens[:, :-1] == eod_id), 1)
    starts = ops.cummax(ops.where(begins, pos, 0), 1)[0]
    return pos - starts
