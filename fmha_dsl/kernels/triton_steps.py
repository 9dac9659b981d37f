"""[kernels] One key block's device steps, shared by the Triton templates: a tile load under optional masks
(:func:`_load`), the fp32 dot (:func:`_dot`), dropout's uniform numbers (:func:`_uniform`, Philox as ``tl.rand``),
the raw scores ``q K^T`` (:func:`_scores`), the online-softmax update (:func:`_softmax`) and ``acc * alpha + P V``
(:func:`_pv`).

The forward's key loops (:mod:`.triton_fwd_loops`) chain them per block; the paged template (:mod:`.triton_paged`)
uses the load, the dot and the softmax update, the backward (:mod:`.triton_bwd`) the load and the dot.  ``TMA``:
K/V come as tensor descriptors (read by ``.load`` through the copy engine) instead of base pointers.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _sequence(cu_seqlens, off_b, seqlen, IS_GROUP: tl.constexpr):
    """``(first row, rows, batch index)`` of sequence ``off_b``: group mode reads ``cu_seqlens [B + 1]`` and its rows
    share one tensor (the batch index multiplies no stride: 0); batch mode has row 0, ``seqlen`` rows and ``off_b``
    (int64, for the batch strides)."""
    if IS_GROUP:
        start = tl.load(cu_seqlens + off_b)
        seqlen = tl.load(cu_seqlens + off_b + 1) - start
        b = off_b.to(tl.int64) * 0
    else:
        start = off_b * 0
        b = off_b.to(tl.int64)
    return start, seqlen, b


@triton.jit
def _load(ptrs, a_ok, b_ok, CHECK_A: tl.constexpr, CHECK_B: tl.constexpr):
    """Load a tile; ``a_ok``/``b_ok`` are the masks along the two axes, applied only where asked."""
    if CHECK_A:
        if CHECK_B:
            x = tl.load(ptrs, mask=a_ok & b_ok, other=0.0)
        else:
            x = tl.load(ptrs, mask=a_ok, other=0.0)
    else:
        if CHECK_B:
            x = tl.load(ptrs, mask=b_ok, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b`` in fp32: exact fp32 products for fp32 inputs; fp32 operands under the interpreter
    (its bf16 dot is broken)."""
    if UPCAST:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    elif IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _uniform(seed, row_lo, row_hi, cols):
    """``tl.rand(seed, row + cols)`` for the int64 counters ``row + col`` given as the row's two 32-bit words:
    Philox4x32-10 on ``(lo32, hi32, 0, 0)``, key = the seed's two words, then Triton's int32 -> [0, 1)
    conversion.  Spelled out (32-bit adds with carry instead of int64 tiles) so that it costs fewer
    registers and does not depend on how a Triton version widens 64-bit offsets."""
    lo = row_lo[:, None] + cols[None, :].to(tl.uint32)
    hi = row_hi[:, None] + (lo < row_lo[:, None]).to(tl.uint32)
    zero = lo * 0
    r0, _r1, _r2, _r3 = tl.philox(seed, lo, hi, zero, zero)
    x = r0.to(tl.int32, bitcast=True)
    x = tl.where(x < 0, ~x, x)
    return x.to(tl.float32) * 4.6566127342e-10


@triton.jit
def _scores(q, k_src, start_n, offs_n, offs_d, d_ok, seqlen_k, stride_kn,
            CHECK_D: tl.constexpr, CHECK_N: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
            TMA: tl.constexpr):
    """``q @ K[start_n : start_n + BLOCK_N]^T`` in fp32 (raw scores, not yet scaled)."""
    if TMA:  # K tile [BLOCK_N, BLOCK_DMODEL] through the tensor-copy engine (zero fill past the bounds)
        qk = _dot(q, tl.trans(k_src.load([start_n, 0])), None, IEEE, UPCAST)
    else:  # K^T tile [BLOCK_DMODEL, BLOCK_N]
        n_ok = (start_n + offs_n) < seqlen_k
        kb = k_src + start_n.to(tl.int64) * stride_kn
        k = _load(kb + offs_d[:, None] + offs_n[None, :] * stride_kn, d_ok[:, None], n_ok[None, :],
                  CHECK_D, CHECK_N)
        qk = _dot(q, k, None, IEEE, UPCAST)
    return qk


