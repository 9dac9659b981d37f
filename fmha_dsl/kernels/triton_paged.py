"""[kernels] The Triton template of the paged serving families: attention over a paged KV cache.

``fmha_paged`` serves ``batch_prefill`` (prefill over the paged cache) and ``fwd_pagedkv`` (the same with split-KV:
decode, a few query rows per sequence, the key axis shared by up to ``2**max_splits_log2`` programs whose partial
results the forward family's combine kernel reduces).  It computes exactly
:func:`fmha_dsl.reference_paged.paged_attention` (docs/semantics.md, "Paged KV cache"): group-mode queries, each
sequence's keys gathered page by page; causal (top-left / bottom-right) and sliding-window masks with sink tokens,
GQA/MQA (optionally the query heads of a group packed into one tile's rows, CK's ``qr_nwarp_sshuffle``), logits
soft-cap, ALiBi, LSE; FP8 (``FP8``: CK's ``fp8bf16`` contract, e4m3 Q and caches with per-tensor descales -- or,
``KV_SCALE`` 1, CK's KV block scales: K/V descales per page and head; ``KV_SCALE`` 2, CK's per-token-head scales:
per cached token and K/V head, q's per query token and head --, bf16 output: Q.K^T an e4m3 dot -- sm90's
warpgroup MMA takes it natively, narrower tiles' MMAs widen both to fp16 --, V widened to fp16 after its load,
exactly, for P.V in fp16 -- or, ``V_ROWS``, descaled row by row into bf16; an FP8 cache moves half the bytes of a
bf16 one).
The score, softmax and P.V steps are the forward template's (:mod:`.triton_fwd`); what is new is where a key block's
rows live (:mod:`.triton_paged_rows`): with ``PAGE_SIZE >= BLOCK_N`` a block lies in one page (one page-id load, rows at
a fixed stride); with smaller pages every row has its own page (a gather of ``BLOCK_N`` row addresses; K is read in V's
layout, ``[BLOCK_N, D]``, and transposed for the dot, so that a thread's K and V rows are the same and share their page
ids). The cache is linear (``KV_VEC`` 0: ``[pages, page_size, Hk, D]`` by strides) or CK's vectorized layout (``KV_VEC``
elements of 16 bytes: K ``[pages, Hk, D / KV_VEC, page_size, KV_VEC]``, V ``[pages, Hk, page_size / KV_VEC, D,
KV_VEC]``), which is read in memory order instead -- K a page's run of keys at a time, V a group of ``KV_VEC`` tokens,
each with its own page-id loads -- and rebuilt into the dot's tiles in registers.
Page ids are clamped into the cache and a sequence never reads past its table (:mod:`.paged_abi`).

Append-KV (writing the new rows the kernel later reads) is :mod:`.triton_appendkv`.

API for the build and the runtime (plain Python; triton is imported by this module only): ``fmha_paged``
(parameters: :data:`fmha_dsl.kernels.paged_abi.ARGS` in order, then :data:`CONSTEXPRS`) and ``constexprs(sig,
alg)``, both re-exported from :mod:`.paged_host` (free of Triton).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .paged_abi import ARGS
from .paged_host import CONSTEXPRS, constexprs, v_descale_per_key  # noqa: F401  (the template's contract: abis.py)
from .triton_paged_rows import _k_vectors, _page, _pages, _rows, _table, _v_vectors
from .triton_paged_scales import _descaled_scores, _v_units
from .triton_steps import _dot, _load, _softmax

__all__ = ["fmha_paged", "CONSTEXPRS", "constexprs", "v_descale_per_key"]


# ------------------------------------------------------------------------------------------------------
# device code
# ------------------------------------------------------------------------------------------------------
@triton.jit
def _block(acc, l_i, m_i, v_ref, q, k_base, v_base, kd_base, vd_base, Table, tb, num_pages, slope2, start_n, offs_m,
           offs_n, offs_d, offs_dv, d_ok, dv_ok, seqlen_q, seqlen_k, mask_off, window_left, window_right, sink,
           stride_kp, stride_ks, stride_vp, stride_vs, stride_kdp, stride_vdp, stride_kds, stride_vds, q_row,
           qk_scale, cap_scale, cap_log2,
           STEP: tl.constexpr, CHECK_N: tl.constexpr, CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr,
           ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, SINK: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
           PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, KV_VEC: tl.constexpr,
           KV_SCALE: tl.constexpr, V_ROWS: tl.constexpr):
    """One key block of the paged cache: gathered K and V tiles (TMA: the block's page through the descriptors
    ``k_base``/``v_base`` over the cache's rows), the forward template's online-softmax step; ``KV_SCALE``: FP8 KV
    block scales, 2 per-token-head scales (:mod:`.triton_paged_scales`; ``acc`` in units of ``v_ref``, or with
    ``V_ROWS`` V's rows descaled and ``v_ref`` 1; ``q_row``: each row's q descale with 2)."""
    n_ok = (start_n + offs_n) < seqlen_k
    if TMA:  # PAGE_SIZE >= BLOCK_N, pages contiguous: the block is rows [row0, row0 + BLOCK_N) of the cache
        page = _page(tl.load(Table + tb + start_n // PAGE_SIZE), num_pages)
        row0 = (page * PAGE_SIZE).to(tl.int32) + start_n % PAGE_SIZE
        qk = _dot(q, tl.trans(k_base.load([row0, 0]).to(q.dtype)), None, IEEE, UPCAST)
    else:
        if KV_VEC:  # K^T [D, N] read page run by page run (stride_ks: the stride of the head dim's vectors)
            k = _k_vectors(k_base, Table, tb, num_pages, start_n, seqlen_k, stride_kp, stride_ks, d_ok, CHECK_N,
                           CHECK_D, PAGE_SIZE, BLOCK_N, offs_d.shape[0], KV_VEC)
            qk = _dot(q, k.to(q.dtype), None, IEEE, UPCAST)
        else:  # K [N, D], as V is read: a thread's K and V rows are the same, their page ids loaded once
            page = _pages(Table, tb, num_pages, start_n, offs_n, seqlen_k, CHECK_N, PAGE_SIZE, BLOCK_N)
            krows = _rows(page, start_n, offs_n, stride_kp, stride_ks, PAGE_SIZE, BLOCK_N, 0)
            k = _load(k_base + krows[:, None] + offs_d[None, :], n_ok[:, None], d_ok[None, :], CHECK_N, CHECK_D)
            qk = _dot(q, tl.trans(k.to(q.dtype)), None, IEEE, UPCAST)
    if KV_SCALE:  # the keys' pages (one for the block when PAGE_SIZE >= BLOCK_N) and their descales
        if KV_VEC:
            page = _pages(Table, tb, num_pages, start_n, offs_n, seqlen_k, CHECK_N, PAGE_SIZE, BLOCK_N)
        qk, vd, v_top = _descaled_scores(qk, kd_base, vd_base, page, start_n, offs_n, n_ok, q_row, stride_kdp,
                                         stride_vdp, stride_kds, stride_vds, CHECK_N, PAGE_SIZE, BLOCK_N, KV_SCALE,
                                         V_ROWS)
    p, alpha, l_i, m_i = _softmax(l_i, m_i, qk, start_n, k_base, offs_m, offs_m.to(tl.uint32), offs_m.to(tl.uint32),
                                  slope2, offs_m, offs_n, offs_m >= 0, seqlen_q, seqlen_k, mask_off, window_left,
                                  window_right, sink, qk_scale, cap_scale, cap_log2, 0.0, 0,
                                  STEP, False, CHECK_N, 2 if ALIBI else 0, SOFTCAP, SINK, False,
                                  STEP == 0 and not SOFTCAP and not ALIBI)
    if TMA:
        v = v_base.load([row0, 0]).to(q.dtype)
        if CHECK_N:  # rows past the sequence hold other tokens (or never-written memory): zero them
            v = tl.where(n_ok[:, None], v, 0.0)
    elif KV_VEC:
        v = _v_vectors(v_base, Table, tb, num_pages, start_n, seqlen_k, stride_vp, stride_vs, dv_ok, CHECK_N,
                       CHECK_DV, PAGE_SIZE, BLOCK_N, offs_dv.shape[0], KV_VEC)
    else:
        vrows = _rows(page, start_n, offs_n, stride_vp, stride_vs, PAGE_SIZE, BLOCK_N, 0)
        v = _load(v_base + vrows[:, None] + offs_dv[None, :], n_ok[:, None], dv_ok[None, :], CHECK_N, CHECK_DV)
    if V_ROWS:  # a V descale per key, on V's rows: the exact values, in bf16 (no reference scale to keep)
        v = (v.to(tl.float32) * vd[:, None]).to(tl.bfloat16)
    elif v.dtype.is_fp8():  # FP8 caches: e4m3 -> fp16 (exact) for P @ V
        v = v.to(tl.float16)
    if KV_SCALE and not V_ROWS:  # acc in units of v_ref, the largest |v_descale| so far
        p, alpha, v_ref = _v_units(p, alpha, v_ref, vd, v_top, PAGE_SIZE < BLOCK_N or KV_SCALE == 2)
    acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], IEEE, UPCAST)
    return acc, l_i, m_i, v_ref


@triton.jit
def _loop(acc, l_i, m_i, v_ref, q, k_base, v_base, kd_base, vd_base, Table, tb, num_pages, slope2,
          lo1, n1, lo2, n2, lo3, n3, offs_m, offs_n, offs_d, offs_dv, d_ok, dv_ok, seqlen_q, seqlen_k,
          mask_off, window_left, window_right, sink, stride_kp, stride_ks, stride_vp, stride_vs, stride_kdp,
          stride_vdp, stride_kds, stride_vds, q_row, qk_scale, cap_scale, cap_log2,
          STEP: tl.constexpr, CHECK_N: tl.constexpr, CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr,
          ALIBI: tl.constexpr, SOFTCAP: tl.constexpr, SINK: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
          PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr, KV_VEC: tl.constexpr,
          KV_SCALE: tl.constexpr, V_ROWS: tl.constexpr):
    """One pipelined loop over up to three ranges of key blocks: ``n1`` blocks from ``lo1``, ``n2`` from ``lo2``,
    ``n3`` from ``lo3`` (negative counts are none)."""
    n1 = tl.maximum(n1, 0)
    n12 = n1 + tl.maximum(n2, 0)
    for i in range(0, n12 + tl.maximum(n3, 0)):
        start_n = tl.where(i < n1, lo1 + i * BLOCK_N, tl.where(i < n12, lo2 + (i - n1) * BLOCK_N,
                                                               lo3 + (i - n12) * BLOCK_N))
        start_n = tl.multiple_of(start_n, BLOCK_N)
        acc, l_i, m_i, v_ref = _block(acc, l_i, m_i, v_ref, q, k_base, v_base, kd_base, vd_base, Table, tb,
                                      num_pages, slope2, start_n, offs_m, offs_n, offs_d, offs_dv, d_ok, dv_ok,
                                      seqlen_q, seqlen_k, mask_off, window_left, window_right, sink, stride_kp,
                                      stride_ks, stride_vp, stride_vs, stride_kdp, stride_vdp, stride_kds,
                                      stride_vds, q_row, qk_scale, cap_scale, cap_log2, STEP, CHECK_N, CHECK_D,
                                      CHECK_DV, ALIBI, SOFTCAP, SINK, IEEE, UPCAST, PAGE_SIZE, BLOCK_N, TMA, KV_VEC,
                                      KV_SCALE, V_ROWS)
    return acc, l_i, m_i, v_ref


@triton.jit
def fmha_paged(Q, K, V, Out, Lse, Alibi, cu_seqlens_q, seqlens_k, Table, kv_indptr, q_descale, k_descale, v_descale,
               sm_scale, softcap, max_seqlen_q, max_seqlen_k, nhead_q, nhead_k, head_dim_q, head_dim_v,
               num_pages, table_width, window_left, window_right, mask_bottom_right, sink,
               stride_qm, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh,
               stride_ob, stride_oh, stride_om, stride_lb, stride_lh, stride_lm, stride_tb, stride_ab, stride_ah,
               stride_kdp, stride_kdh, stride_vdp, stride_vdh, stride_qdm, stride_qdh, stride_kds, stride_vds,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DMODEL: tl.constexpr, BLOCK_DV: tl.constexpr,
               HEAD_DIM_Q: tl.constexpr, HEAD_DIM_V: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
               CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr, MASK: tl.constexpr, SINK: tl.constexpr,
               ALIBI: tl.constexpr, STORE_LSE: tl.constexpr, SOFTCAP: tl.constexpr, IEEE: tl.constexpr,
               UPCAST_DOT: tl.constexpr, SPLIT: tl.constexpr, PACK_GQA: tl.constexpr, PAGE_SIZE: tl.constexpr,
               LOOKUP: tl.constexpr, TMA: tl.constexpr, KV_VEC: tl.constexpr, FP8: tl.constexpr,
               KV_SCALE: tl.constexpr, V_ROWS: tl.constexpr):
    pid_m = tl.program_id(0)
    if MASK:  # the longest rows (last query blocks under a causal mask) start first
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_h = tl.program_id(1)
    off_b = tl.program_id(2)
    group_r = nhead_q // nhead_k
    heads = nhead_q
    if PACK_GQA:
        heads = nhead_k
    off_h = pid_h
    n_split = 1
    split = 0
    if SPLIT:  # program_id(1) = head * num_splits + split
        n_split = tl.num_programs(1) // heads
        off_h = pid_h // n_split
        split = pid_h % n_split
    if PACK_GQA:
        off_hk = off_h
    else:
        off_hk = off_h // group_r

    q_start = tl.load(cu_seqlens_q + off_b)
    seqlen_q = tl.load(cu_seqlens_q + off_b + 1) - q_start
    seqlen_k = tl.load(seqlens_k + off_b)
    tb, n_tab = _table(kv_indptr, off_b, stride_tb, table_width, LOOKUP)
    # never past the sequence's table (nor below zero keys)
    seqlen_k = tl.maximum(tl.minimum(seqlen_k, n_tab * PAGE_SIZE), 0)

    start_m = pid_m * BLOCK_M
    rows_total = seqlen_q
    if PACK_GQA:
        rows_total = seqlen_q * group_r
    if start_m >= rows_total:
        return
    s_lo = start_m * 0  # split-KV without a mask: the key blocks [s_lo, s_hi) (with one: those in reach, below)
    s_hi = s_lo
    if SPLIT:
        per = tl.cdiv(tl.cdiv(seqlen_k, BLOCK_N), n_split) * BLOCK_N
        s_lo = split * per
        s_hi = s_lo + per
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
    d_ok = offs_d < dq_lim
    dv_ok = offs_dv < dv_lim
    if PACK_GQA:  # packed row t is query t // group_r of head off_hk * group_r + t % group_r
        t_rows = start_m + offs_r
        offs_m = t_rows // group_r
        head_r = off_hk * group_r + t_rows % group_r
        m_ok = t_rows < rows_total
        q_first = start_m // group_r
        q_last = (tl.minimum(start_m + BLOCK_M, rows_total) - 1) // group_r
    else:
        offs_m = start_m + offs_r
        head_r = offs_r * 0 + off_h
        m_ok = offs_m < seqlen_q
        q_first = start_m
        q_last = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
    # rows past the sequence read its last row (their results are never stored): no row mask on the Q load
    if PACK_GQA:
        t_last = tl.minimum(start_m + offs_r, rows_total - 1)
        q_rows = (off_hk * group_r + t_last % group_r).to(tl.int64) * stride_qh + \
            (q_start + t_last // group_r).to(tl.int64) * stride_qm
    else:
        q_rows = off_h.to(tl.int64) * stride_qh + (q_start + tl.minimum(offs_m, seqlen_q - 1)).to(tl.int64) * stride_qm
    q = _load(Q + q_rows[:, None] + offs_d[None, :], m_ok[:, None], d_ok[None, :], False, CHECK_D)
    k_base = K + off_hk.to(tl.int64) * stride_kh
    v_base = V + off_hk.to(tl.int64) * stride_vh
    if TMA:  # descriptors over this K/V head's rows of the whole cache (pages contiguous: stride_kp = PAGE_SIZE rows)
        k_base = tl.make_tensor_descriptor(k_base, shape=[num_pages * PAGE_SIZE, dq_lim], strides=[stride_ks, 1],
                                           block_shape=[BLOCK_N, BLOCK_DMODEL])
        v_base = tl.make_tensor_descriptor(v_base, shape=[num_pages * PAGE_SIZE, dv_lim], strides=[stride_vs, 1],
                                           block_shape=[BLOCK_N, BLOCK_DV])

    qk_scale = sm_scale * 1.4426950408889634
    cap_scale = sm_scale
    cap_log2 = sm_scale
    if SOFTCAP:
        cap_scale = sm_scale / softcap
        cap_log2 = softcap * 1.4426950408889634
    kd_base = k_descale + off_hk * stride_kdh   # KV block scales: this K/V head's column of [num_pages, Hk]
    vd_base = v_descale + off_hk * stride_vdh   # (per-token-head ones: of [num_pages, page_size, Hk])
    v_ref = sm_scale * 0.0
    if V_ROWS:  # V descaled row by row: P.V in its own units
        v_ref = v_ref + 1.0
    q_row = sm_scale * 0.0 + 1.0
    if KV_SCALE == 2:  # per-token-head scales: each row's q descale (its token's and head's), its sign carried by q
        q_tok = (q_start + tl.minimum(offs_m, seqlen_q - 1)).to(tl.int64)
        q_row = tl.load(q_descale + q_tok * stride_qdm + head_r.to(tl.int64) * stride_qdh)
        q = (q.to(tl.float32) * tl.where(q_row < 0, -1.0, 1.0)[:, None]).to(q.dtype)   # exact: a sign
        q_row = tl.abs(q_row)
    elif FP8:  # Q.K^T in e4m3 (sm90: fp8 warpgroup MMA, prefill 0.72x -> 0.97x of bf16), V widened to fp16 (one
        # cvt per pair; bf16 took three, decode 1.2x slower: docs/triton.md); the descales scale the scores (their
        # sign carried by q) and the output (KV block scales: per key block, in _block)
        qk_descale = tl.load(q_descale)
        if not KV_SCALE:
            qk_descale = qk_descale * tl.load(k_descale)
        q = (q.to(tl.float32) * tl.where(qk_descale < 0, -1.0, 1.0)).to(q.dtype)   # exact: a sign
        qk_descale = tl.abs(qk_descale)
        qk_scale = qk_scale * qk_descale
        cap_scale = cap_scale * qk_descale
    slope2 = sm_scale * 0.0
    if ALIBI:
        slope2 = tl.load(Alibi + off_b.to(tl.int64) * stride_ab + off_h * stride_ah).to(tl.float32) * \
            1.4426950408889634

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    if MASK:
        window_left = tl.where(window_left >= seqlen_q + seqlen_k, -1, window_left)
        window_right = tl.where(window_right >= seqlen_q + seqlen_k, -1, window_right)
        sink = tl.maximum(tl.minimum(sink, seqlen_k), 0)
        mask_off = (seqlen_k - seqlen_q) * mask_bottom_right
        # columns some row of this block may see: [lo, end); every row sees: [f_lo, f_hi) (whole blocks)
        j_lo = tl.where(window_left >= 0, tl.maximum(q_first + mask_off - window_left, 0), 0)
        j_hi = tl.where(window_right >= 0, tl.minimum(q_last + mask_off + window_right + 1, seqlen_k), seqlen_k)
        lo = (j_lo // BLOCK_N) * BLOCK_N
        end = tl.cdiv(tl.maximum(j_hi, 0), BLOCK_N) * BLOCK_N
        f_lo = tl.where(window_left >= 0, tl.maximum(q_last + mask_off - window_left, 0), 0)
        f_lo = tl.cdiv(f_lo, BLOCK_N) * BLOCK_N
        f_hi = tl.where(window_right >= 0, tl.minimum(q_first + mask_off + window_right + 1, seqlen_k), seqlen_k)
        f_hi = (tl.maximum(f_hi, 0) // BLOCK_N) * BLOCK_N
        k_lo = lo * 0
        k_hi = k_lo
        if SINK:  # the sink blocks, then the window from past them
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
        # the blocks every row sees in full (no mask), then the masked ones -- sink, left edge, diagonal -- in one loop
        acc, l_i, m_i, v_ref = _loop(acc, l_i, m_i, v_ref, q, k_base, v_base, kd_base, vd_base, Table, tb,
                                     num_pages, slope2,
                              a_end, (b_end - a_end) // BLOCK_N, 0, 0, 0, 0, offs_m, offs_n, offs_d, offs_dv, d_ok,
                              dv_ok, seqlen_q, seqlen_k, mask_off, window_left, window_right, sink,
                              stride_kp, stride_ks, stride_vp, stride_vs, stride_kdp, stride_vdp, stride_kds,
                              stride_vds, q_row, qk_scale, cap_scale, cap_log2, 0, False, CHECK_D, CHECK_DV, ALIBI,
                              SOFTCAP, SINK, IEEE, UPCAST_DOT, PAGE_SIZE, BLOCK_N, TMA, KV_VEC, KV_SCALE, V_ROWS)
        acc, l_i, m_i, v_ref = _loop(acc, l_i, m_i, v_ref, q, k_base, v_base, kd_base, vd_base, Table, tb,
                                     num_pages, slope2,
                              k_lo, (k_hi - k_lo) // BLOCK_N, lo, (a_end - lo) // BLOCK_N, b_end,
                              (end - b_end) // BLOCK_N, offs_m, offs_n, offs_d, offs_dv, d_ok, dv_ok,
                              seqlen_q, seqlen_k, mask_off, window_left, window_right, sink,
                              stride_kp, stride_ks, stride_vp, stride_vs, stride_kdp, stride_vdp, stride_kds,
                              stride_vds, q_row, qk_scale, cap_scale, cap_log2, 2, True, CHECK_D, CHECK_DV, ALIBI,
                              SOFTCAP, SINK, IEEE, UPCAST_DOT, PAGE_SIZE, BLOCK_N, TMA, KV_VEC, KV_SCALE, V_ROWS)
    else:
        full = (seqlen_k // BLOCK_N) * BLOCK_N
        k_lo = full * 0
        k_hi = full
        t_lo = full
        t_hi = seqlen_k
        if SPLIT:
            k_lo = s_lo
            k_hi = tl.maximum(tl.minimum(full, s_hi), s_lo)
            t_lo = tl.maximum(full, s_lo)
            t_hi = tl.minimum(seqlen_k, s_hi)
        acc, l_i, m_i, v_ref = _loop(acc, l_i, m_i, v_ref, q, k_base, v_base, kd_base, vd_base, Table, tb,
                                     num_pages, slope2,
                              k_lo, (k_hi - k_lo) // BLOCK_N, 0, 0, 0, 0, offs_m, offs_n, offs_d, offs_dv, d_ok,
                              dv_ok, seqlen_q, seqlen_k, 0, -1, -1, 0,
                              stride_kp, stride_ks, stride_vp, stride_vs, stride_kdp, stride_vdp, stride_kds,
                              stride_vds, q_row, qk_scale, cap_scale, cap_log2, 0, False, CHECK_D, CHECK_DV, ALIBI,
                              SOFTCAP, False, IEEE, UPCAST_DOT, PAGE_SIZE, BLOCK_N, TMA, KV_VEC, KV_SCALE, V_ROWS)
        if t_lo < t_hi:  # the tail block, under a branch: a length that is a multiple of BLOCK_N pays nothing
            acc, l_i, m_i, v_ref = _block(acc, l_i, m_i, v_ref, q, k_base, v_base, kd_base, vd_base, Table, tb,
                                          num_pages, slope2, t_lo, offs_m, offs_n, offs_d, offs_dv, d_ok, dv_ok,
                                          seqlen_q, seqlen_k, 0, -1, -1, 0, stride_kp, stride_ks, stride_vp,
                                          stride_vs, stride_kdp, stride_vdp, stride_kds, stride_vds, q_row,
                                          qk_scale, cap_scale, cap_log2, 1, True,
                                          CHECK_D, CHECK_DV, ALIBI, SOFTCAP, False, IEEE, UPCAST_DOT, PAGE_SIZE,
                                          BLOCK_N, TMA, KV_VEC, KV_SCALE, V_ROWS)

    # epilogue: rows that saw no allowed key (l = 0) give 0 and lse = -inf
    live = l_i > 0.0
    norm = tl.where(live, 1.0 / tl.where(live, l_i, 1.0), 0.0)
    if KV_SCALE:
        norm = norm * v_ref
    elif FP8:
        norm = norm * tl.load(v_descale)
    out = acc * norm[:, None]
    r_head = head_r
    r_row = q_start + offs_m
    bo = off_b.to(tl.int64) * 0
    bl = bo
    if SPLIT:  # fp32 workspaces [B, Hq * splits, max_seqlen_q, Dv] / [B, Hq * splits, max_seqlen_q]
        r_head = head_r * n_split + split
        r_row = offs_m
        bo = off_b.to(tl.int64) * stride_ob
        bl = off_b.to(tl.int64) * stride_lb
    o_rows = bo + r_head.to(tl.int64) * stride_oh + r_row.to(tl.int64) * stride_om
    o_ptrs = Out + o_rows[:, None] + offs_dv[None, :]
    if CHECK_DV:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & dv_ok[None, :])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None])
    if STORE_LSE or SPLIT:
        lse = tl.where(live, m_i * 0.6931471805599453 + tl.log(tl.where(live, l_i, 1.0)), float("-inf"))
        tl.store(Lse + bl + r_head.to(tl.int64) * stride_lh + r_row.to(tl.int64) * stride_lm, lse, mask=m_ok)


# ------------------------------------------------------------------------------------------------------
# the template's contract with the build (abis.py): its constexprs, from the host side (:mod:`.paged_host`)
# ------------------------------------------------------------------------------------------------------
def _check_names():
    import inspect

    params = list(inspect.signature(fmha_paged.fn).parameters)
    want = [n for n, _ in ARGS] + list(CONSTEXPRS)
    assert params == want, f"fmha_paged parameters drifted from its ABI:\n{params}\n{want}"


_check_names()
