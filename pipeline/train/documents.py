"""Document boundaries of packed rows, in numpy: the twins of what the model computes in its graph
(``model.Transformer``'s document mask, ``model.attention_masks``), for tests, the trainer's host-side counts and
the memory plan's reasoning. A document ends at its ``eod_id`` token, which belongs to the document it ends."""

from __future__ import annotations

import numpy as np

#: flash attention's limits (MindSpore 2.10's ``flash_attention_score``): the side of its compressed causal mask
#: (``sparse_mode`` 2 and 3, whatever the sequence length), and its batch range (TND: segments)
FLASH_MASK_SIDE = 2048
FLASH_MAX_SEGMENTS = 2048


def document_segments(tokens: np.ndarray, eod_id: int) -> np.ndarray:
    """Document index of every position of ``[B, S]`` rows: the number of ``eod_id`` tokens strictly before it (an
    end-of-document token belongs to the document it ends). The numpy twin of ``Transformer``'s mask, for tests and
    the memory plan's reasoning."""
    eod = (np.asarray(tokens) == eod_id).astype(np.int32)
    return np.cumsum(eod, axis=1) - eod


def document_positions(tokens: np.ndarray, eod_id: int) -> np.ndarray:
    """Position of every token of ``[B, S]`` rows counted from the start of its document (the numpy twin of
    ``model.attention_masks.document_positions``, Megatron's ``reset_position_ids``)."""
    tokens = np.asarray(tokens)
    pos = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    starts = np.where(np.pad(tokens[:, :-1] == eod_id, ((0, 0), (1, 0)), constant_values=True), pos, 0)
    return pos - np.maximum.accumulate(starts, axis=1)


def document_ends(tokens: np.ndarray, eod_id: int, k: int) -> np.ndarray:
    """Flash attention's ``actual_seq_qlen`` for ``[B, S]`` rows in the TND layout (the numpy twin of
    ``model.attention_masks.document_ends``): per row its first ``k - 1`` document ends, then the row's end
    (``S``) repeated to ``k`` entries, offset by the row's place in the flattened batch. Documents past the
    ``k - 1``-th end of a row share its last segment."""
    tokens = np.asarray(tokens)
    b, s = tokens.shape
    k = min(k, s)
    pos = np.arange(1, s + 1)
    ends = np.sort(np.where((tokens == eod_id) & (pos < s), pos, s), axis=1)[:, :k]
    ends[:, k - 1] = s
    return (ends + s * np.arange(b)[:, None]).reshape(-1).astype(np.int64)


def rows_over_document_cap(rows: np.ndarray, eod_id: int, k: int) -> int:
    """How many model input rows (``[B, S]``) hold more than ``k - 1`` document ends before their last token: in
    those, ``document_ends`` lets the last documents attend to each other."""
    return int(np.count_nonzero(np.count_nonzero(np.asarray(rows)[:, :-1] == eod_id, axis=1) > k - 1))
