"""[kernels] One block's steps of the Triton backward (:mod:`.triton_bwd`): the forward's dropout keep-mask recomputed
(:func:`_keep`), the probabilities ``P = exp(S - lse)`` under the masks, bias, ALiBi and soft-cap (:func:`_probs`), and
the two inner loops' bodies -- a query block's contribution to a key block's dK/dV (:func:`_query_block`) and a key
block's to a query block's dQ (:func:`_key_block`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_steps import _dot, _load

__all__ = ["_keep", "_probs", "_query_block", "_key_block"]


@triton.jit
def _keep(seed, rng_base, rows, cols, sk_max, dropout_p):
    """The forward's dropout keep-mask at (rows, cols) (broadcastable index tiles): Philox on the int64 counter
    ``rng_base + row * sk_max + col`` split into its 32-bit words -- the same bits as the forward's ``_uniform``."""
    ctr = rng_base + rows.to(tl.int64) * sk_max + cols
    lo = ctr.to(tl.uint32)
    hi = (ctr >> 32).to(tl.uint32)
    zero = lo * 0
    r0, _r1, _r2, _r3 = tl.philox(seed, lo, hi, zero, zero)
    x = r0.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, ~x, x)
    return x.to(tl.float32) * 4.6566127342e-10 >= dropout_p


@triton.jit
def _probs(qk, rows, cols, m_ok, n_ok, lse, b_ptr, stride_bm, stride_bn, seqlen_q, seqlen_k, lo_off, hi_off,
           sink, qk_scale, cap_scale, softcap, slope,
           MASK: tl.constexpr, SINK: tl.constexpr, CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
           BIAS_TYPE: tl.constexpr, SOFTCAP: tl.constexpr):
    """``P = exp(S - lse)`` of raw scores ``qk`` in either orientation: ``rows``/``cols`` (and ``m_ok``/``n_ok``,
    ``lse``: in log2 units, ``+inf`` for a row that saw no key) are index tiles broadcastable to ``qk``'s shape.  Also returns ``tanh(s / softcap)`` (for the soft-cap's
    derivative; unused without SOFTCAP)."""
    t = qk
    if SOFTCAP:
        x = qk * cap_scale                               # s / softcap
        e = tl.exp2(tl.abs(x) * (-2.0 * 1.4426950408889634))
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(x < 0, -t, t)                       # tanh(x)
        s = t * (softcap * 1.4426950408889634)
    else:
        s = qk * qk_scale                                # log2 units
    if BIAS_TYPE == 1:
        bias = _load(b_ptr + rows.to(tl.int64) * stride_bm + cols * stride_bn, m_ok, n_ok, CHECK_M, CHECK_N)
        s += bias.to(tl.float32) * 1.4426950408889634
    if BIAS_TYPE == 2:
        rel = rows + (seqlen_k - seqlen_q) - cols
        s -= (slope * 1.4426950408889634) * tl.abs(rel).to(tl.float32)
    if MASK:
        diag = cols - rows
        ok = (diag >= lo_off) & (diag <= hi_off)
        if SINK:
            ok = ok | (cols < sink)
        if CHECK_N:
            ok = ok & n_ok
        s = tl.where(ok, s, float("-inf"))
    elif CHECK_N:
        s = tl.where(n_ok, s, float("-inf"))
    return tl.exp2(s - lse), t


