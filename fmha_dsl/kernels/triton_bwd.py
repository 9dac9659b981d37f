"""[kernels] The Triton backward template: CK's three stages (``bwd_dot_do_o``, ``bwd_dq_dk_dv``, ``bwd_convert_dq``).

The math and the stages' contract: :mod:`fmha_dsl.kernels.bwd_abi` (run-time arguments, grids, workspace) and
:mod:`fmha_dsl.reference_bwd` (the truth).  The main kernel runs one program per (key block, K/V head, batch): it
keeps its K/V tile and the dK/dV accumulators in registers and walks, for each query head of its GQA group, the
query blocks that can see its keys (the mask decides the range), recomputing ``P = exp(S - lse)`` from the forward's
LSE (in log2 units, from the first stage).  Scores are kept transposed (``S^T = K Q^T``: keys along the rows) so that dV and dK accumulate without
transposes.  Masks, windows, sink tokens, bias (with ``dbias``), ALiBi, soft-cap and dropout (the forward's Philox
keep-mask, recomputed from (seed, offset)) are constexpr branches, as in the forward template.  The inner loops'
block steps are :mod:`.triton_bwd_steps`; the stages before and after the main kernel :mod:`.triton_bwd_stages`; this
module holds the main kernel and the host glue (signatures, constexprs) of all three.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .bwd_abi import ARGS, CONVERT_ARGS, DOT_ARGS, block_d
from .triton_bwd_stages import fmha_bwd_convert_dq, fmha_bwd_dot_do_o
from .triton_bwd_steps import _key_block, _query_block
from .triton_steps import _load

__all__ = ["fmha_bwd_dot_do_o", "fmha_bwd_dq_dk_dv", "fmha_bwd_convert_dq", "signature", "constexprs",
           "CONSTEXPRS", "DOT_CONSTEXPRS", "CONVERT_CONSTEXPRS", "DTYPES"]


@triton.jit
def fmha_bwd_dq_dk_dv(Q, K, V, dO, L2, D, DQacc, dQ, dK, dV, dBias, Bias, Alibi, cu_seqlens_q, cu_seqlens_k,
                      sm_scale, softcap, dropout_p, seed, philox_offset,
                      seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k, nhead_q, nhead_k, head_dim_q, head_dim_v,
                      window_left, window_right, mask_bottom_right, sink,
                      stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                      stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom, stride_db, stride_dh,
                      stride_as, stride_ab, stride_ah, stride_am, stride_dqb, stride_dqh, stride_dqm,
                      stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                      stride_bb, stride_bh, stride_bm, stride_bn, stride_gb, stride_gh, stride_gm, stride_gn,
                      stride_alb, stride_alh,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DMODEL: tl.constexpr,
                      BLOCK_DV: tl.constexpr, HEAD_DIM_Q: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                      PAD_M: tl.constexpr, PAD_N: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
                      CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr, IS_GROUP: tl.constexpr, MASK: tl.constexpr,
                      SINK: tl.constexpr, BIAS_TYPE: tl.constexpr, DBIAS: tl.constexpr, DROPOUT: tl.constexpr,
                      SOFTCAP: tl.constexpr, DETERMINISTIC: tl.constexpr, IEEE: tl.constexpr,
                      UPCAST_DOT: tl.constexpr, TMA: tl.constexpr):
    pid_n = tl.program_id(0)
    off_hk = tl.program_id(1)
    off_b = tl.program_id(2)
    group_r = nhead_q // nhead_k
    if IS_GROUP:
        q_start = tl.load(cu_seqlens_q + off_b)
        seqlen_q = tl.load(cu_seqlens_q + off_b + 1) - q_start
        k_start = tl.load(cu_seqlens_k + off_b)
        seqlen_k = tl.load(cu_seqlens_k + off_b + 1) - k_start
        sq_max = max_seqlen_q
        sk_max = max_seqlen_k
        zero = off_b.to(tl.int64) * 0
        bq = zero
        bk = zero
        bv = zero
        bdo = zero
        bdq = zero
        bdk = zero
        bdv = zero
    else:
        q_start = off_b * 0
        k_start = q_start
        sq_max = seqlen_q
        sk_max = seqlen_k
        bq = off_b.to(tl.int64) * stride_qb
        bk = off_b.to(tl.int64) * stride_kb
        bv = off_b.to(tl.int64) * stride_vb
        bdo = off_b.to(tl.int64) * stride_dob
        bdq = off_b.to(tl.int64) * stride_dqb
        bdk = off_b.to(tl.int64) * stride_dkb
        bdv = off_b.to(tl.int64) * stride_dvb
    if PAD_D:
        dq_lim = head_dim_q
    else:
        dq_lim = HEAD_DIM_Q
    if PAD_DV:
        dv_lim = head_dim_v
    else:
        dv_lim = HEAD_DIM_V
    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    qk_scale = sm_scale * 1.4426950408889634
    cap_scale = sm_scale
    if SOFTCAP:
        cap_scale = sm_scale / softcap
    # row i sees column j when lo_off <= j - i <= hi_off (or j < sink): two offsets from the diagonal hold the
    # whole mask; a window side as wide as both sequences is unbounded (an offset no row and column reach)
    lo_off = seqlen_q * 0
    hi_off = lo_off
    if MASK:
        mask_off = (seqlen_k - seqlen_q) * mask_bottom_right
        unbounded = seqlen_q + seqlen_k
        lo_off = tl.where((window_left >= 0) & (window_left < unbounded), mask_off - window_left, -unbounded)
        hi_off = tl.where((window_right >= 0) & (window_right < unbounded), mask_off + window_right, unbounded)
        sink = tl.maximum(tl.minimum(sink, seqlen_k), 0)
    n_kb = tl.cdiv(max_seqlen_k, BLOCK_N)
    if DETERMINISTIC:
        if pid_n >= n_kb:  # the dQ programs (after the dK/dV ones): BLOCK_N query rows each, every key in order
            m_blk = pid_n - n_kb
            if MASK:  # the longest rows (the last query blocks under a causal mask) start first
                m_blk = tl.num_programs(0) - 1 - pid_n
            start_m = m_blk * BLOCK_N
            if start_m >= seqlen_q:
                return
            offs_m = start_m + tl.arange(0, BLOCK_N)
            offs_n0 = tl.arange(0, BLOCK_M)
            m_ok = offs_m < seqlen_q
            # the key columns these rows may see, [k_lo, k_hi) (from 0 when there are sink columns), and those every
            # row sees with no mask to apply, [g_lo, g_hi) (whole key blocks inside the sequence)
            k_lo = start_m * 0
            k_hi = seqlen_k
            g_lo = k_lo
            g_hi = (seqlen_k // BLOCK_M) * BLOCK_M
            if MASK:
                k_lo = tl.maximum(start_m + lo_off, 0)
                k_hi = tl.minimum(start_m + BLOCK_N + hi_off, seqlen_k)
                g_lo = tl.maximum(start_m + BLOCK_N - 1 + lo_off, 0)
                g_hi = tl.minimum(start_m + hi_off + 1, seqlen_k)
                if SINK:
                    k_lo = tl.where(sink > 0, 0, k_lo)
                k_lo = (k_lo // BLOCK_M) * BLOCK_M
                g_lo = tl.maximum(tl.cdiv(g_lo, BLOCK_M) * BLOCK_M, k_lo)
                g_hi = tl.maximum(tl.minimum((g_hi // BLOCK_M) * BLOCK_M, k_hi), g_lo)
            n_a = (g_lo - k_lo) // BLOCK_M
            n_ab = n_a + tl.cdiv(k_hi - g_hi, BLOCK_M)
            k_base = K + bk + off_hk.to(tl.int64) * stride_kh + k_start.to(tl.int64) * stride_kn
            v_base = V + bv + off_hk.to(tl.int64) * stride_vh + k_start.to(tl.int64) * stride_vn
            k_src = k_base
            v_src = v_base
            if TMA:  # K and V through descriptors over this (sequence, K/V head)'s rows, as Q and dO are below
                rows_k = tl.maximum(seqlen_k, 1)
                k_src = tl.make_tensor_descriptor(k_base, shape=[rows_k, dq_lim], strides=[stride_kn, 1],
                                                  block_shape=[BLOCK_M, BLOCK_DMODEL])
                v_src = tl.make_tensor_descriptor(v_base, shape=[rows_k, dv_lim], strides=[stride_vn, 1],
                                                  block_shape=[BLOCK_M, BLOCK_DV])
            for i in range(0, group_r):
                off_h = off_hk * group_r + i
                rows = (q_start + offs_m).to(tl.int64)
                q = _load(Q + bq + off_h.to(tl.int64) * stride_qh + rows[:, None] * stride_qm + offs_d[None, :],
                          m_ok[:, None], offs_d[None, :] < dq_lim, PAD_M, CHECK_D)
                do = _load(dO + bdo + off_h.to(tl.int64) * stride_doh + rows[:, None] * stride_dom + offs_dv[None, :],
                           m_ok[:, None], offs_dv[None, :] < dv_lim, PAD_M, CHECK_DV)
                w = off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh + offs_m
                lse = tl.load(L2 + w, mask=m_ok, other=float("inf"))  # (log2 units: the first stage's)
                delta = tl.load(D + w, mask=m_ok, other=0.0)
                b_ptr = Bias
                slope = sm_scale * 0.0
                if BIAS_TYPE == 1:
                    b_ptr = Bias + off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh
                if BIAS_TYPE == 2:
                    slope = tl.load(Alibi + off_b.to(tl.int64) * stride_alb + off_h * stride_alh).to(tl.float32)
                rng_base = ((off_b.to(tl.int64) * nhead_q + off_h) * sq_max) * sk_max + philox_offset
                dq = tl.zeros([BLOCK_N, BLOCK_DMODEL], dtype=tl.float32)
                for start_n in range(g_lo, g_hi, BLOCK_M):  # the key blocks every row sees in full
                    start_n = tl.multiple_of(start_n, BLOCK_M)
                    dq = _key_block(dq, q, do, lse, delta, k_src, v_src, k_base, v_base, b_ptr, start_m, start_n,
                                    offs_m, offs_n0, offs_d, offs_dv, m_ok, seqlen_q, seqlen_k, lo_off, hi_off, sink,
                                    stride_kn, stride_vn, stride_bm, stride_bn, qk_scale,
                                    cap_scale, softcap, slope, dropout_p, seed, rng_base, sk_max, dq_lim, dv_lim,
                                    False, SINK, PAD_M, False, CHECK_D, CHECK_DV, BIAS_TYPE, SOFTCAP, DROPOUT, IEEE,
                                    UPCAST_DOT, TMA)
                for j in range(0, n_ab):  # then the masked (or partial) ones on either side: a fixed order
                    start_n = tl.where(j < n_a, k_lo + j * BLOCK_M, g_hi + (j - n_a) * BLOCK_M)
                    start_n = tl.multiple_of(start_n, BLOCK_M)
                    dq = _key_block(dq, q, do, lse, delta, k_src, v_src, k_base, v_base, b_ptr, start_m, start_n,
                                    offs_m, offs_n0, offs_d, offs_dv, m_ok, seqlen_q, seqlen_k, lo_off, hi_off, sink,
                                    stride_kn, stride_vn, stride_bm, stride_bn, qk_scale,
                                    cap_scale, softcap, slope, dropout_p, seed, rng_base, sk_max, dq_lim, dv_lim,
                                    MASK, SINK, PAD_M, True, CHECK_D, CHECK_DV, BIAS_TYPE, SOFTCAP, DROPOUT, IEEE,
                                    UPCAST_DOT, TMA)
                # these rows' dQ is complete: stored as dQ itself (no accumulator, no convert stage)
                dq_ptrs = dQ + bdq + off_h.to(tl.int64) * stride_dqh + rows[:, None] * stride_dqm + offs_d[None, :]
                dq = (dq * sm_scale).to(dQ.dtype.element_ty)
                if PAD_M or CHECK_D:
                    tl.store(dq_ptrs, dq, mask=m_ok[:, None] & (offs_d[None, :] < dq_lim))
                else:
                    tl.store(dq_ptrs, dq)
            return
    start_n = pid_n * BLOCK_N
    if start_n >= seqlen_k:
        return
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    n_ok = (start_n + offs_n) < seqlen_k
    krow = (k_start + start_n + offs_n).to(tl.int64)
    k = _load(K + bk + off_hk.to(tl.int64) * stride_kh + krow[:, None] * stride_kn + offs_d[None, :],
              n_ok[:, None], offs_d[None, :] < dq_lim, PAD_N, CHECK_D)
    v = _load(V + bv + off_hk.to(tl.int64) * stride_vh + krow[:, None] * stride_vn + offs_dv[None, :],
              n_ok[:, None], offs_dv[None, :] < dv_lim, PAD_N, CHECK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_DMODEL], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    # the query rows that can see a column of this key block, [q_lo, q_hi), and those that see all of them with no
    # mask to apply, [f_lo, f_hi) (whole query blocks; none for a partial key block or one holding sink columns)
    q_lo = start_n * 0
    q_hi = seqlen_q
    f_lo = q_lo
    f_hi = q_lo
    if MASK:
        q_lo = tl.maximum(start_n - hi_off, 0)
        q_hi = tl.minimum(start_n + BLOCK_N - lo_off, seqlen_q)
        f_lo = tl.maximum(start_n + BLOCK_N - 1 - hi_off, 0)
        f_hi = tl.minimum(start_n - lo_off + 1, seqlen_q)
        if SINK:  # a key block holding sink columns is seen by every row
            q_lo = tl.where(start_n < sink, 0, q_lo)
            q_hi = tl.where(start_n < sink, seqlen_q, q_hi)
            f_hi = tl.where(start_n < sink, f_lo, f_hi)
        q_lo = (q_lo // BLOCK_M) * BLOCK_M
        f_lo = tl.maximum(tl.cdiv(f_lo, BLOCK_M) * BLOCK_M, q_lo)
        f_hi = tl.maximum(tl.minimum((f_hi // BLOCK_M) * BLOCK_M, q_hi), f_lo)
        if PAD_N:
            f_hi = tl.where(start_n + BLOCK_N > seqlen_k, f_lo, f_hi)
    for i in range(0, group_r):
        off_h = off_hk * group_r + i
        q_base = Q + bq + off_h.to(tl.int64) * stride_qh + q_start.to(tl.int64) * stride_qm
        do_base = dO + bdo + off_h.to(tl.int64) * stride_doh + q_start.to(tl.int64) * stride_dom
        d_base = D + off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh
        l_base = L2 + off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh
        acc_base = DQacc + off_b.to(tl.int64) * stride_ab + off_h.to(tl.int64) * stride_ah
        b_ptr = Bias
        g_base = dBias
        slope = sm_scale * 0.0
        if BIAS_TYPE == 1:
            b_ptr = Bias + off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh
        if DBIAS:
            g_base = dBias + off_b.to(tl.int64) * stride_gb + off_h.to(tl.int64) * stride_gh
        if BIAS_TYPE == 2:
            slope = tl.load(Alibi + off_b.to(tl.int64) * stride_alb + off_h * stride_alh).to(tl.float32)
        rng_base = ((off_b.to(tl.int64) * nhead_q + off_h) * sq_max) * sk_max + philox_offset
        q_src = q_base
        do_src = do_base
        acc_src = acc_base
        if TMA:  # on-device descriptors over this (sequence, head)'s rows (16-byte aligned: the build's promise); a
            # sequence without queries still gets a valid (one-row, never read) descriptor: a zero extent is illegal
            rows_d = tl.maximum(seqlen_q, 1)
            q_src = tl.make_tensor_descriptor(q_base, shape=[rows_d, dq_lim], strides=[stride_qm, 1],
                                              block_shape=[BLOCK_M, BLOCK_DMODEL])
            do_src = tl.make_tensor_descriptor(do_base, shape=[rows_d, dv_lim], strides=[stride_dom, 1],
                                               block_shape=[BLOCK_M, BLOCK_DV])
            if not DETERMINISTIC:  # (the deterministic dQ programs have no accumulator)
                acc_src = tl.make_tensor_descriptor(acc_base, shape=[rows_d, dq_lim], strides=[stride_am, 1],
                                                    block_shape=[BLOCK_M, BLOCK_DMODEL])
        if MASK:  # the unmasked blocks, then the masked ones on both sides of them in one loop
            for start_m in range(f_lo, f_hi, BLOCK_M):
                start_m = tl.multiple_of(start_m, BLOCK_M)
                dk, dv = _query_block(dk, dv, k, v, dBias, b_ptr, q_base, do_base, l_base, d_base, acc_base, g_base,
                                      q_src, do_src, acc_src, start_m, start_n, offs_m0, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                                      lo_off, hi_off, sink, stride_qm, stride_dom, stride_am,
                                      stride_bm, stride_bn, stride_gm, stride_gn, qk_scale, cap_scale,
                                      softcap, slope, dropout_p, seed, rng_base, sk_max, dq_lim, dv_lim, False,
                                      SINK, False, False, CHECK_D, CHECK_DV, BIAS_TYPE, DBIAS, SOFTCAP, DROPOUT,
                                      not DETERMINISTIC, IEEE, UPCAST_DOT, TMA, MASK)
            n_a = (f_lo - q_lo) // BLOCK_M
            for j in range(0, n_a + (q_hi - f_hi + BLOCK_M - 1) // BLOCK_M):
                start_m = tl.where(j < n_a, q_lo + j * BLOCK_M, f_hi + (j - n_a) * BLOCK_M)
                start_m = tl.multiple_of(start_m, BLOCK_M)
                dk, dv = _query_block(dk, dv, k, v, dBias, b_ptr, q_base, do_base, l_base, d_base, acc_base, g_base,
                                      q_src, do_src, acc_src, start_m, start_n, offs_m0, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                                      lo_off, hi_off, sink, stride_qm, stride_dom, stride_am,
                                      stride_bm, stride_bn, stride_gm, stride_gn, qk_scale, cap_scale,
                                      softcap, slope, dropout_p, seed, rng_base, sk_max, dq_lim, dv_lim, True,
                                      SINK, PAD_M, PAD_N, CHECK_D, CHECK_DV, BIAS_TYPE, DBIAS, SOFTCAP, DROPOUT,
                                      not DETERMINISTIC, IEEE, UPCAST_DOT, TMA, MASK)
        else:  # the whole query blocks with no bounds to check (none for a partial key block), then the rest
            f_hi = seqlen_q
            if PAD_M:
                f_hi = (seqlen_q // BLOCK_M) * BLOCK_M
            if PAD_N:
                f_hi = tl.where(start_n + BLOCK_N > seqlen_k, 0, f_hi)
            for start_m in range(0, f_hi, BLOCK_M):
                start_m = tl.multiple_of(start_m, BLOCK_M)
                dk, dv = _query_block(dk, dv, k, v, dBias, b_ptr, q_base, do_base, l_base, d_base, acc_base, g_base,
                                      q_src, do_src, acc_src, start_m, start_n, offs_m0, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                                      lo_off, hi_off, sink, stride_qm, stride_dom, stride_am,
                                      stride_bm, stride_bn, stride_gm, stride_gn, qk_scale, cap_scale,
                                      softcap, slope, dropout_p, seed, rng_base, sk_max, dq_lim, dv_lim, False,
                                      SINK, False, False, CHECK_D, CHECK_DV, BIAS_TYPE, DBIAS, SOFTCAP, DROPOUT,
                                      not DETERMINISTIC, IEEE, UPCAST_DOT, TMA, MASK)
            if PAD_M or PAD_N:
                for start_m in range(f_hi, seqlen_q, BLOCK_M):
                    start_m = tl.multiple_of(start_m, BLOCK_M)
                    dk, dv = _query_block(dk, dv, k, v, dBias, b_ptr, q_base, do_base, l_base, d_base, acc_base,
                                          g_base, q_src, do_src, acc_src, start_m, start_n, offs_m0, offs_n, offs_d,
                                          offs_dv, seqlen_q, seqlen_k, lo_off, hi_off, sink,
                                          stride_qm, stride_dom, stride_am, stride_bm, stride_bn, stride_gm,
                                          stride_gn, qk_scale, cap_scale, softcap, slope, dropout_p, seed,
                                          rng_base, sk_max, dq_lim, dv_lim, False, SINK, PAD_M, PAD_N, CHECK_D,
                                          CHECK_DV, BIAS_TYPE, DBIAS, SOFTCAP, DROPOUT, not DETERMINISTIC, IEEE,
                                          UPCAST_DOT, TMA, MASK)
    dk = dk * sm_scale
    dk_ptrs = dK + bdk + off_hk.to(tl.int64) * stride_dkh + krow[:, None] * stride_dkn + offs_d[None, :]
    dv_ptrs = dV + bdv + off_hk.to(tl.int64) * stride_dvh + krow[:, None] * stride_dvn + offs_dv[None, :]
    if PAD_N or CHECK_D:
        tl.store(dk_ptrs, dk.to(dK.dtype.element_ty), mask=n_ok[:, None] & (offs_d[None, :] < dq_lim))
    else:
        tl.store(dk_ptrs, dk.to(dK.dtype.element_ty))
    if PAD_N or CHECK_DV:
        tl.store(dv_ptrs, dv.to(dV.dtype.element_ty), mask=n_ok[:, None] & (offs_dv[None, :] < dv_lim))
    else:
        tl.store(dv_ptrs, dv.to(dV.dtype.element_ty))


# ------------------------------------------------------------------------------------------------------
# host glue for the build, the runtime and the interpreter harness
# ------------------------------------------------------------------------------------------------------

DTYPES = ("fp16", "bf16", "fp32")

DOT_CONSTEXPRS = ("BLOCK_M", "BLOCK_DV", "IS_GROUP", "CHECK_DV", "PAD_DV", "HEAD_DIM_V")
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_DMODEL", "BLOCK_DV", "HEAD_DIM_Q", "HEAD_DIM_V",
              "PAD_M", "PAD_N", "PAD_D", "PAD_DV", "CHECK_D", "CHECK_DV", "IS_GROUP", "MASK", "SINK", "BIAS_TYPE",
              "DBIAS", "DROPOUT", "SOFTCAP", "DETERMINISTIC", "IEEE", "UPCAST_DOT", "TMA")
CONVERT_CONSTEXPRS = ("BLOCK_M", "BLOCK_DMODEL", "IS_GROUP", "CHECK_D", "DETERMINISTIC", "PAD_D", "HEAD_DIM_Q")

KERNELS = {"bwd_dot_do_o": (fmha_bwd_dot_do_o, DOT_ARGS, DOT_CONSTEXPRS),
           "bwd_dq_dk_dv": (fmha_bwd_dq_dk_dv, ARGS, CONSTEXPRS),
           "bwd_convert_dq": (fmha_bwd_convert_dq, CONVERT_ARGS, CONVERT_CONSTEXPRS)}


def _check_names():
    import inspect

    for name, (fn, args, const) in KERNELS.items():
        params = list(inspect.signature(fn.fn).parameters)
        want = [n for n, _ in args] + list(const)
        assert params == want, f"{name} parameters drifted from its ABI:\n{params}\n{want}"


_check_names()

_BIAS = {"no": 0, "bias": 1, "alibi": 2}


def signature(family: str, dtype: str) -> dict[str, str]:
    """The ``ASTSource`` signature of stage ``family`` for input dtype ``fp16`` | ``bf16`` | ``fp32``."""
    if dtype not in DTYPES:
        raise ValueError(f"the triton backward template takes dtype fp16, bf16 or fp32, not {dtype!r}")
    _, args, const = KERNELS[family]
    sig = {name: ty.format(dtype=dtype) for name, ty in args}
    sig.update({name: "constexpr" for name in const})
    return sig


def constexprs(sig: dict, alg: dict) -> dict:
    """Constexpr values of a backward stage's kernel key (``sig["family"]`` picks the stage)."""
    from ..data import uses_tma  # the backend's data marks the pipelines that go through the copy engine

    family = sig.get("family")
    if family not in KERNELS:
        raise ValueError(f"the triton backward template does not implement family={family!r}")
    dtype = sig.get("dtype", "fp16")
    if dtype not in DTYPES:
        raise ValueError(f"the triton backward template takes dtype fp16, bf16 or fp32, not {dtype!r}")
    # a companion's signature carries only the head dim it uses (fmha_dsl.kernels.abis.companion_sig)
    hq, hv = int(sig.get("hdim_q", sig.get("hdim_v"))), int(sig.get("hdim_v", sig.get("hdim_q")))
    if not (1 <= hq <= 256 and 1 <= hv <= 256):
        raise ValueError(f"head dims must be in 1..256, got {hq}, {hv}")
    group = sig.get("mode", "batch") == "group"
    bd, bdv = block_d(hq), block_d(hv)
    pad_d, pad_dv = bool(alg.get("pad_d", 1)), bool(alg.get("pad_dv", 1))
    det = bool(sig.get("deterministic", False))
    from .bwd_abi import CONVERT_BLOCK_M, DOT_BLOCK_M

    if family == "bwd_dot_do_o":
        return {"BLOCK_M": DOT_BLOCK_M, "BLOCK_DV": bdv, "IS_GROUP": group, "CHECK_DV": pad_dv or hv != bdv,
                "PAD_DV": pad_dv, "HEAD_DIM_V": hv}
    if family == "bwd_convert_dq":
        return {"BLOCK_M": CONVERT_BLOCK_M, "BLOCK_DMODEL": bd, "IS_GROUP": group, "CHECK_D": pad_d or hq != bd,
                "DETERMINISTIC": det, "PAD_D": pad_d, "HEAD_DIM_Q": hq}
    m0, n0 = int(alg["tile"][0]), int(alg["tile"][1])
    for name, val in (("m0", m0), ("n0", n0)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"tile {name} must be a power of two >= 16, got {val}")
    mask = sig.get("mask", "no") != "no"
    bias = sig.get("bias", "no")
    if sig.get("dbias") and bias != "bias":
        raise ValueError("dbias needs an elementwise bias (bias=bias)")
    return {
        "BLOCK_M": m0, "BLOCK_N": n0, "BLOCK_DMODEL": bd, "BLOCK_DV": bdv, "HEAD_DIM_Q": hq, "HEAD_DIM_V": hv,
        "PAD_M": bool(alg.get("pad_s", 1)) or group, "PAD_N": bool(alg.get("pad_sk", 1)) or group,
        "PAD_D": pad_d, "PAD_DV": pad_dv, "CHECK_D": pad_d or hq != bd, "CHECK_DV": pad_dv or hv != bdv,
        "IS_GROUP": group, "MASK": mask, "SINK": bool(sig.get("sink", False)) and mask,
        "BIAS_TYPE": _BIAS[bias], "DBIAS": bool(sig.get("dbias", False)), "DROPOUT": bool(sig.get("dropout", False)),
        "SOFTCAP": bool(sig.get("logits", False)), "DETERMINISTIC": det, "IEEE": dtype == "fp32",
        # TMA: 0 pointer loads; 2 Q/dO through descriptors and dQ by bulk reduction (1: loads only, for Triton's
        # interpreter, which has no descriptor reductions)
        "UPCAST_DOT": False, "TMA": 2 if uses_tma("triton_bwd", alg.get("pipeline", "bwd")) else 0,
    }
