"""fmha_dsl.reference against independent truth.

The oracle here is a brute-force float64 loop written per element straight from docs/semantics.md
(own mask logic, own scalar Philox in plain Python ints with Random123's key schedule), plus
hand-derived values, the Random123 known-answer vectors, tl.rand values recorded under
TRITON_INTERPRET=1, and (when triton is installed) a live bit-exact comparison with tl.rand.
"""

import math
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from fmha_dsl.errors import UsageError
from fmha_dsl.reference import (
    attention_fwd,
    philox4x32,
    philox_uniform,
    uint32_to_uniform_float,
)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
M32 = 0xFFFFFFFF

# ---------------------------------------------------------------------------------------------
# independent oracle
# ---------------------------------------------------------------------------------------------


def scalar_philox(ctr, key, rounds=10):
    """Random123 philox4x32: key bumped *before* rounds 2..R (the reference bumps after each)."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


def scalar_uniform(seed, offset):
    """tl.rand for one int64 offset: word -> int32, negative -> ~x, times fp32 2**-31-ish."""
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    x = scalar_philox((offset & M32, offset >> 32, 0, 0), (seed & M32, seed >> 32))[0]
    if x >= 1 << 31:
        x = (1 << 32) - 1 - x  # ~int32(x)
    return np.float32(x) * np.float32(4.6566127342e-10)


def allowed(i, j, Sq, Sk, causal, window, sink):
    corner = None if causal in (None, False) else ("tl" if causal is True or causal == "top_left" else "br")
    off = 0 if corner == "tl" else Sk - Sq
    if window is None:
        ok = True if corner is None else j <= i + off
    else:
        left, right = window
        if corner is not None:
            right = 0
        d = i + off
        ok = (left < 0 or d - left <= j) and (right < 0 or j <= d + right)
    return ok or j < sink


def brute(q, k, v, *, causal=None, window=None, bias=None, alibi_slopes=None, dropout_p=0.0, seed=0, offset=0,
          softcap=None, sink=0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Per-element float64 loops.  Returns (out, lse) in the API's layouts, float64."""
    group = cu_seqlens_q is not None
    if group:
        cq, ck = list(cu_seqlens_q), list(cu_seqlens_k)
        B = len(cq) - 1
        seqs = [(q[cq[b]:cq[b + 1]].transpose(1, 0, 2), k[ck[b]:ck[b + 1]].transpose(1, 0, 2),
                 v[ck[b]:ck[b + 1]].transpose(1, 0, 2)) for b in range(B)]
        Hq, Hk, Dv = q.shape[1], k.shape[1], v.shape[2]
        out = np.zeros((q.shape[0], Hq, Dv))
        lse = np.full((Hq, q.shape[0]), -np.inf)
    else:
        B, Hq, Hk, Dv = q.shape[0], q.shape[1], k.shape[1], v.shape[3]
        seqs = [(q[b], k[b], v[b]) for b in range(B)]
        out = np.zeros((B, Hq, q.shape[2], Dv))
        lse = np.full((B, Hq, q.shape[2]), -np.inf)
    Sq_max = max([s[0].shape[1] for s in seqs], default=0)
    Sk_max = max([s[1].shape[1] for s in seqs], default=0)
    Dq = q.shape[-1]
    sc = 1.0 / math.sqrt(Dq) if scale is None else scale
    for b, (qb, kb, vb) in enumerate(seqs):
        qb, kb, vb = qb.astype(np.float64).tolist(), kb.astype(np.float64).tolist(), vb.astype(np.float64).tolist()
        Sq, Sk = len(qb[0]), len(kb[0])
        for h in range(Hq):
            hk = h // (Hq // Hk)
            for i in range(Sq):
                row = []
                for j in range(Sk):
                    if not allowed(i, j, Sq, Sk, causal, window, sink):
                        continue
                    s = sc * math.fsum(qb[h][i][d] * kb[hk][j][d] for d in range(Dq))
                    if softcap is not None:
                        s = softcap * math.tanh(s / softcap)
                    if bias is not None:
                        s += float(bias[b if bias.shape[0] > 1 else 0, h if bias.shape[1] > 1 else 0, i, j])
                    if alibi_slopes is not None:
                        slope = alibi_slopes[h] if alibi_slopes.ndim == 1 else alibi_slopes[b, h]
                        s += -float(slope) * abs((i + Sk - Sq) - j)
                    if s != -math.inf:
                        row.append((j, s))
                o = [0.0] * Dv
                if row:
                    m = max(s for _, s in row)
                    l = math.fsum(math.exp(s - m) for _, s in row)
                    L = m + math.log(l)
                    for j, s in row:
                        p = math.exp(s - m) / l
                        if dropout_p > 0:
                            u = scalar_uniform(seed, offset + ((b * Hq + h) * Sq_max + i) * Sk_max + j)
                            p = p / (1 - dropout_p) if u >= np.float32(dropout_p) else 0.0
                        for d in range(Dv):
                            o[d] += p * vb[hk][j][d]
                else:
                    L = -math.inf
                if group:
                    out[cq[b] + i, h] = o
                    lse[h, cq[b] + i] = L
                else:
                    out[b, h, i] = o
                    lse[b, h, i] = L
    return out, lse


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(q, k, v, **kw):
    """Reference (float64 accumulate: tight; float32: loose) vs the brute-force oracle; no warnings."""
    want_o, want_l = brute(q, k, v, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o64, l64 = attention_fwd(q, k, v, accum=np.float64, **kw)
        o32, l32 = attention_fwd(q, k, v, **kw)
    assert o32.dtype == q.dtype and o64.dtype == q.dtype
    assert l32.dtype == np.float32 and l64.dtype == np.float32
    assert o32.shape == want_o.shape and l32.shape == want_l.shape
    assert not np.isnan(o32).any() and not np.isnan(l32).any()
    assert np.array_equal(np.isneginf(l32), np.isneginf(want_l)) and np.array_equal(np.isneginf(l64), np.isneginf(want_l))
    fin = np.isfinite(want_l)
    tight = 1e-6 if q.dtype != np.float16 else 2e-3  # output rounded to q's dtype, lse to float32
    np.testing.assert_allclose(o64, want_o, rtol=tight, atol=tight)
    np.testing.assert_allclose(l64[fin], want_l[fin], rtol=1e-6, atol=1e-6)
    loose = 2e-4 if q.dtype != np.float16 else 4e-3
    np.testing.assert_allclose(o32, want_o, rtol=loose, atol=loose)
    np.testing.assert_allclose(l32[fin], want_l[fin], rtol=1e-5, atol=1e-5)
    return o32, l32


# ---------------------------------------------------------------------------------------------
# hand-checked values
# ---------------------------------------------------------------------------------------------


def test_hand_checked_1x1x2x2():
    q = np.array([[[[1.0, 0.0], [0.0, 1.0]]]], np.float64)
    k = q.copy()
    v = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float64)
    a = 1 / math.sqrt(2)  # score of a matching key; the other is 0
    p = math.exp(a) / (math.exp(a) + 1)  # weight of the matching key
    L = math.log(math.exp(a) + 1)
    out, lse = attention_fwd(q, k, v, accum=np.float64)
    np.testing.assert_allclose(out[0, 0], [[p * 1 + (1 - p) * 3, p * 2 + (1 - p) * 4],
                                           [(1 - p) * 1 + p * 3, (1 - p) * 2 + p * 4]], rtol=1e-12)
    np.testing.assert_allclose(lse[0, 0], [L, L], rtol=1e-7)
    assert abs(out[0, 0, 0, 0] - 1.6604769) < 1e-7  # 3 - 2 * sigmoid(1/sqrt 2), worked out by hand
    # causal (either corner when Sq == Sk): row 0 sees only key 0
    for c in (True, "top_left", "bottom_right"):
        out, lse = attention_fwd(q, k, v, causal=c, accum=np.float64)
        np.testing.assert_allclose(out[0, 0, 0], [1.0, 2.0])
        np.testing.assert_allclose(lse[0, 0, 0], a, rtol=1e-7)
        np.testing.assert_allclose(out[0, 0, 1], [(1 - p) * 1 + p * 3, (1 - p) * 2 + p * 4], rtol=1e-12)
    # window (0, 0): each row sees only its diagonal key
    out, lse = attention_fwd(q, k, v, window=(0, 0), accum=np.float64)
    np.testing.assert_allclose(out[0, 0], v[0, 0])
    np.testing.assert_allclose(lse[0, 0], [a, a], rtol=1e-7)
    # softcap 0.5 and scale 2: s = 0.5 * tanh(2 * 1 / 0.5) = 0.5 * tanh(4)
    out, lse = attention_fwd(q, k, v, softcap=0.5, scale=2.0, accum=np.float64)
    c = 0.5 * math.tanh(4.0)
    np.testing.assert_allclose(lse[0, 0], [math.log(math.exp(c) + 1)] * 2, rtol=1e-7)
    # ALiBi slope 1 with Sq == Sk: off-diagonal scores lose 1
    out, lse = attention_fwd(q, k, v, alibi_slopes=np.array([1.0]), accum=np.float64)
    np.testing.assert_allclose(lse[0, 0], [math.log(math.exp(a) + math.exp(-1))] * 2, rtol=1e-7)


