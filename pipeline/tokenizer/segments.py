"""SentencePiece BPE encoding by whitespace segment, each distinct segment encoded once per process.

Why it is exact.  SentencePiece's BPE (``bpe_model.cc``) turns the normalized text into one symbol per character
(user-defined pieces such as ``\\n`` become frozen symbols that never merge), then repeatedly merges the adjacent
pair with the best score whose concatenation is a vocabulary piece.  A merge only looks at its own two symbols.  So
if no vocabulary piece can span a position, the text splits there into parts that are encoded independently, with
the same merges in the same relative order.  Trained with ``split_by_whitespace`` (the project's settings), a piece
holds ``▁`` only as its first character, or consists of ``▁`` alone (``allow_whitespace_only_pieces``).  Hence no
piece spans the position of a ``▁`` that follows a character other than ``▁``: every such space starts a new
*segment*.  Each segment is encoded as its own text (the dummy prefix ``▁`` that SentencePiece adds standing in for
the segment's leading space), and the document's ids are the segments' ids in order.

:func:`splittable` checks those conditions on the model itself (normalizer ``identity`` with the dummy prefix and
escaped whitespace, no whitespace folding, BPE, ``▁`` only at a piece's start or in whitespace-only pieces,
user-defined pieces without spaces); a model that fails them, such as one brought with ``tokenizer.model_path``
and trained otherwise, is encoded whole, as before.  ``tests/test_tokenizer_segments.py`` compares both ways on
every domain of the demo corpus and on generated edge cases (runs of spaces, leading and trailing spaces, tabs,
newlines, a literal ``▁``, empty texts).

Why it is faster.  Most segments are words that recur: the split, the lookup of each chunk's distinct segments
and the gather of their ids run in Arrow and numpy, and only segments not seen before reach SentencePiece.
Measured on a bench-scale corpus after quality (one process): by segment, encoding takes a fraction of the CPU of
encoding whole texts (ids flattened to int32), the most saved on code and books, the least on Chinese (few spaces,
so long segments).  Throughput: ``tokenize.tokens_per_s_1_process`` (``make bench``, topic tokenize).

Memory: the cache keeps segments of at most ``MAX_CACHED_CHARS`` characters, up to ``MAX_ENTRIES`` of them (then
it starts again empty), each as its text and its ids' bytes: 159 bytes per entry (``sys.getsizeof`` of keys, values
and the dict, 156,278 entries after that corpus), so at most about 42 MB per encoding process.
"""

from __future__ import annotations

import itertools

MAX_ENTRIES = 1 << 18
MAX_CACHED_CHARS = 32
SPACE = "\u2581"
SENTINEL = "\x00"                    # marks a segment boundary; a chunk whose text holds it is encoded whole
BOUNDARY = r"([^ \x{2581}]) "       # a space after a character that is neither a space nor ▁ starts a segment


def splittable(model_proto: bytes) -> bool:
    """True when no piece of this model can span a segment boundary (see the module docstring)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError:                 # protobuf missing: no way to read the spec, so encode whole texts
        return False
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(model_proto)
    ns, ts = m.normalizer_spec, m.trainer_spec
    if (ns.name != "identity" or ns.precompiled_charsmap or not ns.add_dummy_prefix or ns.remove_extra_whitespaces
            or not ns.escape_whitespaces or ts.treat_whitespace_as_suffix or ts.model_type != ts.BPE):
        return False
    user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    for p in m.pieces:
        if p.type == user_defined and (" " in p.piece or SPACE in p.piece):
            return False
        if SPACE in p.piece[1:] and p.piece.strip(SPACE):
            return False
    return True


class SegmentEncoder:
    """``encode(texts)`` → (flat int32 ids, int64 lengths), equal to encoding each text whole with ``sp``."""

    def __init__(self, sp, model_proto: bytes):
        import numpy as np

        self.sp, self.split = sp, splittable(model_proto)
        self.cache: dict[str, bytes] = {}
        # A lone trailing space: in a text it is a "▁" symbol of its own; encoding "" would give nothing.
        self.lone_space = np.array(sp.encode("x "), np.int32)[len(sp.encode("x")):].tobytes()

    def encode(self, texts: list[str]):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        arr = pa.array(texts, pa.string())
        if not self.split or not texts or pc.any(pc.match_substring(arr, SENTINEL)).as_py():
            return self._whole(texts)
        spaced = pc.if_else(pc.equal(pc.utf8_length(arr), 0), "", pc.binary_join_element_wise(" ", arr, ""))
        lists = pc.split_pattern(pc.replace_substring_regex(spaced, BOUNDARY, "\\1" + SENTINEL + " "), SENTINEL)
        per_doc = pc.list_value_length(lists).to_numpy().astype(np.int64)
        enc = pc.dictionary_encode(lists.flatten())
        index = enc.indices.to_numpy().astype(np.int64)
        ids = self._ids(enc.dictionary.to_pylist())
        unit_len = np.fromiter(map(len, ids), np.int64, len(ids)) // 4
        unit_start = np.zeros(len(ids), np.int64)
        np.cumsum(unit_len[:-1], out=unit_start[1:])
        seg_len = unit_len[index]
        seg_start = np.zeros(len(seg_len), np.int64)
        np.cumsum(seg_len[:-1], out=seg_start[1:])
        total = int(seg_len.sum())
        gather = np.repeat(unit_start[index] - seg_start, seg_len) + np.arange(total, dtype=np.int64)
        flat = np.frombuffer(b"".join(ids), np.int32)[gather]
        doc_start = np.zeros(len(per_doc), np.int64)
        np.cumsum(per_doc[:-1], out=doc_start[1:])
        lens = np.add.reduceat(seg_len, doc_start) if len(seg_len) else np.zeros(len(texts), np.int64)
        return flat, lens

    def _ids(self, segments: list[str]) -> list[bytes]:
        """Each distinct segment's ids as int32 bytes, from the cache or SentencePiece."""
        import numpy as np

        cache = self.cache
        ids = [cache.get(s) for s in segments]
        miss = [i for i, v in enumerate(ids) if v is None]
        if not miss:
            return ids
        if len(cache) + len(miss) > MAX_ENTRIES:
            cache.clear()
        new = self.sp.encode([segments[i][1:] for i in miss], num_threads=1)
        for i, e in zip(miss, new, strict=True):
            s = segments[i]
            b = self.lone_space if s == " " else np.array(e, np.int32).tobytes()
            ids[i] = b
            if len(s) <= MAX_CACHED_CHARS and len(cache) < MAX_ENTRIES:
                cache[s] = b
        return ids

    def _whole(self, texts: list[str]):
        import numpy as np

        ids = self.sp.encode(texts, num_threads=1)
        lens = np.fromiter(map(len, ids), np.int64, count=len(ids))
        return np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lens.sum())), lens