@triton.jit
def _query_block(dk, dv, k, v, dBias, b_ptr, q_base, do_base, l_base, d_base, acc_base,
                 g_base, q_src, do_src, acc_src, start_m, start_n, offs_m0, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k, lo_off,
                 hi_off, sink, stride_qm, stride_dom, stride_am, stride_bm, stride_bn,
                 stride_gm, stride_gn, qk_scale, cap_scale, softcap, slope, dropout_p, seed, rng_base,
                 sk_max, dq_lim, dv_lim,
                 MASK: tl.constexpr, SINK: tl.constexpr, CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
                 CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr, BIAS_TYPE: tl.constexpr, DBIAS: tl.constexpr,
                 SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, WITH_DQ: tl.constexpr, IEEE: tl.constexpr,
                 UPCAST: tl.constexpr, TMA: tl.constexpr, MASK_LOOP: tl.constexpr):
    """One query block against this program's key block, with keys along the rows (``S^T = K Q^T``): ``dk``/``dv``
    accumulated (raw: dK is scaled at the end) and, ``WITH_DQ``, this block's dQ contribution added to ``dq_acc``
    (raw too: the convert stage scales it).
    TMA: Q and dO come through tensor descriptors (zero-filled past the sequence); TMA == 2: dQ is added by the copy
    engine's bulk reduction (clipped to the sequence)."""
    offs_m = start_m + offs_m0
    m_ok = offs_m < seqlen_q
    n_ok = (start_n + offs_n) < seqlen_k
    d_ok = offs_d < dq_lim
    dv_ok = offs_dv < dv_lim
    if TMA:
        q = q_src.load([start_m, 0])
        do = do_src.load([start_m, 0])
    elif MASK_LOOP:  # the block's first row advances the base pointers (measured faster in the masked kernels)
        q = _load(q_base + start_m.to(tl.int64) * stride_qm + offs_m0[:, None] * stride_qm + offs_d[None, :],
                  m_ok[:, None], d_ok[None, :], CHECK_M, CHECK_D)
        do = _load(do_base + start_m.to(tl.int64) * stride_dom + offs_m0[:, None] * stride_dom + offs_dv[None, :],
                   m_ok[:, None], dv_ok[None, :], CHECK_M, CHECK_DV)
    else:  # 64-bit row offsets per element (measured faster without a mask)
        q = _load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :], m_ok[:, None],
                  d_ok[None, :], CHECK_M, CHECK_D)
        do = _load(do_base + offs_m[:, None].to(tl.int64) * stride_dom + offs_dv[None, :], m_ok[:, None],
                   dv_ok[None, :], CHECK_M, CHECK_DV)
    if CHECK_M:  # (LSE and D through the block's first row: no 64-bit address arithmetic per element in the loop)
        lse = tl.load(l_base + start_m + offs_m0, mask=m_ok, other=float("inf"))  # log2 units, +inf: no key seen
        delta = tl.load(d_base + start_m + offs_m0, mask=m_ok, other=0.0)
    else:
        lse = tl.load(l_base + start_m + offs_m0)
        delta = tl.load(d_base + start_m + offs_m0)
    cols = start_n + offs_n
    qk = _dot(k, tl.trans(q), None, IEEE, UPCAST)              # S^T [BLOCK_N, BLOCK_M]
    pt, t = _probs(qk, offs_m[None, :], cols[:, None], m_ok[None, :], n_ok[:, None], lse[None, :], b_ptr,
                   stride_bm, stride_bn, seqlen_q, seqlen_k, lo_off, hi_off, sink, qk_scale,
                   cap_scale, softcap, slope, MASK, SINK, CHECK_M, CHECK_N, BIAS_TYPE, SOFTCAP)
    dpt = _dot(v, tl.trans(do), None, IEEE, UPCAST)             # (dO V^T)^T [BLOCK_N, BLOCK_M]
    if DROPOUT:
        keep = _keep(seed, rng_base, offs_m[None, :], cols[:, None], sk_max, dropout_p)
        scale_keep = 1.0 / (1.0 - dropout_p)
        dv = _dot(tl.where(keep, pt * scale_keep, 0.0).to(do.dtype), do, dv, IEEE, UPCAST)
        dpt = tl.where(keep, dpt * scale_keep, 0.0)
    else:
        dv = _dot(pt.to(do.dtype), do, dv, IEEE, UPCAST)
    dst = pt * (dpt - delta[None, :])
    if DBIAS:
        g_ptrs = g_base + offs_m[None, :].to(tl.int64) * stride_gm + cols[:, None] * stride_gn
        if CHECK_M or CHECK_N:
            tl.store(g_ptrs, dst.to(dBias.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])
        else:
            tl.store(g_ptrs, dst.to(dBias.dtype.element_ty))
    if SOFTCAP:
        dst = dst * (1.0 - t * t)
    dst_in = dst.to(q.dtype)
    dk = _dot(dst_in, q, dk, IEEE, UPCAST)
    if WITH_DQ:
        dq = _dot(tl.trans(dst_in), k, None, IEEE, UPCAST)  # [BLOCK_M, BLOCK_DMODEL] (unscaled: scaled when converted)
        a_ptrs = acc_base + offs_m[:, None].to(tl.int64) * stride_am + offs_d[None, :]
        if TMA == 2:
            acc_src.atomic_add([start_m, 0], dq)
        elif CHECK_M or CHECK_D:
            tl.atomic_add(a_ptrs, dq, mask=m_ok[:, None] & d_ok[None, :], sem="relaxed")
        else:
            tl.atomic_add(a_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def _key_block(dq, q, do, lse, delta, k_src, v_src, k_base, v_base, b_ptr, start_m, start_n, offs_m, offs_n0,
               offs_d, offs_dv, m_ok, seqlen_q, seqlen_k, lo_off, hi_off, sink, stride_kn, stride_vn,
               stride_bm, stride_bn, qk_scale, cap_scale, softcap, slope, dropout_p, seed, rng_base, sk_max, dq_lim,
               dv_lim, MASK: tl.constexpr, SINK: tl.constexpr, CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
               CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr, BIAS_TYPE: tl.constexpr, SOFTCAP: tl.constexpr,
               DROPOUT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """The deterministic dQ pass: one key block against this program's query rows, ``dq += dS K`` (queries along the
    rows, its key blocks in a fixed order: the unmasked ones, then the masked ones).  TMA: K and V come through the
    descriptors ``k_src``/``v_src`` (zero-filled past the sequence), else by pointers from ``k_base``/``v_base``."""
    cols = start_n + offs_n0
    n_ok = cols < seqlen_k
    if TMA:
        k = k_src.load([start_n, 0])
        v = v_src.load([start_n, 0])
    else:
        k = _load(k_base + start_n.to(tl.int64) * stride_kn + offs_n0[:, None] * stride_kn + offs_d[None, :],
                  n_ok[:, None], offs_d[None, :] < dq_lim, CHECK_N, CHECK_D)
        v = _load(v_base + start_n.to(tl.int64) * stride_vn + offs_n0[:, None] * stride_vn + offs_dv[None, :],
                  n_ok[:, None], offs_dv[None, :] < dv_lim, CHECK_N, CHECK_DV)
    qk = _dot(q, tl.trans(k), None, IEEE, UPCAST)              # S [rows, keys]
    p, t = _probs(qk, offs_m[:, None], cols[None, :], m_ok[:, None], n_ok[None, :], lse[:, None], b_ptr,
                  stride_bm, stride_bn, seqlen_q, seqlen_k, lo_off, hi_off, sink, qk_scale,
                  cap_scale, softcap, slope, MASK, SINK, CHECK_M, CHECK_N, BIAS_TYPE, SOFTCAP)
    dp = _dot(do, tl.trans(v), None, IEEE, UPCAST)
    if DROPOUT:
        keep = _keep(seed, rng_base, offs_m[:, None], cols[None, :], sk_max, dropout_p)
        dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return _dot(ds.to(k.dtype), k, dq, IEEE, UPCAST)