# ---------------------------------------------------------------------------------------------
# every feature against the oracle
# ---------------------------------------------------------------------------------------------

MASKS = [
    {},
    {"causal": True},
    {"causal": "top_left"},
    {"causal": "bottom_right"},
    {"causal": False, "window": (-1, -1)},
    {"window": (2, 1)},  # bottom-right aligned
    {"window": (1, -1)},
    {"window": (-1, 0)},  # == causal bottom-right
    {"window": (0, 2)},
    {"causal": True, "window": (2, 3)},  # top-left, right clipped to 0
    {"causal": "top_left", "window": (1, -1)},
    {"causal": "bottom_right", "window": (1, 5)},
    {"causal": True, "sink": 2},
    {"causal": "bottom_right", "window": (0, 0), "sink": 1},
    {"window": (1, 0), "sink": 3},
]


@pytest.mark.parametrize("Sq,Sk", [(5, 7), (7, 4), (6, 6)])
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()) or "none")
def test_masks_match_oracle(mask, Sq, Sk):
    rng = np.random.default_rng(Sq * 100 + Sk)
    q, k, v = rand(rng, 1, 2, Sq, 4), rand(rng, 1, 2, Sk, 4), rand(rng, 1, 2, Sk, 3)
    check(q, k, v, **mask)


