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
"The key loop").

API for the build and the runtime (plain Python; triton is imported by this module only):

``fmha_fwd``
    The ``@triton.jit`` kernel.  Parameters: the names of :data:`ARGS` in order, then the constexprs
    :data:`CONSTEXPRS` (see :func:`constexprs`).
``ARGS``
    ``(name, type)`` of every run-time parameter in order.  ``"*{dtype}"`` stands for the input dtype's
    pointer (``*fp16``/``*bf16``/``*fp32``); :func:`signature` fills it in.
``signature(dtype) -> dict``
    The full ``triton.compiler.ASTSource`` signature (constexprs marked ``"constexpr"``).
``constexprs(sig, alg) -> dict``
    Kernel-key field dicts (``fmha_dsl.fields.SIG_KEYS`` / ``ALG_KEYS``) -> constexpr values.
``attrs(dtype, vlayout) -> dict`` / ``aligned(args, vlayout) -> bool``
    Optional ``ASTSource(attrs=...)``: ``tt.divisibility 16`` for the pointers and strides named (the
    JIT would infer it; ahead of time it must be promised, or loads are not vectorised).  A runtime
    that uses such a binary must check :func:`aligned` on the packed arguments.
``grid(batch, nhead_q, max_seqlen_q, block_m) -> (x, y, z)``
    ``(cdiv(max_seqlen_q, block_m), nhead_q, batch)``; any zero means there is nothing to launch.
``pack_args(...) -> list``
    The positional run-time arguments in :data:`ARGS` order (pointers as ints, or any object).
