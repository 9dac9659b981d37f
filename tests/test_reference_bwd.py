"""The NumPy backward reference against finite differences of the NumPy forward (float64), feature by feature.

Independent truth: the gradient of ``sum(attention_fwd(...) * W)`` by central differences, every coordinate of
tiny problems.  The backward reference is then the truth for the kernels' tests."""

import numpy as np
import pytest

from fmha_dsl.errors import UsageError
from fmha_dsl.reference import attention_fwd
from fmha_dsl.reference_bwd import attention_bwd

EPS = 1e-6


def _numeric(f, x):
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + EPS
        hi = f()
        x[i] = old - EPS
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * EPS)
    return g


CASES = {
    "plain": {},
    "causal_top_left": {"causal": "top_left"},
    "causal_bottom_right": {"causal": "bottom_right", "sq": 3, "sk": 6},
    "window": {"window": (2, 1)},
    "window_sink": {"window": (1, 0), "sink": 2},
    "bias_broadcast": {"bias": (1, 2)},
    "bias_full": {"bias": (2, 2)},
    "alibi": {"alibi": True, "causal": True},
    "softcap": {"softcap": 1.5},
    "dropout": {"dropout_p": 0.3},
    "gqa": {"hq": 4, "hk": 2},
    "mqa_hdim_v": {"hq": 3, "hk": 1, "dv": 3},
    "scale": {"scale": 0.9},
    "everything": {"causal": "bottom_right", "sink": 1, "bias": (1, 2), "softcap": 2.0, "dropout_p": 0.25,
                   "hq": 2, "hk": 1, "sq": 4, "sk": 5},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_reference_matches_finite_differences_batch_mode(name):
    c = dict(CASES[name])
    rng = np.random.default_rng(sorted(CASES).index(name))
    B, hq, hk = 2, c.pop("hq", 2), c.pop("hk", 2)
    sq, sk, d, dv = c.pop("sq", 4), c.pop("sk", 4), 4, c.pop("dv", 4)
    q = rng.standard_normal((B, hq, sq, d))
    k = rng.standard_normal((B, hk, sk, d))
    v = rng.standard_normal((B, hk, sk, dv))
    w = rng.standard_normal((B, hq, sq, dv))
    kw = {"seed": 11, "offset": 3}
    if "bias" in c:
        bb, bh = c.pop("bias")
        kw["bias"] = rng.standard_normal((bb, bh, sq, sk))
    if c.pop("alibi", False):
        kw["alibi_slopes"] = rng.uniform(0.1, 1.0, (hq,))
    kw.update(c)

    def loss():
        o, _ = attention_fwd(q, k, v, accum=np.float64, **kw)
        return float((o * w).sum())

    out, lse = attention_fwd(q, k, v, accum=np.float64, **kw)
    dq, dk, dv_, db = attention_bwd(q, k, v, out, lse, w, accum=np.float64, **kw)
    np.testing.assert_allclose(dq, _numeric(loss, q), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(dk, _numeric(loss, k), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(dv_, _numeric(loss, v), atol=1e-6, rtol=1e-5)
    if "bias" in kw:
        np.testing.assert_allclose(db, _numeric(loss, kw["bias"]), atol=1e-6, rtol=1e-5)
    else:
        assert db is None


def test_backward_reference_group_mode_with_an_empty_sequence_matches_finite_differences():
    rng = np.random.default_rng(5)
    cq = np.array([0, 3, 3, 5], np.int32)
    ck = np.array([0, 4, 6, 6], np.int32)   # sequence 1 has no queries, sequence 2 no keys
    q = rng.standard_normal((5, 2, 4))
    k = rng.standard_normal((6, 1, 4))
    v = rng.standard_normal((6, 1, 3))
    w = rng.standard_normal((5, 2, 3))
    bias = rng.standard_normal((3, 1, 3, 4))
    kw = {"cu_seqlens_q": cq, "cu_seqlens_k": ck, "causal": "bottom_right", "bias": bias, "dropout_p": 0.2,
          "seed": 3}

    def loss():
        o, _ = attention_fwd(q, k, v, accum=np.float64, **kw)
        return float((o * w).sum())

    out, lse = attention_fwd(q, k, v, accum=np.float64, **kw)
    dq, dk, dv, db = attention_bwd(q, k, v, out, lse, w, accum=np.float64, **kw)
    for got, x in ((dq, q), (dk, k), (dv, v), (db, bias)):
        np.testing.assert_allclose(got, _numeric(loss, x), atol=1e-6, rtol=1e-5)
    assert not dq[3:].any() and np.isfinite(dq).all()   # the sequence without keys: zero gradient, never NaN


def test_fully_masked_rows_give_zero_gradients_not_nan():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 4, 4)) for _ in range(3))
    # top-left causal with a window of 0 columns to the left and right of a diagonal shifted past the keys
    kw = {"window": (0, 0), "causal": "top_left"}
    out, lse = attention_fwd(q, k[:, :, :2], v[:, :, :2], **kw)
    assert np.isinf(lse[0, 0, 2:]).all()
    dq, dk, dv, _ = attention_bwd(q, k[:, :, :2], v[:, :, :2], out, lse, np.ones_like(out), **kw)
    assert np.isfinite(dq).all() and not dq[0, 0, 2:].any()


def test_backward_reference_rejects_a_wrong_lse_shape_with_a_hint():
    q = np.zeros((1, 2, 3, 4), np.float32)
    out, lse = attention_fwd(q, q, q)
    with pytest.raises(UsageError, match="lse.*shape") as e:
        attention_bwd(q, q, q, out, lse[:, :1], out)
    assert "return_lse" in str(e.value.hint)