def test_window_alignments_differ_and_equal_causal():
    rng = np.random.default_rng(1)
    q, k, v = rand(rng, 1, 1, 3, 4), rand(rng, 1, 1, 6, 4), rand(rng, 1, 1, 6, 4)
    br, _ = attention_fwd(q, k, v, window=(-1, 0))
    tl, _ = attention_fwd(q, k, v, causal=True, window=(-1, 5))  # right clipped to 0 => causal top-left
    np.testing.assert_array_equal(br, attention_fwd(q, k, v, causal="bottom_right")[0])
    np.testing.assert_array_equal(tl, attention_fwd(q, k, v, causal=True)[0])
    assert not np.allclose(br, tl)


@pytest.mark.parametrize("bshape", [(1, 1), (2, 1), (1, 4), (2, 4)])
def test_bias_broadcasting(bshape):
    rng = np.random.default_rng(2)
    q, k, v = rand(rng, 2, 4, 3, 4), rand(rng, 2, 2, 5, 4), rand(rng, 2, 2, 5, 2)
    bias = rand(rng, *bshape, 3, 5)
    bias[..., 0, 1] = -np.inf  # -inf bias entries behave as masked
    check(q, k, v, bias=bias, causal="bottom_right")


def test_bias_float16_with_float32_inputs_and_all_minus_inf_row():
    rng = np.random.default_rng(3)
    q, k, v = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 4, 4), rand(rng, 1, 2, 4, 4)
    bias = rand(rng, 1, 2, 3, 4, dtype=np.float16)
    bias[0, 1, 2, :] = -np.inf
    o, l = check(q, k, v, bias=bias)
    assert np.all(o[0, 1, 2] == 0) and np.isneginf(l[0, 1, 2])


