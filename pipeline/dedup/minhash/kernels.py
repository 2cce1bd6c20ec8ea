"""Compiled (numba) signature engine: UTF-8 bytes → normalized tokens → shingles → SHA-1 → permutations → minimum.

Why compiled: datasketch's default hash is SHA-1 of each shingle, and a Python-level call per shingle (plus
building the shingle string) costs more than everything else in the signature step together.  Here a batch of
documents is one byte buffer; each shingle is a slice of the normalized buffer, hashed by an in-kernel SHA-1 and
folded into the signature without ever becoming a Python object.  The results are identical to
:mod:`pipeline.dedup.minhash.shingles` + ``hashlib`` + datasketch's permutations (tested), so the numpy engine in
:mod:`pipeline.dedup.minhash.signatures` is a drop-in fallback where numba is not installed.

All arithmetic is done in uint64 with explicit masks: numba widens uint32 operands, and mixing uint64 with Python
int literals would silently become float64, hence the ``_U*`` constants.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_M32 = np.uint64(0xFFFFFFFF)
_MERSENNE = np.uint64((1 << 61) - 1)
_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U5 = np.uint64(5)
_U8 = np.uint64(8)
_U13 = np.uint64(13)
_U16 = np.uint64(16)
_U24 = np.uint64(24)
_U27 = np.uint64(27)
_U30 = np.uint64(30)
_U31 = np.uint64(31)
_U32 = np.uint64(32)
_U33 = np.uint64(33)
_U61 = np.uint64(61)
_UFF = np.uint64(0xFF)
_U80 = np.uint64(0x80)
_FM32A = np.uint64(0x85EBCA6B)
_FM32B = np.uint64(0xC2B2AE35)
_FM64A = np.uint64(0xFF51AFD7ED558CCD)
_FM64B = np.uint64(0xC4CEB9FE1A85EC53)
_K0 = np.uint64(0x5A827999)
_K1 = np.uint64(0x6ED9EBA1)
_K2 = np.uint64(0x8F1BBCDC)
_K3 = np.uint64(0xCA62C1D6)
_H0 = np.uint64(0x67452301)
_H1 = np.uint64(0xEFCDAB89)
_H2 = np.uint64(0x98BADCFE)
_H3 = np.uint64(0x10325476)
_H4 = np.uint64(0xC3D2E1F0)

SCHEME_AFFINE32 = 0
SCHEME_LEGACY = 1
SCHEME_AFFINE64 = 2
MODE_WORD = 0
MODE_CODE = 1
MODE_CHAR = 2
_UNDERSCORE = 95
_SPACE = np.uint8(32)
_ZERO_CHAR = np.uint8(48)


@njit(inline="always")
def _rotl32(x, k):
    return ((x << k) | (x >> (_U32 - k))) & _M32


@njit(inline="always")
def _bswap32(x):
    return (((x & _UFF) << _U24) | (((x >> _U8) & _UFF) << _U16) | (((x >> _U16) & _UFF) << _U8)
            | ((x >> _U24) & _UFF))


@njit(cache=True)
def _sha1_head(buf, s, e, w):
    """First 8 bytes of SHA-1(buf[s:e]) as the two big-endian words (h0, h1)."""
    n = e - s
    total = ((n + 8) // 64 + 1) * 64
    bitlen = np.uint64(n) * _U8
    h0, h1, h2, h3, h4 = _H0, _H1, _H2, _H3, _H4
    for blk in range(0, total, 64):
        for t in range(16):
            p = blk + 4 * t
            if p + 4 <= n:
                q = s + p
                w[t] = ((np.uint64(buf[q]) << _U24) | (np.uint64(buf[q + 1]) << _U16)
                        | (np.uint64(buf[q + 2]) << _U8) | np.uint64(buf[q + 3]))
            else:
                v = _U0
                for j in range(4):
                    pj = p + j
                    if pj < n:
                        byte = np.uint64(buf[s + pj])
                    elif pj == n:
                        byte = _U80
                    elif pj >= total - 8:
                        byte = (bitlen >> np.uint64(8 * (total - 1 - pj))) & _UFF
                    else:
                        byte = _U0
                    v = (v << _U8) | byte
                w[t] = v
        for t in range(16, 80):
            w[t] = _rotl32(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], _U1)
        a, b, c, d, x = h0, h1, h2, h3, h4
        for t in range(20):
            tmp = (_rotl32(a, _U5) + ((b & c) | ((b ^ _M32) & d)) + x + _K0 + w[t]) & _M32
            x, d, c, b, a = d, c, _rotl32(b, _U30), a, tmp
        for t in range(20, 40):
            tmp = (_rotl32(a, _U5) + (b ^ c ^ d) + x + _K1 + w[t]) & _M32
            x, d, c, b, a = d, c, _rotl32(b, _U30), a, tmp
        for t in range(40, 60):
            tmp = (_rotl32(a, _U5) + ((b & c) | (b & d) | (c & d)) + x + _K2 + w[t]) & _M32
            x, d, c, b, a = d, c, _rotl32(b, _U30), a, tmp
        for t in range(60, 80):
            tmp = (_rotl32(a, _U5) + (b ^ c ^ d) + x + _K3 + w[t]) & _M32
            x, d, c, b, a = d, c, _rotl32(b, _U30), a, tmp
        h0 = (h0 + a) & _M32
        h1 = (h1 + b) & _M32
        h2 = (h2 + c) & _M32
        h3 = (h3 + d) & _M32
        h4 = (h4 + x) & _M32
    return h0, h1


@njit(inline="always")
def _decode(buf, i):
    """(code point, length) of the UTF-8 sequence at buf[i] (input comes from str.encode, so it is well formed)."""
    c = np.int64(buf[i])
    if c < 0x80:
        return c, 1
    if c < 0xE0:
        return ((c & 0x1F) << 6) | (np.int64(buf[i + 1]) & 0x3F), 2
    if c < 0xF0:
        return ((c & 0x0F) << 12) | ((np.int64(buf[i + 1]) & 0x3F) << 6) | (np.int64(buf[i + 2]) & 0x3F), 3
    return (((c & 0x07) << 18) | ((np.int64(buf[i + 1]) & 0x3F) << 12) | ((np.int64(buf[i + 2]) & 0x3F) << 6)
            | (np.int64(buf[i + 3]) & 0x3F)), 4


@njit(cache=True)
def _normalize(src, s0, s1, mode, numbers, cls, out, ts):
    """Write the doc's tokens joined by single spaces into ``out``, token starts into ts; return (length, count).

    A token ends one byte before the next token starts (the joining space), the last one at ``length``.

    word/char: tokens are runs of CLS_WORD code points; code: runs of CLS_WORD or '_' plus single other non-space
    code points.  With ``numbers`` every run of CLS_DIGIT code points inside a token becomes one '0'.
    """
    o = 0
    nt = 0
    in_tok = False
    in_digits = False
    i = s0
    while i < s1:
        cp, ln = _decode(src, i)
        k = cls[cp]
        word = (k & 1) != 0 or (mode == MODE_CODE and cp == _UNDERSCORE)
        if word:
            if not in_tok:
                if nt > 0:
                    out[o] = _SPACE
                    o += 1
                ts[nt] = o
                nt += 1
                in_tok = True
                in_digits = False
            if numbers and (k & 2) != 0:
                if not in_digits:
                    out[o] = _ZERO_CHAR
                    o += 1
                    in_digits = True
            else:
                for j in range(ln):
                    out[o + j] = src[i + j]
                o += ln
                in_digits = False
        else:
            in_tok = False
            if mode == MODE_CODE and (k & 4) == 0:
                if nt > 0:
                    out[o] = _SPACE
                    o += 1
                ts[nt] = o
                for j in range(ln):
                    out[o + j] = src[i + j]
                o += ln
                nt += 1
        i += ln
    return o, nt


@njit(cache=True)
def _char_starts(out, length, ts):
    """Start offsets of the code points of out[:length] into ts; return their count."""
    n = 0
    for i in range(length):
        if (np.int64(out[i]) & 0xC0) != 0x80:
            ts[n] = i
            n += 1
    return n


@njit(cache=True)
def _shingle_span(mode, j, n, units, ts, length):
    """Byte span of shingle j (or of the only shingle when units < n)."""
    if units < n:
        return 0, length
    if j + n == units:
        return ts[j], length
    if mode == MODE_CHAR:
        return ts[j], ts[j + n]
    return ts[j], ts[j + n] - 1              # drop the space before the next token


@njit(inline="always")
def _hash_value(h0, h1, scheme):
    """datasketch's input hash: sha1_hash32 (little-endian first 4 bytes) or sha1_hash64 (first 8)."""
    lo = _bswap32(h0)
    if scheme == SCHEME_AFFINE64:
        return lo | (_bswap32(h1) << _U32)
    return lo