@triton.jit
def _softmax(l_i, m_i, qk, start_n, b_base, b_rows, rng_lo, rng_hi, slope2,
             offs_m, offs_n, m_ok, seqlen_q, seqlen_k, mask_off, window_left, window_right, sink,
             qk_scale, cap_scale, cap_log2, dropout_p, seed,
             STEP: tl.constexpr, CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
             BIAS_TYPE: tl.constexpr, SOFTCAP: tl.constexpr, SINK: tl.constexpr, DROPOUT: tl.constexpr,
             FMA: tl.constexpr):
    """One key block's online-softmax step from its raw scores ``qk``: the unnormalised probabilities ``p``
    (dropout applied), the factor ``alpha`` that rescales what was accumulated before, and the new row
    statistics.  FMA (no soft-cap, no bias; ``qk_scale >= 0``): the row max of the raw scores, then one fused
    multiply-add per score."""
    cols = start_n + offs_n
    n_ok = cols < seqlen_k
    if FMA:  # unmasked blocks, no soft-cap or bias, qk_scale >= 0: the row max of the raw scores, then one FMA
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(qk * qk_scale - m_use[:, None])
    else:
        # scores in log2 units
        if SOFTCAP:
            x = qk * cap_scale  # s / softcap
            e = tl.exp2(tl.abs(x) * (-2.0 * 1.4426950408889634))
            t = (1.0 - e) / (1.0 + e)
            t = tl.where(x < 0, -t, t)
            s = t * cap_log2  # softcap * tanh(s / softcap) * log2(e)
        else:
            s = qk * qk_scale
        if BIAS_TYPE == 1:
            bias = _load(b_base + start_n + b_rows[:, None] + offs_n[None, :], m_ok[:, None], n_ok[None, :],
                         CHECK_M, CHECK_N)
            s += bias.to(tl.float32) * 1.4426950408889634
        if BIAS_TYPE == 2:
            rel = offs_m[:, None] + (seqlen_k - seqlen_q) - cols[None, :]
            s -= slope2 * tl.abs(rel).to(tl.float32)
        if STEP == 2:
            diag = offs_m[:, None] + mask_off
            ok = ((window_left < 0) | (cols[None, :] >= diag - window_left)) & \
                 ((window_right < 0) | (cols[None, :] <= diag + window_right))
            if SINK:
                ok = ok | (cols[None, :] < sink)
            if CHECK_N:
                ok = ok & n_ok[None, :]
            s = tl.where(ok, s, float("-inf"))
        elif STEP == 1:
            if CHECK_N:
                s = tl.where(n_ok[None, :], s, float("-inf"))
        # online softmax (a row that has seen only -inf keeps m = -inf and l = 0, without NaN)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        keep = _uniform(seed, rng_lo, rng_hi, cols) >= dropout_p
        p = tl.where(keep, p, 0.0)
    return p, alpha, l_i, m_new


@triton.jit
def _pv(acc, alpha, p, start_n, v_src, offs_n, offs_dv, dv_ok, seqlen_k, svn, svd,
        CHECK_N: tl.constexpr, CHECK_DV: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
        TMA: tl.constexpr):
    """``acc * alpha + p @ V[start_n : start_n + BLOCK_N]``."""
    acc = acc * alpha[:, None]
    # V tile [BLOCK_N, BLOCK_DV]; svn or svd is the constant 1 (VLAYOUT)
    if TMA:
        v = v_src.load([start_n, 0])
    else:
        n_ok = (start_n + offs_n) < seqlen_k
        vb = v_src + start_n.to(tl.int64) * svn
        v = _load(vb + offs_n[:, None] * svn + offs_dv[None, :] * svd, n_ok[:, None], dv_ok[None, :],
                  CHECK_N, CHECK_DV)
    return _dot(p.to(v.dtype), v, acc, IEEE, UPCAST)