@pytest.mark.parametrize("per_batch", [False, True])
def test_alibi(per_batch):
    rng = np.random.default_rng(4)
    q, k, v = rand(rng, 2, 4, 4, 4), rand(rng, 2, 1, 6, 4), rand(rng, 2, 1, 6, 3)
    slopes = np.abs(rand(rng, 2, 4)) if per_batch else np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    check(q, k, v, alibi_slopes=slopes)
    check(q, k, v, alibi_slopes=slopes, causal=True, window=(2, -1))


def test_softcap_scale_bias_alibi_sink_together():
    rng = np.random.default_rng(5)
    q, k, v = rand(rng, 2, 4, 5, 6) * 3, rand(rng, 2, 2, 7, 6) * 3, rand(rng, 2, 2, 7, 5)
    check(q, k, v, softcap=2.5, scale=0.7, bias=rand(rng, 2, 1, 5, 7), alibi_slopes=np.abs(rand(rng, 4)),
          causal="bottom_right", window=(2, 0), sink=1)


@pytest.mark.parametrize("Hq,Hk", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("Dq,Dv", [(4, 4), (5, 3), (2, 7)])
def test_gqa_mqa_and_head_dims(Hq, Hk, Dq, Dv):
    rng = np.random.default_rng(Hq * 10 + Hk + Dq * 7 + Dv)
    q, k, v = rand(rng, 1, Hq, 3, Dq), rand(rng, 1, Hk, 4, Dq), rand(rng, 1, Hk, 4, Dv)
    o, _ = check(q, k, v, causal="bottom_right")
    assert o.shape == (1, Hq, 3, Dv)


def test_gqa_heads_share_their_key_head():
    rng = np.random.default_rng(6)
    q1 = rand(rng, 1, 1, 3, 4)
    q, k, v = np.repeat(q1, 4, axis=1), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 4)
    o, _ = attention_fwd(q, k, v)
    np.testing.assert_array_equal(o[0, 0], o[0, 1])  # heads 0, 1 -> key head 0
    np.testing.assert_array_equal(o[0, 2], o[0, 3])  # heads 2, 3 -> key head 1
    assert not np.allclose(o[0, 0], o[0, 2])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtypes(dtype):
    rng = np.random.default_rng(7)
    q, k, v = rand(rng, 1, 2, 4, 8, dtype=dtype), rand(rng, 1, 2, 6, 8, dtype=dtype), rand(rng, 1, 2, 6, 8, dtype=dtype)
    check(q, k, v, causal=True)


def test_strided_views_are_accepted():
    rng = np.random.default_rng(8)
    q = rand(rng, 2, 5, 3, 4).transpose(0, 2, 1, 3)  # BSHD passed as BHSD view
    k = rand(rng, 2, 6, 3, 4).transpose(0, 2, 1, 3)
    v = rand(rng, 2, 3, 4, 6).transpose(0, 1, 3, 2)  # "column-major" V: sequence stride 1
    check(q, k, v, causal="bottom_right")
    o1, l1 = attention_fwd(q, k, v)
    o2, l2 = attention_fwd(*(np.ascontiguousarray(x) for x in (q, k, v)))
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(l1, l2)


