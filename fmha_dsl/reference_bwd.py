"""NumPy reference of the attention backward pass (CPU; the truth every backward test compares against).

    dq, dk, dv, dbias = attention_bwd(q, k, v, out, lse, dout, causal=True, dropout_p=0.1, seed=7)

It takes the forward's arguments (see :mod:`fmha_dsl.reference`) plus the forward's ``out`` and ``lse`` and the
output gradient ``dout``, and returns the gradients of ``sum(out * dout)``.  With ``P = exp(S - lse)`` the
probabilities the forward normalised (``S`` the scores after soft-cap, bias, ALiBi and mask), ``K`` the dropout
keep-mask recomputed from ``(seed, offset)`` exactly as the forward drew it, and ``Z = P * K / (1 - p)``::

    dV = Z^T dO              dP = (dO V^T) * K / (1 - p)          D = rowsum(dO * O)
    dS = P * (dP - D)        dX = dS * (1 - tanh^2(X / c))  (soft-cap c; else dX = dS)
    dQ = scale * dX K        dK = scale * dX^T Q                 dbias = dS (summed over broadcast dims)

``D = rowsum(dO * O)`` equals ``rowsum(P * dP)`` (with dropout too), which is why the kernels' first stage computes
it from ``out``.  GQA/MQA: dK and dV sum over the query heads of a group.  A row with ``lse = -inf`` (no allowed
column) gives zero gradients.  ALiBi slopes get no gradient.  Returns ``(dq, dk, dv, dbias)`` in the inputs' dtype
(``dbias`` None without a bias).
"""

from __future__ import annotations

import numpy as np

from .reference import _ROW_BLOCK_ELEMS, _as_float_array, _keep, _logits, _usage, as_array, check_finite, setup

__all__ = ["attention_bwd"]


def attention_bwd(q, k, v, out, lse, dout, *, causal=None, window=None, bias=None, alibi_slopes=None, dropout_p=0.0,
                  seed=0, offset=0, softcap=None, sink=0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, accum=np.float32):
    """Gradients ``(dq, dk, dv, dbias)`` of ``sum(out * dout)``; see the module docstring."""
    c = setup(q, k, v, causal=causal, window=window, bias=bias, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
              seed=seed, offset=offset, softcap=softcap, sink=sink, scale=scale, cu_seqlens_q=cu_seqlens_q,
              cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, accum=accum)
    q, k, v, bias, cfg = c.q, c.k, c.v, c.bias, c.cfg
    out = _as_float_array("out", out)
    dout = _as_float_array("dout", dout)
    want_o = q.shape[:-1] + (c.Dv,)
    for name, a in (("out", out), ("dout", dout)):
        if a.shape != want_o:
            raise _usage("usage.shape", f"`{name}` must have the forward output's shape {want_o}, got {a.shape}",
                         "pass the forward's out and a dout of its shape")
        if a.dtype != q.dtype:
            raise _usage("usage.dtype", f"`{name}` must have q's dtype {q.dtype}, got {a.dtype}",
                         f"pass {name}.astype(q.dtype)")
    lse = as_array("lse", lse)
    if lse.dtype not in (np.float32, np.float64):   # (float64: a float64 run of the reference)
        raise _usage("usage.dtype", f"`lse` must be the forward's float32 LSE (or float64), got dtype {lse.dtype}",
                     "call the forward with return_lse=True and pass its second result")
    want_l = (c.Hq, q.shape[0]) if c.group else (c.B, c.Hq, c.Sq_max)
    if lse.shape != want_l:
        raise _usage("usage.shape", f"`lse` must be the forward's LSE of shape {want_l}, got {lse.shape}",
                     "call the forward with return_lse=True")
    for name, a in (("out", out), ("dout", dout)):
        check_finite(name, a)
    lse = lse.astype(np.float32)
    bad = np.isnan(lse) | (lse == np.inf)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise _usage("usage.value", f"`lse{list(at)}` is {float(lse[at])}: the forward's LSE is finite, or -inf for a "
                     "row that saw no key", "pass the forward's own LSE (return_lse=True), unchanged")
    G = c.Hq // c.Hk
    dq = np.zeros(q.shape, dtype=cfg["accum"])
    dk = np.zeros(k.shape, dtype=cfg["accum"])
    dv = np.zeros(v.shape, dtype=cfg["accum"])
    dbias = None if bias is None else np.zeros(bias.shape, dtype=cfg["accum"])
    for b in range(c.B):
        for h in range(c.Hq):
            hk = h // G
            if c.group:
                qs = slice(int(c.cq[b]), int(c.cq[b + 1]))
                ks = slice(int(c.ck[b]), int(c.ck[b + 1]))
                ix_q, ix_k = (qs, h), (ks, hk)
                lh = lse[h, qs]
                bsl = (slice(0, qs.stop - qs.start), slice(0, ks.stop - ks.start))
            else:
                ix_q, ix_k = (b, h), (b, hk)
                lh = lse[b, h]
                bsl = (slice(None), slice(None))
            bidx = None if bias is None else (min(b, bias.shape[0] - 1), min(h, bias.shape[1] - 1)) + bsl
            slope = None if c.alibi_slopes is None else float(c.alibi_slopes[b, h])
            try:
                g = _head(q[ix_q], k[ix_k], v[ix_k], out[ix_q], lh, dout[ix_q], b, h,
                          None if bias is None else bias[bidx], slope, cfg)
            except _NotThisLse as exc:
                row = (int(c.cq[b]) + exc.row,) if c.group else (b, exc.row)
                at = [h, *row] if c.group else [row[0], h, row[1]]
                raise _usage("usage.value", f"`lse{at}` is not the forward's LSE for these arguments: {exc.what}",
                             "pass the forward's own out and lse, and the forward's keywords (causal, window, sink, "
                             "softcap, scale, bias, alibi_slopes, max_seqlen_q/k)") from None
            dq[ix_q] += g[0]
            dk[ix_k] += g[1]
            dv[ix_k] += g[2]
            if dbias is not None:
                dbias[bidx] += g[3]
    cast = q.dtype
    return (dq.astype(cast), dk.astype(cast), dv.astype(cast), None if dbias is None else dbias.astype(cast))


