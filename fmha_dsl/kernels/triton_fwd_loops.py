"""[kernels] The forward template's key loops: one key block (:func:`_block`: scores, online softmax, ``acc += P V``),
a range of blocks at one mask step (:func:`_steps`), and the masked blocks of three ranges in one loop
(:func:`_masked`).  Each top-level loop is software-pipelined by Triton; with ``TMA`` the K/V sources are tensor
descriptors (:mod:`.triton_steps`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_steps import _pv, _scores, _softmax


@triton.jit
def _block(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
           start_n, offs_m, offs_n, offs_d, offs_dv, d_ok, dv_ok, m_ok, seqlen_q, seqlen_k,
           mask_off, window_left, window_right, sink,
           stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed,
           STEP: tl.constexpr, CHECK_M: tl.constexpr, CHECK_N: tl.constexpr, CHECK_D: tl.constexpr,
           CHECK_DV: tl.constexpr, BIAS_TYPE: tl.constexpr, SOFTCAP: tl.constexpr, SINK: tl.constexpr,
           DROPOUT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """One key block: scores, online softmax (the FMA form for STEP 0 without soft-cap or bias), ``acc += P V``."""
    qk = _scores(q, k_src, start_n, offs_n, offs_d, d_ok, seqlen_k, stride_kn, CHECK_D, CHECK_N, IEEE, UPCAST, TMA)
    p, alpha, l_i, m_i = _softmax(l_i, m_i, qk, start_n, b_base, b_rows, rng_lo, rng_hi, slope2, offs_m,
                                  offs_n, m_ok, seqlen_q, seqlen_k, mask_off, window_left, window_right,
                                  sink, qk_scale, cap_scale, cap_log2, dropout_p, seed,
                                  STEP, CHECK_M, CHECK_N, BIAS_TYPE, SOFTCAP, SINK, DROPOUT,
                                  STEP == 0 and not SOFTCAP and BIAS_TYPE == 0)
    acc = _pv(acc, alpha, p, start_n, v_src, offs_n, offs_dv, dv_ok, seqlen_k, svn, svd,
              CHECK_N, CHECK_DV, IEEE, UPCAST, TMA)
    return acc, l_i, m_i


@triton.jit
def _steps(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
           lo, hi, offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
           mask_off, window_left, window_right, sink,
           stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim, dv_lim,
           STEP: tl.constexpr, CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
           CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
           BIAS_TYPE: tl.constexpr, SOFTCAP: tl.constexpr, SINK: tl.constexpr, DROPOUT: tl.constexpr,
           IEEE: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """Key blocks ``[lo, hi)`` (multiples of BLOCK_N).  STEP 0: no mask at all (every column in range and
    allowed for every row); 1: key bounds only; 2: key bounds + window/corner + sink.  ``k_src``/``v_src``: the
    K/V base pointers, or with TMA their tensor descriptors (which zero-fill past seqlen_k and the head dims).
    STEP 0 without soft-cap or bias takes the row max of the raw scores and then one fused multiply-add per score
    (one multiply per score fewer): that needs ``qk_scale >= 0``, and the caller sends a negative scale's blocks
    to another loop."""
    d_ok = offs_d < dq_lim
    dv_ok = offs_dv < dv_lim
    m_ok = offs_m < seqlen_q
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        acc, l_i, m_i = _block(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                               start_n, offs_m, offs_n, offs_d, offs_dv, d_ok, dv_ok, m_ok,
                               seqlen_q, seqlen_k, mask_off, window_left, window_right, sink,
                               stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed,
                               STEP, CHECK_M, CHECK_N, CHECK_D, CHECK_DV, BIAS_TYPE, SOFTCAP, SINK, DROPOUT, IEEE,
                               UPCAST, TMA)
    return acc, l_i, m_i


@triton.jit
def _masked(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
            lo1, n1, lo2, n2, lo3, n3, offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
            mask_off, window_left, window_right, sink,
            stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim, dv_lim,
            CHECK_M: tl.constexpr, CHECK_N: tl.constexpr, CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr,
            BLOCK_N: tl.constexpr, BIAS_TYPE: tl.constexpr, SOFTCAP: tl.constexpr, SINK: tl.constexpr,
            DROPOUT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr):
    """The masked key blocks (STEP 2) of three ranges in one loop: ``n1`` blocks from ``lo1``, ``n2`` from ``lo2``,
    ``n3`` from ``lo3`` (a negative count is none)."""
    d_ok = offs_d < dq_lim
    dv_ok = offs_dv < dv_lim
    m_ok = offs_m < seqlen_q
    n1 = tl.maximum(n1, 0)
    n2 = tl.maximum(n2, 0)
    n12 = n1 + n2
    for i in range(0, n12 + tl.maximum(n3, 0)):
        start_n = tl.where(i < n1, lo1 + i * BLOCK_N, tl.where(i < n12, lo2 + (i - n1) * BLOCK_N,
                                                               lo3 + (i - n12) * BLOCK_N))
        start_n = tl.multiple_of(start_n, BLOCK_N)
        acc, l_i, m_i = _block(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                               start_n, offs_m, offs_n, offs_d, offs_dv, d_ok, dv_ok, m_ok,
                               seqlen_q, seqlen_k, mask_off, window_left, window_right, sink,
                               stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed,
                               2, CHECK_M, CHECK_N, CHECK_D, CHECK_DV, BIAS_TYPE, SOFTCAP, SINK, DROPOUT, IEEE,
                               UPCAST, TMA)
    return acc, l_i, m_i