def test_group_mode_with_empty_sequences():
    rng = np.random.default_rng(9)
    lens_q, lens_k = [3, 0, 4, 2, 1], [5, 2, 0, 3, 1]  # b=1: Sq 0; b=2: Sk 0 (fully masked rows)
    cq, ck = np.cumsum([0] + lens_q).astype(np.int32), np.cumsum([0] + lens_k).astype(np.int32)
    Hq, Hk = 4, 2
    q, k, v = rand(rng, cq[-1], Hq, 4), rand(rng, ck[-1], Hk, 4), rand(rng, ck[-1], Hk, 3)
    kw = {"cu_seqlens_q": cq, "cu_seqlens_k": ck}
    o, l = check(q, k, v, **kw)
    assert o.shape == (cq[-1], Hq, 3) and l.shape == (Hq, cq[-1])
    assert np.all(o[cq[2]:cq[3]] == 0) and np.all(np.isneginf(l[:, cq[2]:cq[3]]))
    check(q, k, v, causal="bottom_right", window=(1, 0), sink=1, **kw)
    check(q, k, v, causal=True, alibi_slopes=np.abs(rand(rng, 5, Hq)), softcap=1.5, **kw)
    check(q, k, v, bias=rand(rng, 5, 1, 4, 5), dropout_p=0.25, seed=3, offset=11, **kw)
    # each sequence alone in batch mode gives the same rows
    for b in (0, 3):
        ob, lb = attention_fwd(q[None, cq[b]:cq[b + 1]].transpose(0, 2, 1, 3),
                               k[None, ck[b]:ck[b + 1]].transpose(0, 2, 1, 3),
                               v[None, ck[b]:ck[b + 1]].transpose(0, 2, 1, 3), causal=True)
        og, lg = attention_fwd(q, k, v, causal=True, **kw)
        np.testing.assert_allclose(og[cq[b]:cq[b + 1]], ob[0].transpose(1, 0, 2), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(lg[:, cq[b]:cq[b + 1]], lb[0], rtol=1e-6)


def test_group_mode_all_empty_and_no_sequences():
    q, k, v = np.zeros((0, 2, 4), np.float32), np.zeros((0, 2, 4), np.float32), np.zeros((0, 2, 4), np.float32)
    for cu in ([0], [0, 0, 0]):
        o, l = attention_fwd(q, k, v, cu_seqlens_q=np.array(cu, np.int32), cu_seqlens_k=np.array(cu, np.int32))
        assert o.shape == (0, 2, 4) and l.shape == (2, 0)


def test_sk_zero_and_fully_masked_rows_no_nan_no_warning():
    rng = np.random.default_rng(10)
    q, k, v = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 0, 4), rand(rng, 1, 2, 0, 5)
    old = np.seterr(all="raise")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            o, l = attention_fwd(q, k, v, dropout_p=0.5)
            assert o.shape == (1, 2, 3, 5) and np.all(o == 0) and np.all(np.isneginf(l))
            # Sq > Sk with bottom-right causal: the first Sq - Sk rows see nothing
            k2, v2 = rand(rng, 1, 2, 2, 4), rand(rng, 1, 2, 2, 5)
            o, l = attention_fwd(q, k2, v2, causal="bottom_right")
            assert np.all(o[0, :, 0] == 0) and np.all(np.isneginf(l[0, :, 0])) and np.isfinite(l[0, :, 1:]).all()
            # a window that misses every key
            o, l = attention_fwd(q, k2, v2, window=(0, 0), causal=None)
            assert not np.isnan(o).any() and np.isneginf(l[0, :, 0]).all()
    finally:
        np.seterr(**old)
    check(q, k2, v2, causal="bottom_right", sink=0)


def test_row_blocks_give_the_same_answer(monkeypatch):
    import fmha_dsl.reference as ref

    rng = np.random.default_rng(14)
    q, k, v = rand(rng, 1, 2, 9, 4), rand(rng, 1, 2, 6, 4), rand(rng, 1, 2, 6, 3)
    kw = {"causal": "bottom_right", "window": (3, 0), "sink": 1, "bias": rand(rng, 1, 2, 9, 6), "dropout_p": 0.25, "seed": 8}
    whole = attention_fwd(q, k, v, **kw)
    monkeypatch.setattr(ref, "_ROW_BLOCK_ELEMS", 13)  # 2 rows per block
    parts = check(q, k, v, **kw)
    np.testing.assert_allclose(parts[0], whole[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(parts[0] == 0, whole[0] == 0)


# ---------------------------------------------------------------------------------------------
# dropout
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [{}, {"causal": "bottom_right", "window": (2, 1)}])
def test_dropout_matches_oracle(mask):
    rng = np.random.default_rng(11)
    q, k, v = rand(rng, 2, 4, 3, 4), rand(rng, 2, 2, 5, 4), rand(rng, 2, 2, 5, 3)
    check(q, k, v, dropout_p=0.25, seed=1234, offset=77, **mask)
    check(q, k, v, dropout_p=0.5, seed=-5, offset=2**32 - 40, **mask)  # offsets cross into the high word


def _probs(q, k, **kw):
    """Dropped softmax probabilities: with v = I (Dv = Sk) the output is p itself."""
    Sk = k.shape[2]
    v = np.broadcast_to(np.eye(Sk, dtype=np.float64), (k.shape[0], k.shape[1], Sk, Sk))
    return attention_fwd(q, k, v, accum=np.float64, **kw)


def test_dropout_statistics_and_lse_unchanged():
    rng = np.random.default_rng(12)
    q, k = rand(rng, 2, 2, 32, 8, dtype=np.float64), rand(rng, 2, 2, 40, 8, dtype=np.float64)
    p0, l0 = _probs(q, k)
    for pd in (0.1, 0.5, 0.9):
        p1, l1 = _probs(q, k, dropout_p=pd, seed=99)
        np.testing.assert_array_equal(l1, l0)  # lse is the un-dropped one
        kept = p1 != 0
        n = kept.size
        assert abs(kept.mean() - (1 - pd)) < 4 * math.sqrt(pd * (1 - pd) / n)
        np.testing.assert_allclose(p1[kept], p0[kept] / (1 - pd), rtol=1e-12)
        # unbiased: each row sums to 1 in expectation
        rows = p1.sum(-1)
        assert abs(rows.mean() - 1) < 0.1
    u = philox_uniform(7, np.arange(200000))
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(hist - 20000) < 600)