@njit(cache=True)
def _fold(hv, scheme, pa, pb, sig):
    """sig = min(sig, permutation_k(hv)) for every k, with datasketch's formulas per scheme."""
    P = sig.shape[0]
    if scheme == SCHEME_AFFINE32:
        h = hv
        h ^= h >> _U16
        h = (h * _FM32A) & _M32
        h ^= h >> _U13
        h = (h * _FM32B) & _M32
        h ^= h >> _U16
        for k in range(P):
            sig[k] = min(sig[k], (pa[k] * h + pb[k]) & _M32)
    elif scheme == SCHEME_LEGACY:
        for k in range(P):
            x = pa[k] * hv + pb[k]
            r = (x & _MERSENNE) + (x >> _U61)
            if r >= _MERSENNE:
                r -= _MERSENNE
            sig[k] = min(sig[k], r & _M32)
    else:
        h = hv
        h ^= h >> _U33
        h = h * _FM64A
        h ^= h >> _U33
        h = h * _FM64B
        h ^= h >> _U33
        for k in range(P):
            sig[k] = min(sig[k], pa[k] * h + pb[k])


@njit(cache=True)
def signature_batch(src, offsets, modes, ngrams, numbers, cls, scheme, pa, pb, empty, out_sig, out_count):
    """MinHash signatures of the documents src[offsets[i]:offsets[i+1]] into out_sig (uint64) and out_count."""
    ndocs = offsets.shape[0] - 1
    longest = 0
    for d in range(ndocs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    norm = np.empty(2 * longest + 1, np.uint8)  # code mode adds spaces: 'a=b' → 'a = b'
    ts = np.empty(longest + 2, np.int32)        # tokens <= input code points; char units <= normalized bytes
    w = np.empty(80, np.uint64)
    P = pa.shape[0]
    sig = np.empty(P, np.uint64)
    for d in range(ndocs):
        mode = modes[d]
        n = ngrams[d]
        length, units = _normalize(src, offsets[d], offsets[d + 1], mode, numbers, cls, norm, ts)
        if mode == MODE_CHAR:
            units = _char_starts(norm, length, ts)
        sig[:] = empty
        count = 0
        if units > 0:
            count = max(units - n + 1, 1)
            for j in range(count):
                s, e = _shingle_span(mode, j, n, units, ts, length)
                h0, h1 = _sha1_head(norm, s, e, w)
                _fold(_hash_value(h0, h1, scheme), scheme, pa, pb, sig)
        out_sig[d, :] = sig
        out_count[d] = count


_C1 = np.uint64(0x87C37B91114253D5)
_C2 = np.uint64(0x4CF5AD432745937F)
_C3 = np.uint64(0x52DCE729)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_U27_64 = np.uint64(27)
_U31_64 = np.uint64(31)
_U37 = np.uint64(37)


@njit(inline="always")
def _mix_block(k):
    k = k * _C1
    k = (k << _U31_64) | (k >> _U33)
    return k * _C2


@njit(cache=True)
def _fast64(buf, s, e):
    """A MurmurHash3-style 64-bit hash of buf[s:e] (set membership for the Jaccard check, not for signatures)."""
    h = np.uint64(e - s) * _GOLDEN
    i = s
    while i + 8 <= e:
        k = _U0
        for j in range(8):
            k |= np.uint64(buf[i + j]) << np.uint64(8 * j)
        h ^= _mix_block(k)
        h = ((h << _U27_64) | (h >> _U37)) * _U5 + _C3
        i += 8
    if i < e:
        k = _U0
        for j in range(e - i):
            k |= np.uint64(buf[i + j]) << np.uint64(8 * j)
        h ^= _mix_block(k)
    h ^= h >> _U33
    h = h * _FM64A
    h ^= h >> _U33
    h = h * _FM64B
    return h ^ (h >> _U33)


@njit(cache=True)
def shingle_sets(src, offsets, modes, ngrams, numbers, cls):
    """Sorted distinct 64-bit hashes (:func:`_fast64`) of each document's shingles: (values, per-doc offsets)."""
    ndocs = offsets.shape[0] - 1
    longest = 0
    for d in range(ndocs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    norm = np.empty(2 * longest + 1, np.uint8)  # code mode adds spaces: 'a=b' → 'a = b'
    ts = np.empty(longest + 2, np.int32)        # tokens <= input code points; char units <= normalized bytes
    values = np.empty(offsets[ndocs] - offsets[0] + ndocs, np.uint64)  # shingles <= code points
    out_off = np.zeros(ndocs + 1, np.int64)
    pos = 0
    for d in range(ndocs):
        mode = modes[d]
        n = ngrams[d]
        length, units = _normalize(src, offsets[d], offsets[d + 1], mode, numbers, cls, norm, ts)
        if mode == MODE_CHAR:
            units = _char_starts(norm, length, ts)
        start = pos
        if units > 0:
            for j in range(max(units - n + 1, 1)):
                s, e = _shingle_span(mode, j, n, units, ts, length)
                values[pos] = _fast64(norm, s, e)
                pos += 1
            seg = np.sort(values[start:pos])
            m = 0
            for j in range(seg.shape[0]):
                if j == 0 or seg[j] != seg[j - 1]:
                    values[start + m] = seg[j]
                    m += 1
            pos = start + m
        out_off[d + 1] = pos
    return values[:pos].copy(), out_off


@njit(cache=True)
def intersections(values, offs, ea, eb):
    """|A ∩ B| for each pair (ea[i], eb[i]) of documents whose sorted sets are values[offs[d]:offs[d+1]]."""
    m = ea.shape[0]
    out = np.zeros(m, np.int64)
    for i in range(m):
        a0, a1 = offs[ea[i]], offs[ea[i] + 1]
        b0, b1 = offs[eb[i]], offs[eb[i] + 1]
        c = 0
        while a0 < a1 and b0 < b1:
            va = values[a0]
            vb = values[b0]
            if va == vb:
                c += 1
                a0 += 1
                b0 += 1
            elif va < vb:
                a0 += 1
            else:
                b0 += 1
        out[i] = c
    return out
