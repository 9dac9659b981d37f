"""[kernels] The Triton forward attention template: one ``@triton.jit`` kernel, specialised by constexprs.

It computes exactly ``docs/semantics.md`` (the NumPy twin is :func:`fmha_dsl.reference.attention_fwd`):
fp16 / bf16 / fp32, head dims 1..256 (``Dq != Dv`` allowed, non-powers of two masked), batch and group
(varlen) mode, GQA/MQA, one causal/window mask kernel (corner, window and sink count are run-time
arguments), elementwise bias or ALiBi, optional LSE, Philox dropout bit-exact with ``tl.rand``, logits
soft-cap, row- or column-major V.  Online softmax in base 2 with fp32 statistics; fully masked rows give
``out = 0`` and ``lse = -inf``.  For mask kernels the key loop visits only the key blocks a query block
can see, and only the blocks that straddle the mask boundary pay for the mask.  At most two pipelined key loops
run per program -- the fully visible blocks, then every masked block (sink, window edges, diagonal) in one loop --
because Triton software-pipelines each top-level loop and an empty one still costs its prologue (docs/triton.md,
"The key loop").  Padding costs only where a bound falls: a partial last key block runs alone after the loops, with
its key bound checked (neither loop checks one), and a partial last query block reads its missing rows from the
sequence's last row instead of through a row mask (their results are never stored).

Where things are: the per-block steps (:mod:`.triton_steps`, shared with the paged and backward templates) and the
key loops (:mod:`.triton_fwd_loops`) are device code it calls; the host side -- constexprs of a kernel key, the
``ASTSource`` signature and alignment promise, grid, argument packing -- is :mod:`.fwd_host` (free of Triton); the
CPU interpreter harness is :mod:`.fwd_interpret`.

``fmha_fwd``
    The ``@triton.jit`` kernel.  Parameters: the names of :data:`ARGS` in order, then the constexprs
    :data:`CONSTEXPRS` (values: :func:`constexprs`; both re-exported from :mod:`.fwd_host`, with
    :func:`signature`, as the template's contract with ``kernels/abis.py``).

``num_warps``/``num_stages`` are launch/compile options, not constexprs (``fmha_dsl.compile_triton``).

Integer widths.  Sizes, head counts and strides are ``i32`` (each stride, in elements, below 2**31, and
``BLOCK_M`` or ``BLOCK_N`` times a row stride too); the kernel promotes batch/head/sequence-start offsets to
int64 before multiplying and moves its base pointers per block, so a tensor may hold more than 2**31
elements.  ``seed`` and ``philox_offset`` are ``i64`` (the seed is read as uint64, like
``tl.rand``; the dropout counter ``offset + linear index`` is computed in int64 and fed to Philox as
``(lo32, hi32, 0, 0)``, which is what ``tl.rand`` does with an int64 offset).

Layout contract.  The innermost stride of Q, K, O (head dim), of the bias (key axis) and of the LSE
(row axis) must be 1, and V's unit stride is the head dim (``VLAYOUT`` "r", row-major) or the key axis
("c", column-major).  Those strides are still parameters (so the ABI names every stride), but the kernel
treats them as the constant 1 so that loads vectorise; :func:`.fwd_host.pack_args` rejects anything else.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fwd_host import ARGS, CONSTEXPRS, DTYPES, constexprs, signature  # noqa: F401  (the template's contract: abis.py)
from .triton_fwd_loops import _block, _masked, _steps
from .triton_steps import _load

__all__ = ["fmha_fwd", "ARGS", "CONSTEXPRS", "DTYPES", "signature", "constexprs"]


@triton.jit
def fmha_fwd(Q, K, V, Out, Lse, Bias, Alibi, cu_seqlens_q, cu_seqlens_k,
             sm_scale, softcap, dropout_p, seed, philox_offset,
             seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k, nhead_q, nhead_k, head_dim_q, head_dim_v,
             window_left, window_right, mask_bottom_right, sink,
             stride_qb, stride_qh, stride_qm, stride_qd,
             stride_kb, stride_kh, stride_kn, stride_kd,
             stride_vb, stride_vh, stride_vn, stride_vd,
             stride_ob, stride_oh, stride_om, stride_od,
             stride_lb, stride_lh, stride_lm,
             stride_bb, stride_bh, stride_bm, stride_bn,
             stride_ab, stride_ah,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DMODEL: tl.constexpr, BLOCK_DV: tl.constexpr,
             HEAD_DIM_Q: tl.constexpr, HEAD_DIM_V: tl.constexpr,
             PAD_M: tl.constexpr, PAD_N: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
             CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr,
             IS_GROUP: tl.constexpr, MASK: tl.constexpr, SINK: tl.constexpr, BIAS_TYPE: tl.constexpr,
             STORE_LSE: tl.constexpr, DROPOUT: tl.constexpr, SOFTCAP: tl.constexpr, VLAYOUT_C: tl.constexpr,
             IEEE: tl.constexpr, UPCAST_DOT: tl.constexpr, SPLIT: tl.constexpr, TMA: tl.constexpr,
             PACK_GQA: tl.constexpr):
    pid_m = tl.program_id(0)
    if MASK:  # the longest rows (last query blocks under a causal mask) start first
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_h = tl.program_id(1)
    group_r = nhead_q // nhead_k
    heads = nhead_q
    if PACK_GQA:  # one program per K/V head: the query heads of its group are packed into the tile's rows
        heads = nhead_k
    off_h = pid_h
    n_split = 1
    split = 0
    if SPLIT:  # split-KV: program_id(1) = head * num_splits + split
        n_split = tl.num_programs(1) // heads
        off_h = pid_h // n_split
        split = pid_h % n_split
    off_b = tl.program_id(2)
    if PACK_GQA:
        off_hk = off_h
    else:
        off_hk = off_h // group_r

    if IS_GROUP:
        q_start = tl.load(cu_seqlens_q + off_b)
        seqlen_q = tl.load(cu_seqlens_q + off_b + 1) - q_start
        k_start = tl.load(cu_seqlens_k + off_b)
        seqlen_k = tl.load(cu_seqlens_k + off_b + 1) - k_start
        sq_max = max_seqlen_q
        sk_max = max_seqlen_k
        bq = off_b.to(tl.int64) * 0
        bk = bq
        bv = bq
        bo = bq
        bl = bq
    else:
        q_start = off_b * 0
        k_start = q_start
        sq_max = seqlen_q
        sk_max = seqlen_k
        bq = off_b.to(tl.int64) * stride_qb
        bk = off_b.to(tl.int64) * stride_kb
        bv = off_b.to(tl.int64) * stride_vb
        bo = off_b.to(tl.int64) * stride_ob
        bl = off_b.to(tl.int64) * stride_lb
    start_m = pid_m * BLOCK_M
    rows_total = seqlen_q
    if PACK_GQA:  # packed row t is query t // group_r of head off_hk * group_r + t % group_r
        rows_total = seqlen_q * group_r
    if start_m >= rows_total:
        return
    # split-KV without a mask: this program sees the key blocks [s_lo, s_hi) (whole blocks, evenly shared by the
    # splits); with a mask the splits share the blocks in the mask's reach (below)
    s_lo = start_m * 0
    s_hi = s_lo
    if SPLIT:
        per = tl.cdiv(tl.cdiv(seqlen_k, BLOCK_N), n_split) * BLOCK_N
        s_lo = split * per
        s_hi = s_lo + per

    if VLAYOUT_C:
        svn = 1
        svd = stride_vd
    else:
        svn = stride_vn
        svd = 1
    if PAD_D:
        dq_lim = head_dim_q
    else:
        dq_lim = HEAD_DIM_Q
    if PAD_DV:
        dv_lim = head_dim_v
    else:
        dv_lim = HEAD_DIM_V

    offs_r = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    if PACK_GQA:
        t_rows = start_m + offs_r
        offs_m = t_rows // group_r                       # each row's query index
        head_r = off_hk * group_r + t_rows % group_r     # each row's query head
        m_ok = t_rows < rows_total
        q_first = start_m // group_r                     # the block's first and last query
        q_last = (tl.minimum(start_m + BLOCK_M, rows_total) - 1) // group_r
        q_rows = bq + head_r.to(tl.int64) * stride_qh + (q_start + offs_m).to(tl.int64) * stride_qm
        q = _load(Q + q_rows[:, None] + offs_d[None, :], m_ok[:, None], offs_d[None, :] < dq_lim, True, CHECK_D)
    else:
        offs_m = start_m + offs_r
        head_r = offs_r * 0 + off_h
        m_ok = offs_m < seqlen_q
        q_first = start_m
        q_last = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
        q_base = Q + bq + off_h.to(tl.int64) * stride_qh + (q_start + start_m).to(tl.int64) * stride_qm
        q_r = offs_r
        if PAD_M:  # rows past the sequence read its last row (their results are never stored): no row mask
            q_r = tl.minimum(offs_r, seqlen_q - 1 - start_m)
        q = _load(q_base + q_r[:, None] * stride_qm + offs_d[None, :], m_ok[:, None], offs_d[None, :] < dq_lim,
                  False, CHECK_D)
    k_base = K + bk + off_hk.to(tl.int64) * stride_kh + k_start.to(tl.int64) * stride_kn
    v_base = V + bv + off_hk.to(tl.int64) * stride_vh + k_start.to(tl.int64) * svn
    k_src = k_base
    v_src = v_base
    if TMA:  # on-device descriptors over this (batch, head)'s keys; row-major V, 16-byte aligned (the rules' promise);
        # a sequence without keys gets a one-row descriptor it never reads (a zero extent is illegal)
        k_src = tl.make_tensor_descriptor(k_base, shape=[tl.maximum(seqlen_k, 1), dq_lim], strides=[stride_kn, 1],
                                          block_shape=[BLOCK_N, BLOCK_DMODEL])
        v_src = tl.make_tensor_descriptor(v_base, shape=[tl.maximum(seqlen_k, 1), dv_lim], strides=[svn, 1],
                                          block_shape=[BLOCK_N, BLOCK_DV])

    qk_scale = sm_scale * 1.4426950408889634
    cap_scale = sm_scale
    cap_log2 = sm_scale
    if SOFTCAP:
        cap_scale = sm_scale / softcap
        cap_log2 = softcap * 1.4426950408889634
    b_base = Bias
    b_rows = offs_r
    slope2 = sm_scale * 0.0
    if BIAS_TYPE == 1:
        b_base = Bias + off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh + \
            start_m.to(tl.int64) * stride_bm
        b_rows = offs_r * stride_bm  # int32: BLOCK_M rows of one bias block
    if BIAS_TYPE == 2:
        slope2 = tl.load(Alibi + off_b.to(tl.int64) * stride_ab + off_h * stride_ah).to(tl.float32) * 1.4426950408889634
    rng_lo = offs_m.to(tl.uint32)
    rng_hi = rng_lo
    if DROPOUT:  # dropout counter of (row, column 0), split into 32-bit words
        rng_rows = ((off_b.to(tl.int64) * nhead_q + off_h) * sq_max + offs_m) * sk_max + philox_offset
        rng_lo = rng_rows.to(tl.uint32)
        rng_hi = (rng_rows >> 32).to(tl.uint32)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    if MASK:
        # a window side as wide as both sequences is unbounded, and there are at most seqlen_k sink
        # columns: normalise so that the index arithmetic below cannot overflow int32
        window_left = tl.where(window_left >= seqlen_q + seqlen_k, -1, window_left)
        window_right = tl.where(window_right >= seqlen_q + seqlen_k, -1, window_right)
        sink = tl.maximum(tl.minimum(sink, seqlen_k), 0)
        mask_off = (seqlen_k - seqlen_q) * mask_bottom_right
        m_last = q_last
        # columns some row of this block may see: [j_lo, j_hi)
        j_lo = tl.where(window_left >= 0, tl.maximum(q_first + mask_off - window_left, 0), 0)
        j_hi = tl.where(window_right >= 0, tl.minimum(m_last + mask_off + window_right + 1, seqlen_k), seqlen_k)
        j_hi = tl.maximum(j_hi, 0)
        lo = (j_lo // BLOCK_N) * BLOCK_N
        end = tl.cdiv(j_hi, BLOCK_N) * BLOCK_N
        # columns every row of this block may see, in whole blocks: [f_lo, f_hi)
        f_lo = tl.where(window_left >= 0, tl.maximum(m_last + mask_off - window_left, 0), 0)
        f_lo = tl.cdiv(f_lo, BLOCK_N) * BLOCK_N
        f_hi = tl.where(window_right >= 0, tl.minimum(q_first + mask_off + window_right + 1, seqlen_k), seqlen_k)
        f_hi = (tl.maximum(f_hi, 0) // BLOCK_N) * BLOCK_N
        k_lo = lo * 0  # sink blocks [k_lo, k_hi) (none without SINK)
        k_hi = k_lo
        if SINK:
            s_end = tl.minimum(tl.cdiv(sink, BLOCK_N), tl.cdiv(seqlen_k, BLOCK_N)) * BLOCK_N
            k_hi = s_end
            if SPLIT:  # the sink blocks are the first split's
                k_hi = tl.where(split == 0, s_end, k_lo)
            lo = tl.maximum(lo, s_end)
        if SPLIT:  # the splits share the blocks in reach evenly: a window leaves most of a long cache out of it
            end = tl.maximum(end, lo)
            per = tl.cdiv((end - lo) // BLOCK_N, n_split) * BLOCK_N
            lo = tl.minimum(lo + split * per, end)
            end = tl.minimum(lo + per, end)
        a_end = tl.maximum(tl.minimum(f_lo, end), lo)
        b_end = tl.maximum(tl.minimum(f_hi, end), a_end)
        if not SOFTCAP and BIAS_TYPE == 0:  # the unmasked loop's FMA form needs qk_scale >= 0: a negative scale
            a_end = tl.where(qk_scale >= 0, a_end, b_end)  # sends those blocks to the masked loop (mask all-true)
        a_cut = a_end
        if PAD_N:  # a partial last key block leaves the masked loop (which then checks no key bound, as an unpadded
            # kernel's does) for a block of its own: whichever of the three ranges holds it, cut it off there
            full = (seqlen_k // BLOCK_N) * BLOCK_N
            tail = (full < seqlen_k) & (((k_lo <= full) & (full < k_hi)) | ((lo <= full) & (full < a_end)) |
                                        ((b_end <= full) & (full < end)))
            k_hi = tl.minimum(k_hi, tl.maximum(full, k_lo))
            a_cut = tl.minimum(a_end, tl.maximum(full, lo))
            end = tl.minimum(end, tl.maximum(full, b_end))
        # the blocks every row sees in full, then (softmax is order-free) the masked ones -- sink, the window's left
        # edge, the diagonal / right edge -- in one loop: two loops whatever the mask (an empty loop still pays its
        # software pipeline's prologue and epilogue; under a causal mask only the first query blocks have no full one)
        acc, l_i, m_i = _steps(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                               a_end, b_end, offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                               mask_off, window_left, window_right, sink,
                               stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim, dv_lim,
                               0, PAD_M, False, CHECK_D, CHECK_DV, BLOCK_N,
                               BIAS_TYPE, SOFTCAP, SINK, DROPOUT, IEEE, UPCAST_DOT, TMA)
        acc, l_i, m_i = _masked(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                                k_lo, (k_hi - k_lo) // BLOCK_N, lo, (a_cut - lo) // BLOCK_N,
                                b_end, (end - b_end) // BLOCK_N,
                                offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                                mask_off, window_left, window_right, sink,
                                stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim, dv_lim,
                                PAD_M, False, CHECK_D, CHECK_DV, BLOCK_N,
                                BIAS_TYPE, SOFTCAP, SINK, DROPOUT, IEEE, UPCAST_DOT, TMA)
        if PAD_N:
            if tail:  # the partial last key block, with its bounds, under a branch (one block: no pipeline)
                acc, l_i, m_i = _block(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                                       full, offs_m, offs_n, offs_d, offs_dv, offs_d < dq_lim, offs_dv < dv_lim,
                                       offs_m < seqlen_q, seqlen_q, seqlen_k, mask_off, window_left, window_right,
                                       sink, stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed,
                                       2, PAD_M, True, CHECK_D, CHECK_DV, BIAS_TYPE, SOFTCAP, SINK, DROPOUT, IEEE,
                                       UPCAST_DOT, TMA)
    else:
        if PAD_N:
            full = (seqlen_k // BLOCK_N) * BLOCK_N
        else:
            full = seqlen_k
        k_lo = full * 0
        k_hi = full
        t_lo = full
        t_hi = seqlen_k
        if SPLIT:
            k_lo = s_lo
            k_hi = tl.minimum(full, s_hi)
            t_lo = tl.maximum(full, s_lo)
            t_hi = tl.minimum(seqlen_k, s_hi)
        n_hi = k_hi  # the unmasked loop's FMA form needs qk_scale >= 0: a negative scale sends its blocks elsewhere
        if not SOFTCAP and BIAS_TYPE == 0:
            n_hi = tl.where(qk_scale >= 0, k_hi, k_lo)
            if PAD_N:  # to the tail loop (bounds checks; it then starts at k_lo)
                t_lo = tl.where(qk_scale >= 0, t_lo, k_lo)
        acc, l_i, m_i = _steps(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                               k_lo, n_hi, offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                               0, -1, -1, 0,
                               stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim, dv_lim,
                               0, PAD_M, False, CHECK_D, CHECK_DV, BLOCK_N,
                               BIAS_TYPE, SOFTCAP, False, DROPOUT, IEEE, UPCAST_DOT, TMA)
        if not SOFTCAP and BIAS_TYPE == 0 and not PAD_N:
            if n_hi < k_hi:  # (rare: under a branch, so that it costs nothing when not taken; STEP 1 without
                # bounds checks is the plain form of STEP 0)
                acc, l_i, m_i = _steps(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                                       n_hi, k_hi, offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                                       0, -1, -1, 0,
                                       stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim,
                                       dv_lim, 1, PAD_M, False, CHECK_D, CHECK_DV, BLOCK_N,
                                       BIAS_TYPE, SOFTCAP, False, DROPOUT, IEEE, UPCAST_DOT, TMA)
        if PAD_N:
            if t_lo < t_hi:  # the tail block (all blocks for a negative scale) under a branch: a key length that is a
                # multiple of BLOCK_N pays nothing for padding (an empty top-level loop would still pay its prologue)
                acc, l_i, m_i = _steps(acc, l_i, m_i, q, k_src, v_src, b_base, b_rows, rng_lo, rng_hi, slope2,
                                       t_lo, t_hi, offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                                       0, -1, -1, 0,
                                       stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim,
                                       dv_lim, 1, PAD_M, True, CHECK_D, CHECK_DV, BLOCK_N,
                                       BIAS_TYPE, SOFTCAP, False, DROPOUT, IEEE, UPCAST_DOT, TMA)

    # epilogue: rows that saw no allowed column (l = 0) give 0 and lse = -inf
    live = l_i > 0.0
    inv = tl.where(live, 1.0 / tl.where(live, l_i, 1.0), 0.0)
    if DROPOUT:
        inv = inv * (1.0 / (1.0 - dropout_p))
    out = acc * inv[:, None]
    o_head = off_h
    o_row = q_start + start_m
    if SPLIT:  # the partial result goes to the fp32 workspace [B, Hq * splits, max_seqlen_q, Dv] (every mode)
        o_head = pid_h
        o_row = start_m
        bo = off_b.to(tl.int64) * stride_ob
        bl = off_b.to(tl.int64) * stride_lb
    if PACK_GQA:  # every row has its own head and query: per-row addresses
        r_head = head_r
        r_row = q_start + offs_m
        if SPLIT:
            r_head = head_r * n_split + split
            r_row = offs_m
        o_rows = bo + r_head.to(tl.int64) * stride_oh + r_row.to(tl.int64) * stride_om
        o_ptrs = Out + o_rows[:, None] + offs_dv[None, :]
        l_ptrs = Lse + bl + r_head.to(tl.int64) * stride_lh + r_row.to(tl.int64)
    else:
        o_base = Out + bo + o_head.to(tl.int64) * stride_oh + o_row.to(tl.int64) * stride_om
        o_ptrs = o_base + offs_r[:, None] * stride_om + offs_dv[None, :]
        l_ptrs = Lse + bl + o_head.to(tl.int64) * stride_lh + o_row.to(tl.int64) + offs_r
    o_val = out.to(Out.dtype.element_ty)
    if PAD_M or PACK_GQA:
        if CHECK_DV:
            tl.store(o_ptrs, o_val, mask=m_ok[:, None] & (offs_dv[None, :] < dv_lim))
        else:
            tl.store(o_ptrs, o_val, mask=m_ok[:, None])
    else:
        if CHECK_DV:
            tl.store(o_ptrs, o_val, mask=offs_dv[None, :] < dv_lim)
        else:
            tl.store(o_ptrs, o_val)
    if STORE_LSE or SPLIT:  # the combine kernel weighs the splits by their LSE
        lse = tl.where(live, m_i * 0.6931471805599453 + tl.log(tl.where(live, l_i, 1.0)), float("-inf"))
        if PAD_M or PACK_GQA:
            tl.store(l_ptrs, lse, mask=m_ok)
        else:
            tl.store(l_ptrs, lse)


def _check_names():
    import inspect

    params = list(inspect.signature(fmha_fwd.fn).parameters)
    want = [n for n, _ in ARGS] + list(CONSTEXPRS)
    assert params == want, f"fmha_fwd parameters drifted from ARGS + CONSTEXPRS:\n{params}\n{want}"


_check_names()