def test_dropout_reproducible_from_seed_and_offset():
    rng = np.random.default_rng(13)
    B, H, Sq, Sk = 2, 3, 4, 5
    q, k = rand(rng, B, H, Sq, 4, dtype=np.float64), rand(rng, B, H, Sk, 4, dtype=np.float64)
    a, _ = _probs(q, k, dropout_p=0.3, seed=5, offset=100)
    b, _ = _probs(q, k, dropout_p=0.3, seed=5, offset=100)
    assert np.array_equal(a, b)
    assert not np.array_equal(a != 0, _probs(q, k, dropout_p=0.3, seed=6, offset=100)[0] != 0)
    assert not np.array_equal(a != 0, _probs(q, k, dropout_p=0.3, seed=5, offset=101)[0] != 0)
    # the counter is offset + ((b*H + h)*Sq + i)*Sk + j: shifting the offset by one head's block
    # moves the keep pattern by one head
    keep = a != 0
    shifted = _probs(q, k, dropout_p=0.3, seed=5, offset=100 + Sq * Sk)[0] != 0
    np.testing.assert_array_equal(shifted.reshape(B * H, Sq, Sk)[:-1], keep.reshape(B * H, Sq, Sk)[1:])
    # and the keep pattern is exactly tl.rand(seed, counter) >= p
    cnt = 100 + np.arange(B * H * Sq * Sk).reshape(B, H, Sq, Sk)
    np.testing.assert_array_equal(keep, philox_uniform(5, cnt) >= np.float32(0.3))


# ---------------------------------------------------------------------------------------------
# Philox
# ---------------------------------------------------------------------------------------------