``run_interpreted(q, k, v, **reference kwargs) -> (out, lse)``
    Runs the kernel on the CPU under ``TRITON_INTERPRET=1`` with NumPy arrays (tests).

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
treats them as the constant 1 so that loads vectorise; :func:`pack_args` rejects anything else.
"""

from __future__ import annotations


import triton
import triton.language as tl

__all__ = ["fmha_fwd", "ARGS", "CONSTEXPRS", "ALIGNED", "signature", "constexprs", "attrs", "aligned",
           "aligned_names", "grid", "pack_args", "run_interpreted", "block_d", "bf16_round"]

# ------------------------------------------------------------------------------------------------------
# device code
# ------------------------------------------------------------------------------------------------------


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
    # split-KV: this program sees the key blocks [s_lo, s_hi) (whole blocks, evenly shared by the splits)
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
        q = _load(q_base + offs_r[:, None] * stride_qm + offs_d[None, :], m_ok[:, None], offs_d[None, :] < dq_lim,
                  PAD_M, CHECK_D)
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
            if SPLIT:
                k_lo = s_lo
                k_hi = tl.maximum(tl.minimum(s_end, s_hi), s_lo)
            lo = tl.maximum(lo, s_end)
        if SPLIT:
            lo = tl.maximum(lo, s_lo)
            end = tl.maximum(tl.minimum(end, s_hi), lo)
        a_end = tl.maximum(tl.minimum(f_lo, end), lo)
        b_end = tl.maximum(tl.minimum(f_hi, end), a_end)
        if not SOFTCAP and BIAS_TYPE == 0:  # the unmasked loop's FMA form needs qk_scale >= 0: a negative scale
            a_end = tl.where(qk_scale >= 0, a_end, b_end)  # sends those blocks to the masked loop (mask all-true)
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
                                k_lo, (k_hi - k_lo) // BLOCK_N, lo, (a_end - lo) // BLOCK_N,
                                b_end, (end - b_end) // BLOCK_N,
                                offs_m, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k,
                                mask_off, window_left, window_right, sink,
                                stride_kn, svn, svd, qk_scale, cap_scale, cap_log2, dropout_p, seed, dq_lim, dv_lim,
                                PAD_M, PAD_N, CHECK_D, CHECK_DV, BLOCK_N,
                                BIAS_TYPE, SOFTCAP, SINK, DROPOUT, IEEE, UPCAST_DOT, TMA)
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


# ------------------------------------------------------------------------------------------------------
# host glue for the build and the runtime
# ------------------------------------------------------------------------------------------------------

DTYPES = ("fp16", "bf16", "fp32")

from .fwd_abi import ALIGNED, ARGS, aligned_names, block_d, packs_gqa  # noqa: E402,F401  (shared with runtime/rules)

CONSTEXPRS: tuple[str, ...] = (
    "BLOCK_M", "BLOCK_N", "BLOCK_DMODEL", "BLOCK_DV", "HEAD_DIM_Q", "HEAD_DIM_V",
    "PAD_M", "PAD_N", "PAD_D", "PAD_DV", "CHECK_D", "CHECK_DV",
    "IS_GROUP", "MASK", "SINK", "BIAS_TYPE", "STORE_LSE", "DROPOUT", "SOFTCAP", "VLAYOUT_C", "IEEE", "UPCAST_DOT",
    "SPLIT", "TMA", "PACK_GQA",
)


_BIAS = {"no": 0, "bias": 1, "alibi": 2}
_MASKS = ("no", "top_left", "bottom_right", "generic")


def _check_names():
    import inspect

    params = list(inspect.signature(fmha_fwd.fn).parameters)
    want = [n for n, _ in ARGS] + list(CONSTEXPRS)
    assert params == want, f"fmha_fwd parameters drifted from ARGS + CONSTEXPRS:\n{params}\n{want}"


_check_names()


def signature(dtype: str, split: bool = False) -> dict[str, str]:
    """The ``ASTSource`` signature for input dtype ``fp16`` | ``bf16`` | ``fp32``; ``split``: the split-KV kernel,
    whose ``Out`` is the fp32 workspace."""
    if dtype not in DTYPES:
        raise ValueError(f"the triton forward template takes dtype fp16, bf16 or fp32, not {dtype!r}")
    sig = {name: ty.format(dtype=dtype) for name, ty in ARGS}
    if split:
        sig["Out"] = "*fp32"
    sig.update({name: "constexpr" for name in CONSTEXPRS})
    return sig


def constexprs(sig: dict, alg: dict) -> dict:
    """Constexpr values for a kernel key (signature and algorithm field dicts).

    ``tile = (m0, n0, ...)`` gives ``BLOCK_M = m0``, ``BLOCK_N = n0``; the head dims give ``BLOCK_DMODEL``/
    ``BLOCK_DV`` (next power of two, >= 16).  ``pad_s``/``pad_sk``/``pad_d``/``pad_dv`` = 0 drop the bounds
    checks on query rows / key columns / the runtime head dims (the kernel then serves exactly
    ``Sq % BLOCK_M == 0``, ``Sk % BLOCK_N == 0``, ``Dq == hdim_q``, ``Dv == hdim_v``); group mode always
    checks rows and columns.  A head dim that is not a power of two is masked against the constant
    ``hdim`` even when ``pad_d = 0``.  Mask ``top_left``/``bottom_right``/``generic`` all give the same
    kernel (``MASK``): corner, window and sink count are run-time arguments.
    """
    if sig.get("family", "fwd") not in ("fwd", "fwd_splitkv"):
        raise ValueError(f"the triton forward template does not implement family={sig['family']!r}")
    unsupported = {"qscale": "no", "rope": "none", "paged_kv": False, "fp8_static_quant": False,
                   "skip": False, "dbias": False, "store_randval": False}
    for key, ok in unsupported.items():
        if key in sig and sig[key] != ok:
            raise ValueError(f"the triton forward template does not implement {key}={sig[key]!r}")
    dtype = sig.get("dtype", "fp16")
    if dtype not in DTYPES:
        raise ValueError(f"the triton forward template takes dtype fp16, bf16 or fp32, not {dtype!r}")
    hq, hv = int(sig["hdim_q"]), int(sig["hdim_v"])
    if not (1 <= hq <= 256 and 1 <= hv <= 256):
        raise ValueError(f"head dims must be in 1..256, got {hq}, {hv}")
    m0, n0 = int(alg["tile"][0]), int(alg["tile"][1])
    for name, val in (("m0", m0), ("n0", n0)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"tile {name} must be a power of two >= 16, got {val}")
    if sig.get("mask", "no") not in _MASKS:
        raise ValueError(f"unknown mask {sig.get('mask')!r}")
    group = sig.get("mode", "batch") == "group"
    bd, bdv = block_d(hq), block_d(hv)
    pad_d, pad_dv = bool(alg.get("pad_d", 1)), bool(alg.get("pad_dv", 1))
    mask = sig.get("mask", "no") != "no"
    from ..rules.triton_fwd import uses_tma  # the backend's data marks the pipelines that load through TMA

    tma = uses_tma(alg.get("pipeline", ""))
    if tma and sig.get("vlayout", "r") != "r":
        raise ValueError(f"pipeline {alg['pipeline']} (TMA descriptors) needs row-major V (vlayout r)")
    pack = packs_gqa(alg.get("pipeline", ""))
    if pack and (sig.get("bias", "no") != "no" or sig.get("dropout", False)):
        raise ValueError(f"pipeline {alg['pipeline']} (GQA-packed rows) has no bias, ALiBi or dropout")
    return {
        "BLOCK_M": m0, "BLOCK_N": n0, "BLOCK_DMODEL": bd, "BLOCK_DV": bdv, "HEAD_DIM_Q": hq, "HEAD_DIM_V": hv,
        "PAD_M": bool(alg.get("pad_s", 1)) or group, "PAD_N": bool(alg.get("pad_sk", 1)) or group,
        "PAD_D": pad_d, "PAD_DV": pad_dv, "CHECK_D": pad_d or hq != bd, "CHECK_DV": pad_dv or hv != bdv,
        "IS_GROUP": group, "MASK": mask, "SINK": bool(sig.get("sink", False)) and mask,
        "BIAS_TYPE": _BIAS[sig.get("bias", "no")], "STORE_LSE": bool(sig.get("lse", False)),
        "DROPOUT": bool(sig.get("dropout", False)), "SOFTCAP": bool(sig.get("logits", False)),
        "VLAYOUT_C": sig.get("vlayout", "r") == "c", "IEEE": dtype == "fp32", "UPCAST_DOT": False,
        "SPLIT": sig.get("family", "fwd") == "fwd_splitkv", "TMA": tma, "PACK_GQA": pack,
    }


def attrs(dtype: str = "fp16", vlayout: str = "r", names=None) -> dict:
    """``ASTSource(attrs=...)`` promising ``tt.divisibility 16`` for ``names`` (default
    :func:`aligned_names`; pointers: 16-byte aligned; ints: multiples of 16).  Without such a promise
    an ahead-of-time binary loads element by element (no 16-byte copies).  Same for every dtype."""
    del dtype
    index = {name: i for i, (name, _) in enumerate(ARGS)}
    return {(index[n],): [["tt.divisibility", 16]] for n in (aligned_names(vlayout) if names is None else names)}


def aligned(args, vlayout: str = "r", names=None) -> bool:
    """Whether packed arguments (pointers as ints) keep the promise :func:`attrs` made: a binary built
    with it may only be launched when this is True (otherwise use one built without attrs)."""
    index = {name: i for i, (name, _) in enumerate(ARGS)}
    return all(int(args[index[n]]) % 16 == 0 for n in (aligned_names(vlayout) if names is None else names))


def grid(batch: int, nhead_q: int, max_seqlen_q: int, block_m: int) -> tuple[int, int, int]:
    """Launch grid ``(cdiv(max_seqlen_q, block_m), nhead_q, batch)``.  Any zero: launch nothing."""
    return ((int(max_seqlen_q) + int(block_m) - 1) // int(block_m), int(nhead_q), int(batch))


_I32 = (-(1 << 31), 1 << 31)


def pack_args(*, q, k, v, out, q_strides, k_strides, v_strides, out_strides, nhead_q, nhead_k,
              head_dim_q, head_dim_v, mode="batch", seqlen_q=0, seqlen_k=0, max_seqlen_q=None, max_seqlen_k=None,
              cu_seqlens_q=0, cu_seqlens_k=0, lse=0, lse_strides=None, bias=0, bias_strides=None,
              alibi=0, alibi_strides=None, sm_scale=None, softcap=0.0, dropout_p=0.0, seed=0, offset=0,
              window_left=-1, window_right=-1, bottom_right=True, sink=0, vlayout="r") -> list:
    """The run-time arguments of :func:`fmha_fwd`, in :data:`ARGS` order.

    Pointers (``q``, ``k``, ``v``, ``out``, ``lse``, ``bias``, ``alibi``, ``cu_seqlens_q/k``) are device
    addresses as ints (0 = unused), or any object the launcher accepts; they are passed through.
    Strides are in elements, as tuples over the logical shape of docs/semantics.md:

    * batch mode: ``q/k/v/out_strides`` over ``[B, H, S, D]``, ``lse_strides`` over ``[B, Hq, Sq]``;
    * group mode: ``[T, H, D]`` and ``lse_strides`` over ``[Hq, Tq]``;
    * ``bias_strides`` over ``[B|1, Hq|1, Sq, Sk]`` (use stride 0 for a broadcast dim);
    * ``alibi_strides`` over ``[B, Hq]`` (``(0, 1)`` for slopes of shape ``[Hq]``).

    ``seqlen_q/k``: batch-mode lengths (ignored in group mode).  ``max_seqlen_q/k``: group mode's
    maximum lengths (the grid and the dropout index use them); batch mode defaults them to ``seqlen_q/k``.
    ``head_dim_q/v``: the problem's ``Dq``/``Dv`` (<= the kernel's hdim).  ``sm_scale`` defaults to
    ``1/sqrt(Dq)``; ``softcap`` 0 = off (the kernel needs ``> 0`` when built with logits).  ``seed`` is
    taken as uint64 (values >= 2**63 are passed as their int64 twin).  ``offset`` is the Philox base.
    ``window_left/right``: negative = unbounded (so is any width >= ``max_seqlen_q + max_seqlen_k``); a
    causal mask is ``(-1, 0)``.  ``bottom_right``: corner of
    the mask diagonal (``True``: ``i + Sk - Sq``; ``False``: ``i``).  ``sink``: number of sink columns.
    ``vlayout``: ``"r"`` (V's head dim has stride 1) or ``"c"`` (V's key axis has stride 1).

    Raises ``ValueError`` when a unit stride the kernel assumes is not 1, or an i32 value overflows.
    """
    group = mode == "group"
    if mode not in ("batch", "group"):
        raise ValueError(f"mode must be 'batch' or 'group', got {mode!r}")
    nd = 3 if group else 4

    def four(name, st):
        st = tuple(int(x) for x in st)
        if len(st) != nd:
            raise ValueError(f"{name} must have {nd} entries ({'[T, H, D]' if group else '[B, H, S, D]'}), got {st}")
        return (0, st[1], st[0], st[2]) if group else st  # [T, H, D] -> (b, h, s, d)

    qs, ks, vs, os_ = (four(n, s) for n, s in (("q_strides", q_strides), ("k_strides", k_strides),
                                                ("v_strides", v_strides), ("out_strides", out_strides)))
    for name, st in (("q", qs), ("k", ks), ("out", os_)):
        if st[3] != 1:
            raise ValueError(f"{name}'s head-dim stride must be 1, got {st[3]}")
    if vlayout == "r" and vs[3] != 1:
        raise ValueError(f"row-major V (vlayout 'r') needs head-dim stride 1, got {vs[3]}")
    if vlayout == "c" and vs[2] != 1:
        raise ValueError(f"column-major V (vlayout 'c') needs sequence stride 1, got {vs[2]}")
    if vlayout not in ("r", "c"):
        raise ValueError(f"vlayout must be 'r' or 'c', got {vlayout!r}")
    if lse_strides is None:
        ls = (0, 0, 1)
    else:
        ls = tuple(int(x) for x in lse_strides)
        ls = (0,) + ls if group else ls
        if len(ls) != 3 or ls[2] != 1:
            raise ValueError(f"lse_strides must be [B, Hq, Sq] (batch) or [Hq, Tq] (group) with a unit last stride, "
                             f"got {lse_strides}")
    bs = (0, 0, 0, 1) if bias_strides is None else tuple(int(x) for x in bias_strides)
    if len(bs) != 4 or bs[3] != 1:
        raise ValueError(f"bias_strides must be [B|1, Hq|1, Sq, Sk] with a unit last stride, got {bias_strides}")
    al = (0, 1) if alibi_strides is None else tuple(int(x) for x in alibi_strides)
    if len(al) != 2:
        raise ValueError(f"alibi_strides must be (batch, head), got {alibi_strides}")
    if group:
        if max_seqlen_q is None or max_seqlen_k is None:
            raise ValueError("group mode needs max_seqlen_q and max_seqlen_k")
        seqlen_q = seqlen_k = 0
    else:
        max_seqlen_q = seqlen_q if max_seqlen_q is None else max_seqlen_q
        max_seqlen_k = seqlen_k if max_seqlen_k is None else max_seqlen_k
    if not 0 <= int(offset) < 1 << 63:
        raise ValueError(f"offset must be in [0, 2**63), got {offset}")
    ints = [int(seqlen_q), int(seqlen_k), int(max_seqlen_q), int(max_seqlen_k), int(nhead_q), int(nhead_k),
            int(head_dim_q), int(head_dim_v), int(window_left), int(window_right), int(sink),
            *qs, *ks, *vs, *os_, *ls, *bs, *al]
    for x in ints:
        if not _I32[0] <= x < _I32[1]:
            raise ValueError(f"value {x} does not fit the kernel's i32 arguments")
    if nhead_k <= 0 or nhead_q % nhead_k:
        raise ValueError(f"nhead_q ({nhead_q}) must be a multiple of nhead_k ({nhead_k})")
    from .fwd_abi import pack

    return pack([q, k, v, out, lse, bias, alibi, cu_seqlens_q, cu_seqlens_k], False, qs, ks, vs, os_, ls, bs, al,
                int(nhead_q), int(nhead_k), int(head_dim_q), int(head_dim_v), int(seqlen_q), int(seqlen_k),
                int(max_seqlen_q), int(max_seqlen_k), sm_scale, float(softcap), float(dropout_p), seed, int(offset),
                int(window_left), int(window_right), int(bool(bottom_right)), int(sink))


# ------------------------------------------------------------------------------------------------------
# CPU interpreter harness (tests): NumPy arrays through a duck-typed tensor shim, no torch
# ------------------------------------------------------------------------------------------------------

class _Shim:
    """Just enough of a torch tensor for Triton's interpreter (it copies "device" storages to the host
    and back; here both are the same NumPy memory)."""

    def __init__(self, arr, dtype: str):
        self._arr = arr  # keeps the memory alive
        self._ptr = arr.ctypes.data
        self.dtype = dtype

    def data_ptr(self):
        return self._ptr

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return _Shim(self._arr, self.dtype)

    def set_(self, storage, offset, size, stride):
        self._ptr = storage.data_ptr() + int(offset) * self._arr.itemsize
        return self

    def copy_(self, other):
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return tuple(self._arr.shape)

    def stride(self):
        return tuple(s // self._arr.itemsize for s in self._arr.strides)


def bf16_round(x):
    """Float32 values rounded to bfloat16 (round to nearest even), still as float32."""
    import numpy as np

    return _bf16_decode(_bf16_encode(np.asarray(x, dtype=np.float32)))


def _bf16_encode(x):
    import numpy as np

    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r).astype(np.uint16)


def _bf16_decode(b):
    import numpy as np

    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def run_interpreted(q, k, v, *, causal=None, window=None, bias=None, alibi_slopes=None, dropout_p=0.0, seed=0,
                    offset=0, softcap=None, sink=0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    dtype=None, block_m=16, block_n=16, lse=True, vlayout="r", hdim_q=None, hdim_v=None,
                    pad=None, mask_kernel=None, num_splits=0, pipeline="qr_async"):
    """Run :func:`fmha_fwd` on the CPU (``TRITON_INTERPRET=1`` must have been set before triton was
    imported) with the keyword arguments of :func:`fmha_dsl.reference.attention_fwd`.

    Extra knobs: ``dtype`` (``None``: q's dtype, float16 or float32; ``"bf16"``: float32 inputs rounded to
    bf16 and run as bf16), ``block_m``/``block_n``, ``lse`` (store it), ``vlayout`` (``"c"`` copies V into
    a column-major view), ``hdim_q``/``hdim_v`` (the kernel's head-dim bounds, default the problem's),
    ``pad`` (``(pad_s, pad_sk, pad_d, pad_dv)``; default: only the checks the shapes need), ``mask_kernel``
    (force the mask kernel on or off; default: on when a causal mask or window is given), ``num_splits`` (> 0:
    run the split-KV kernel with that many splits, then the combine kernel), ``pipeline`` (``"qr_async_trload"``:
    K/V through tensor descriptors).
    q/k/v may be any strided views whose head dim is contiguous.  Returns ``(out, lse)`` as NumPy arrays
    (``out`` float32 for bf16; ``lse`` None when ``lse`` is False).
    """
    import numpy as np

    from ..reference import _normalize_causal, _normalize_window

    if dtype is None:
        dtype = {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}.get(np.asarray(q).dtype)
        if dtype is None:
            raise ValueError(f"q must be float16 or float32 (or pass dtype='bf16'), got {np.asarray(q).dtype}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be fp16, bf16 or fp32, got {dtype!r}")
    npdt = {"fp16": np.float16, "fp32": np.float32, "bf16": np.uint16}[dtype]
    tname = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16"}[dtype]

    def prep(x, contig_axis=-1):
        x = np.asarray(x)
        if dtype == "bf16":
            x = _bf16_encode(np.asarray(x, dtype=np.float32))
        else:
            x = x.astype(npdt, copy=False)
        if x.strides[contig_axis] != x.itemsize:
            x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, contig_axis, -1)), -1, contig_axis)
        return x

    group = cu_seqlens_q is not None
    qa, ka = prep(q), prep(k)
    seq_axis = 0 if group else -2
    va = prep(v, seq_axis if vlayout == "c" else -1)
    if group:
        cq = np.ascontiguousarray(cu_seqlens_q, dtype=np.int32)
        ckk = np.ascontiguousarray(cu_seqlens_k, dtype=np.int32)
        B = cq.shape[0] - 1
        Tq, Hq, Dq = qa.shape
        _, Hk, _ = ka.shape
        Dv = va.shape[-1]
        lens_q, lens_k = np.diff(cq), np.diff(ckk)
        sq_max = int(lens_q.max()) if B else 0
        sk_max = int(lens_k.max()) if B else 0
        out_shape, lse_shape = (Tq, Hq, Dv), (Hq, Tq)
        seqlen_q = seqlen_k = 0
    else:
        B, Hq, sq_max, Dq = qa.shape
        _, Hk, sk_max, _ = ka.shape
        Dv = va.shape[-1]
        out_shape, lse_shape = (B, Hq, sq_max, Dv), (B, Hq, sq_max)
        seqlen_q, seqlen_k = sq_max, sk_max
        cq = ckk = np.zeros(1, np.int32)

    nan = np.uint16(0x7FC0) if dtype == "bf16" else np.nan
    out = np.full(out_shape, nan, dtype=npdt)
    lse_arr = np.full(lse_shape, np.nan, dtype=np.float32)

    mode = _normalize_causal(causal)
    win = _normalize_window(window)
    mask_none = mode is None and (win is None or (win[0] < 0 and win[1] < 0))
    left, right = win if win is not None else (-1, 0)
    if mode is not None:
        right = 0
    bottom_right = mode != "top_left"
    use_mask = (not mask_none) if mask_kernel is None else bool(mask_kernel)
    if mask_none:
        left, right = -1, -1

    def el(a, unit=-1):
        # element strides; a size-1 (or empty) dim's stride is meaningless in NumPy: normalise it
        unit %= a.ndim
        empty = a.size == 0
        return tuple((1 if i == unit else 0) if (empty or n == 1) else st // a.itemsize
                     for i, (n, st) in enumerate(zip(a.shape, a.strides)))

    bias_type, b_arr, b_st = 0, np.zeros(1, npdt), (0, 0, 0, 1)
    if bias is not None:
        bias_type = 1
        b_arr = prep(bias)
        b_st = el(b_arr)
    a_arr, a_st = np.zeros(1, np.float32), (0, 1)
    if alibi_slopes is not None:
        if bias is not None:
            raise ValueError("bias and alibi_slopes are exclusive in one kernel")
        bias_type = 2
        a_arr = np.ascontiguousarray(alibi_slopes, dtype=np.float32)
        a_st = (0, 1) if a_arr.ndim == 1 else (a_arr.strides[0] // 4, a_arr.strides[1] // 4)

    if pad is None:
        pad = (int(group or sq_max % block_m != 0), int(group or sk_max % block_n != 0),
               int(hdim_q is not None and hdim_q != Dq), int(hdim_v is not None and hdim_v != Dv))
    hq = Dq if hdim_q is None else hdim_q
    hv = Dv if hdim_v is None else hdim_v
    sig = {"dtype": dtype, "mode": "group" if group else "batch", "vlayout": vlayout, "hdim_q": hq, "hdim_v": hv,
           "mask": "top_left" if use_mask else "no", "bias": {0: "no", 1: "bias", 2: "alibi"}[bias_type],
           "lse": bool(lse), "dropout": dropout_p > 0, "logits": softcap is not None, "sink": sink > 0}
    alg = {"tile": (block_m, block_n, 0, 0, 0, 0), "pipeline": pipeline, "pad_s": pad[0], "pad_sk": pad[1],
           "pad_d": pad[2], "pad_dv": pad[3]}
    if num_splits:
        sig["family"] = "fwd_splitkv"
    const = constexprs(sig, alg)
    const["UPCAST_DOT"] = dtype == "bf16"

    from .fwd_abi import grid_of

    g = grid_of(const["PACK_GQA"], B, Hq, Hk, sq_max, block_m)
    if min(g) == 0:  # nothing to compute (and empty arrays have meaningless strides)
        return (_bf16_decode(out) if dtype == "bf16" else out), (lse_arr if lse else None)
    args = pack_args(
        q=_Shim(qa, tname), k=_Shim(ka, tname), v=_Shim(va, tname), out=_Shim(out, tname),
        q_strides=el(qa), k_strides=el(ka), v_strides=el(va, seq_axis if vlayout == "c" else -1),
        out_strides=el(out),
        nhead_q=Hq, nhead_k=Hk, head_dim_q=Dq, head_dim_v=Dv, mode="group" if group else "batch",
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, max_seqlen_q=sq_max, max_seqlen_k=sk_max,
        cu_seqlens_q=_Shim(cq, "int32"), cu_seqlens_k=_Shim(ckk, "int32"),
        lse=_Shim(lse_arr, "float32"), lse_strides=el(lse_arr), bias=_Shim(b_arr, tname), bias_strides=b_st,
        alibi=_Shim(a_arr, "float32"), alibi_strides=a_st, sm_scale=scale,
        softcap=0.0 if softcap is None else float(softcap), dropout_p=float(dropout_p), seed=seed, offset=offset,
        window_left=left, window_right=right, bottom_right=bottom_right, sink=int(sink), vlayout=vlayout)
    if num_splits:
        _run_split_interpreted(args, const, g, int(num_splits), sq_max, Dv, Hk)
    else:
        fmha_fwd[g](*args, **const)
    if dtype == "bf16":
        out = _bf16_decode(out)
    return out, (lse_arr if lse else None)


_ARG_AT = {name: i for i, (name, _) in enumerate(ARGS)}


def _run_split_interpreted(args, const, g, splits, msq, dv, nhk):
    """Split kernel into NaN-filled fp32 workspaces, then the combine kernel into the arguments' ``Out``/``Lse``."""
    import numpy as np

    from . import triton_combine as C
    from .fwd_abi import grid_of, split_args, workspace_strides

    batch = g[2]
    nhq = args[_ARG_AT["nhead_q"]]
    ws = np.full((batch, nhq * splits, msq, dv), np.nan, np.float32)
    lws = np.full((batch, nhq * splits, msq), np.nan, np.float32)
    wst, lst = workspace_strides(batch, nhq, splits, msq, dv)
    sargs, cargs = split_args(args, _Shim(ws, "float32"), _Shim(lws, "float32"), wst, lst, nhq, splits)
    fmha_fwd[grid_of(const["PACK_GQA"], batch, nhq, nhk, msq, const["BLOCK_M"], splits)](*sargs, **const)
    cconst = C.constexprs({"hdim_v": dv, "mode": "group" if const["IS_GROUP"] else "batch",
                           "lse": const["STORE_LSE"]})
    C.fmha_fwd_combine[grid(batch, nhq, msq, cconst["BLOCK_M"])](*cargs, **cconst)