class _NotThisLse(Exception):
    """A row whose ``lse`` does not normalise its scores: ``row`` (of the sequence) and what is wrong."""

    def __init__(self, row: int, what: str):
        super().__init__(what)
        self.row, self.what = row, what


LSE_SUM_TOL = 1e-2   # |sum_j exp(s - lse) - 1| of a row: float32 rounding stays orders of magnitude below


def _check_rows(p, s, live, r0: int) -> None:
    """The forward's LSE normalises each row's scores ``s`` under the same arguments: a row with a finite ``lse``
    sums to 1, and a row with ``lse = -inf`` saw no key.  Else the backward was called with other keywords (causal
    forgotten, another soft-cap, scale or bias) or another call's ``lse``, and its gradients would be wrong.  A row
    whose largest score float32 holds only to more than 0.01 (past 131,072: a padding row masked by a bias of -1e9,
    say) has an LSE rounded as much, so its sum is ``exp`` of that rounding: it is not checked so."""
    sums = p.sum(axis=1)
    top = np.where(np.isfinite(s), s, -np.inf).max(axis=1, initial=-np.inf)
    exact = ~(np.spacing(np.abs(top.astype(np.float32))) > 1e-2)   # (a row with no finite score is checked)
    sees = np.isfinite(top)
    off = live & exact & ~(np.abs(sums - 1) <= LSE_SUM_TOL)
    if off.any():
        r = int(np.argmax(off))
        raise _NotThisLse(r0 + r, f"the row's probabilities exp(s - lse) sum to {float(sums[r]):.4g}, not 1")
    lost = ~live & sees
    if lost.any():
        raise _NotThisLse(r0 + int(np.argmax(lost)), "it is -inf (the row saw no key), but these arguments allow "
                          "keys in the row")


def _head(qh, kh, vh, oh, lh, doh, b, h, bias, slope, cfg):
    """One (sequence, query head): ``(dq [Sq, Dq], dk [Sk, Dq], dv [Sk, Dv], dbias [Sq, Sk] or None)``."""
    acc = cfg["accum"]
    Sq, Sk = qh.shape[0], kh.shape[0]
    dq = np.zeros(qh.shape, acc)
    dk = np.zeros(kh.shape, acc)
    dv = np.zeros(vh.shape, acc)
    db = None if bias is None else np.zeros((Sq, Sk), acc)
    if Sq == 0 or Sk == 0:
        return dq, dk, dv, db
    ka, va = kh.astype(acc), vh.astype(acc)
    scale = acc(cfg["scale"])
    j = np.arange(Sk)[None, :]
    step = max(1, _ROW_BLOCK_ELEMS // Sk)
    with np.errstate(all="ignore"):
        for r0 in range(0, Sq, step):
            r1 = min(Sq, r0 + step)
            i = np.arange(r0, r1)[:, None]
            qa, do = qh[r0:r1].astype(acc), doh[r0:r1].astype(acc)
            s, t = _logits(qa, ka, i, j, Sq, Sk, None if bias is None else bias[r0:r1], slope, cfg)
            lrow = lh[r0:r1].astype(acc)[:, None]
            live = np.isfinite(lrow)
            p = np.where(live, np.exp(s - np.where(live, lrow, acc(0))), acc(0))  # masked: exp(-inf) = 0
            _check_rows(p, s, live[:, 0], r0)
            if cfg["dropout_p"] > 0.0:
                kd = np.where(_keep(cfg, b, h, i, j), acc(1.0 / (1.0 - cfg["dropout_p"])), acc(0))
            else:
                kd = acc(1)
            dv += (p * kd).T @ do
            dp = (do @ va.T) * kd
            D = (do * oh[r0:r1].astype(acc)).sum(axis=1, keepdims=True)
            ds = p * (dp - D)
            if db is not None:
                db[r0:r1] = ds
            dx = ds if t is None else ds * (acc(1) - t * t)
            dq[r0:r1] = (dx @ ka) * scale
            dk += (dx.T @ qa) * scale
    return dq, dk, dv, db