# Random123 tests/kat_vectors (github.com/DEShawResearch/random123): rounds, counter, key, expected
KAT = [
    (7, (0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    (7, (M32,) * 4, (M32, M32), (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    (7, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)),
    (10, (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (10, (M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (10, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("rounds,ctr,key,want", KAT)
def test_philox_known_answers(rounds, ctr, key, want):
    assert tuple(int(x) for x in philox4x32(ctr, key, rounds)) == want
    assert scalar_philox(ctr, key, rounds) == want  # the oracle's own Philox is right too
    # vectorised: the same block in the middle of an array
    c = [np.array([1, x, 2], np.uint32) for x in ctr]
    got = philox4x32(c, key, rounds)
    assert tuple(int(w[1]) for w in got) == want and all(w.dtype == np.uint32 for w in got)


# tl.rand(seed, int64 offsets) recorded with Triton 3.9.0 under TRITON_INTERPRET=1 (float32 bits)
TL_RAND = [
    (0, [0, 1, 2, 3], [0x3F4C4FD1, 0x3D63666A, 0x3D1F5464, 0x3ED9BC42]),
    (42, [0, 7, 2**31 - 1, 2**32 + 5], [0x3F462A1E, 0x3F377B06, 0x3EBC362E, 0x3E18D44F]),
    (-1, [5, 6, 100000, 2**40 + 3], [0x3F5CBE09, 0x3F47B32D, 0x3EADC1EB, 0x3F25581F]),
]


@pytest.mark.parametrize("seed,offs,bits", TL_RAND)
def test_philox_uniform_recorded_tl_rand(seed, offs, bits):
    got = philox_uniform(seed, np.array(offs, np.int64))
    assert got.view(np.uint32).tolist() == bits
    assert [np.float32(scalar_uniform(seed, o)).view(np.uint32) for o in offs] == bits


def test_philox_uniform_offsets_dtypes_and_conversion_edges():
    off = np.arange(-50, 50)
    a = philox_uniform(3, off.astype(np.int32))
    np.testing.assert_array_equal(a[50:], philox_uniform(3, off[50:].astype(np.int64)))  # same below 2**31
    np.testing.assert_array_equal(a, philox_uniform(3, (off & M32).astype(np.uint32)))
    np.testing.assert_array_equal(a[50:], philox_uniform(3, off[50:].tolist()))
    assert philox_uniform(3, np.arange(6).reshape(2, 3)).shape == (2, 3)
    # int64 offsets use the high word; int32 ones cannot
    assert philox_uniform(3, np.array([2**32 + 1]))[0] != philox_uniform(3, np.array([1]))[0]
    # seeds are taken mod 2**64
    np.testing.assert_array_equal(philox_uniform(-1, off), philox_uniform(2**64 - 1, off))
    w = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE], np.uint32)
    f = uint32_to_uniform_float(w)
    assert f.dtype == np.float32 and f[0] == 0 and f[4] == 0 and f.max() < 1  # ~int32(-1) = 0
    assert f[2] == f[3] == np.float32(0.99999994) and f[1] == f[5]  # 0x80000000 -> ~ -> 0x7fffffff


_LIVE = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, triton, triton.language as tl
from fmha_dsl.reference import philox_uniform

class Arr:  # duck-typed CPU tensor over one numpy array (no torch)
    def __init__(self, a): self.a = a
    dtype = property(lambda self: str(self.a.dtype))
    def data_ptr(self): return self.a.ctypes.data
    def untyped_storage(self): return self
    def cpu(self): return self
    def new_empty(self, *a, **k): return Arr(self.a)
    def set_(self, storage, offset, size, stride): self.a = storage.a; return self
    def copy_(self, other):
        if other.a is not self.a: self.a[...] = other.a
        return self
    def storage_offset(self): return 0
    def size(self): return self.a.shape
    def stride(self): return tuple(s // self.a.itemsize for s in self.a.strides)

@triton.jit
def kern(out_ptr, off_ptr, seed, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.rand(seed, tl.load(off_ptr + i)))

rng = np.random.default_rng(0)
n = 0
for seed in (0, 12345, 2**31 + 5, 2**32 + 7, 2**64 - 1, -987654321):
    for off in (rng.integers(-2**31, 2**31, 1024).astype(np.int32), rng.integers(-2**63, 2**63, 1024)):
        out = np.zeros(off.size, np.float32)
        kern[(1,)](Arr(out), Arr(off), seed, N=off.size)
        assert np.array_equal(out.view(np.uint32), philox_uniform(seed, off).view(np.uint32)), (seed, off.dtype)
        n += off.size
assert "torch" not in sys.modules
print("bit-exact", n)
'''


def test_philox_uniform_bit_exact_with_live_tl_rand():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_LIVE)], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=120, check=False)
    assert r.returncode == 0 and "bit-exact 12288" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------

_R = np.random.default_rng(20)
Q, K, V = _R.standard_normal((2, 4, 3, 8)), _R.standard_normal((2, 2, 5, 8)), _R.standard_normal((2, 2, 5, 6))
Qg, Kg, Vg = _R.standard_normal((6, 4, 8)), _R.standard_normal((7, 2, 8)), _R.standard_normal((7, 2, 6))
CQ, CK = np.array([0, 2, 6], np.int32), np.array([0, 3, 7], np.int32)

ERRORS = [
    ((Q[0], K, V), {}, "usage.shape", "4-D"),
    ((Q, K, V[..., 0]), {}, "usage.shape", "4-D"),
    ((Q, K[:1], V[:1]), {}, "usage.shape", "batch"),
    ((Q, K, V[:, :, :4]), {}, "usage.shape", "`v`"),
    ((Q, K[..., :7], V), {}, "usage.shape", "Dq=8"),
    ((Q[:, :3], K, V), {}, "usage.shape", "Hq % Hk"),
    ((Q.astype(np.int32), K, V), {}, "usage.dtype", "int32"),
    ((Q, K.astype(np.float32), V), {}, "usage.dtype", "float32"),
    ((Q.astype(np.complex64), K, V), {}, "usage.dtype", "complex64"),
    ((Q, K, V), {"dropout_p": 1.0}, "usage.value", "[0, 1)"),
    ((Q, K, V), {"dropout_p": -0.1}, "usage.value", "-0.1"),
    ((Q, K, V), {"softcap": 0.0}, "usage.value", "softcap"),
    ((Q, K, V), {"softcap": -1.0}, "usage.value", "-1.0"),
    ((Q, K, V), {"causal": "bottom-right"}, "usage.value", "bottom-right"),
    ((Q, K, V), {"causal": "topleft"}, "usage.value", "topleft"),
    ((Q, K, V), {"window": (1,)}, "usage.value", "window"),
    ((Q, K, V), {"window": (1.5, 0)}, "usage.value", "1.5"),
    ((Q, K, V), {"sink": -1}, "usage.value", "sink"),
    ((Q, K, V), {"seed": 1.5}, "usage.value", "seed"),
    ((Q, K, V), {"offset": -3}, "usage.value", "offset"),
    ((Q, K, V), {"scale": float("nan")}, "usage.value", "scale"),
    ((Q, K, V), {"bias": np.zeros((2, 4, 3, 4))}, "usage.shape", "(2, 4, 3, 4)"),
    ((Q, K, V), {"bias": np.zeros((3, 1, 3, 5))}, "usage.shape", "bias"),
    ((Q, K, V), {"bias": np.zeros((1, 4, 3, 5), np.int8)}, "usage.dtype", "int8"),
    ((Q, K, V), {"alibi_slopes": np.ones(2)}, "usage.shape", "(2,)"),
    ((Q, K, V), {"alibi_slopes": np.ones((3, 4))}, "usage.shape", "alibi"),
    ((Q, K, V), {"accum": np.float16}, "usage.dtype", "accum"),
    ((Qg, Kg, Vg), {"cu_seqlens_q": CQ}, "usage.shape", "cu_seqlens_k"),
    ((Q, K, V), {"cu_seqlens_q": CQ, "cu_seqlens_k": CK}, "usage.shape", "3-D"),
    ((Qg, Kg, Vg), {"cu_seqlens_q": np.array([1, 2, 6]), "cu_seqlens_k": CK}, "usage.shape", "start at 0"),
    ((Qg, Kg, Vg), {"cu_seqlens_q": np.array([0, 4, 2, 6]), "cu_seqlens_k": np.array([0, 3, 5, 7])}, "usage.shape",
     "non-decreasing"),
    ((Qg, Kg, Vg), {"cu_seqlens_q": np.array([0, 2, 5]), "cu_seqlens_k": CK}, "usage.shape", "6, got 5"),
    ((Qg, Kg, Vg), {"cu_seqlens_q": CQ, "cu_seqlens_k": np.array([0, 7])}, "usage.shape", "same length"),
    ((Qg, Kg, Vg), {"cu_seqlens_q": CQ.astype(np.float32), "cu_seqlens_k": CK}, "usage.shape", "integer"),
    ((Qg, Kg, Vg[:, :1]), {"cu_seqlens_q": CQ, "cu_seqlens_k": CK}, "usage.shape", "`v`"),
]


@pytest.mark.parametrize("args,kw,rule,text", ERRORS, ids=[f"{i}-{e[3]}" for i, e in enumerate(ERRORS)])
def test_usage_errors(args, kw, rule, text):
    with pytest.raises(UsageError) as info:
        attention_fwd(*args, **kw)
    e = info.value
    assert e.rule == rule, (e.rule, str(e))
    assert text in e.message, e.message
    assert "got" in e.message  # says what was given


def test_errors_carry_hints_and_philox_rejects_float_offsets():
    with pytest.raises(UsageError) as info:
        attention_fwd(Q, K, V, causal="bottom_rigth")
    assert "bottom_right" in info.value.hint
    with pytest.raises(UsageError) as info:
        philox_uniform(0, np.array([0.5]))
    assert info.value.rule == "usage.dtype"
