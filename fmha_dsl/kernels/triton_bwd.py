"""[kernels] The Triton backward template: CK's three stages (``bwd_dot_do_o``, ``bwd_dq_dk_dv``, ``bwd_convert_dq``).

The math and the stages' contract: :mod:`fmha_dsl.kernels.bwd_abi` (run-time arguments, grids, workspace) and
:mod:`fmha_dsl.reference_bwd` (the truth).  The main kernel runs one program per (key block, K/V head, batch): it
keeps its K/V tile and the dK/dV accumulators in registers and walks, for each query head of its GQA group, the
query blocks that can see its keys (the mask decides the range), recomputing ``P = exp(S - lse)`` from the forward's
LSE.  Scores are kept transposed (``S^T = K Q^T``: keys along the rows) so that dV and dK accumulate without
transposes.  Masks, windows, sink tokens, bias (with ``dbias``), ALiBi, soft-cap and dropout (the forward's Philox
keep-mask, recomputed from (seed, offset)) are constexpr branches, as in the forward template.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .bwd_abi import ARGS, CONVERT_ARGS, DOT_ARGS, block_d
from .triton_fwd import _dot, _load, _uniform

__all__ = ["fmha_bwd_dot_do_o", "fmha_bwd_dq_dk_dv", "fmha_bwd_convert_dq", "signature", "constexprs",
           "CONSTEXPRS", "DOT_CONSTEXPRS", "CONVERT_CONSTEXPRS", "DTYPES"]

LOG2E = 1.4426950408889634


@triton.jit
def fmha_bwd_dot_do_o(O, dO, D, cu_seqlens_q, seqlen_q, head_dim_v,
                      stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_db, stride_dh,
                      BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, IS_GROUP: tl.constexpr,
                      CHECK_DV: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    if IS_GROUP:
        q_start = tl.load(cu_seqlens_q + off_b)
        seqlen_q = tl.load(cu_seqlens_q + off_b + 1) - q_start
        bo = off_b.to(tl.int64) * 0
        bdo = bo
    else:
        q_start = off_b * 0
        bo = off_b.to(tl.int64) * stride_ob
        bdo = off_b.to(tl.int64) * stride_dob
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < seqlen_q
    d_ok = offs_d < head_dim_v
    rows = (q_start + offs_m).to(tl.int64)
    o = _load(O + bo + off_h.to(tl.int64) * stride_oh + rows[:, None] * stride_om + offs_d[None, :],
              m_ok[:, None], d_ok[None, :], True, CHECK_DV)
    do = _load(dO + bdo + off_h.to(tl.int64) * stride_doh + rows[:, None] * stride_dom + offs_d[None, :],
               m_ok[:, None], d_ok[None, :], True, CHECK_DV)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(D + off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh + offs_m, delta, mask=m_ok)


@triton.jit
def _query_block(dk, dv, k, v, dBias, b_ptr, q_base, do_base, l_base, d_base, acc_base,
                 g_base, start_m, start_n, offs_m0, offs_n, offs_d, offs_dv, seqlen_q, seqlen_k, mask_off,
                 window_left, window_right, sink, stride_qm, stride_dom, stride_am, stride_bm, stride_bn,
                 stride_gm, stride_gn, sm_scale, qk_scale, cap_scale, softcap, slope, dropout_p, seed, rng_base,
                 sk_max, dq_lim, dv_lim,
                 MASK: tl.constexpr, SINK: tl.constexpr, CHECK_M: tl.constexpr, CHECK_N: tl.constexpr,
                 CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr, BIAS_TYPE: tl.constexpr, DBIAS: tl.constexpr,
                 SOFTCAP: tl.constexpr, DROPOUT: tl.constexpr, DETERMINISTIC: tl.constexpr, IEEE: tl.constexpr,
                 UPCAST: tl.constexpr):
    """One query block against this program's key block: ``dk``/``dv`` accumulated (raw: dK is scaled at the end),
    this block's dQ contribution added to (or, deterministic, stored into this key block's split of) ``dq_acc``."""
    offs_m = start_m + offs_m0
    m_ok = offs_m < seqlen_q
    n_ok = (start_n + offs_n) < seqlen_k
    d_ok = offs_d < dq_lim
    dv_ok = offs_dv < dv_lim
    q = _load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :], m_ok[:, None], d_ok[None, :],
              CHECK_M, CHECK_D)
    do = _load(do_base + offs_m[:, None].to(tl.int64) * stride_dom + offs_dv[None, :], m_ok[:, None],
               dv_ok[None, :], CHECK_M, CHECK_DV)
    if CHECK_M:
        lse = tl.load(l_base + offs_m, mask=m_ok, other=float("inf"))
        delta = tl.load(d_base + offs_m, mask=m_ok, other=0.0)
    else:
        lse = tl.load(l_base + offs_m)
        delta = tl.load(d_base + offs_m)
    # a row that saw no allowed key (lse = -inf) has P = 0: exp(s - inf)
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    cols = start_n + offs_n
    # transposed scores: keys along the rows, queries along the columns
    st = _dot(k, tl.trans(q), None, IEEE, UPCAST)        # [BLOCK_N, BLOCK_M]
    if SOFTCAP:
        x = st * cap_scale                               # s / softcap
        e = tl.exp2(tl.abs(x) * (-2.0 * 1.4426950408889634))
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(x < 0, -t, t)                       # tanh(x)
        s = t * (softcap * 1.4426950408889634)
    else:
        s = st * qk_scale                                # log2 units
    if BIAS_TYPE == 1:
        bias = _load(b_ptr + offs_m[None, :].to(tl.int64) * stride_bm + cols[:, None] * stride_bn,
                     n_ok[:, None], m_ok[None, :], CHECK_N, CHECK_M)
        s += bias.to(tl.float32) * 1.4426950408889634
    if BIAS_TYPE == 2:
        rel = offs_m[None, :] + (seqlen_k - seqlen_q) - cols[:, None]
        s -= (slope * 1.4426950408889634) * tl.abs(rel).to(tl.float32)
    if MASK:
        diag = offs_m[None, :] + mask_off
        ok = ((window_left < 0) | (cols[:, None] >= diag - window_left)) & \
             ((window_right < 0) | (cols[:, None] <= diag + window_right))
        if SINK:
            ok = ok | (cols[:, None] < sink)
        if CHECK_N:
            ok = ok & n_ok[:, None]
        s = tl.where(ok, s, float("-inf"))
    elif CHECK_N:
        s = tl.where(n_ok[:, None], s, float("-inf"))
    pt = tl.exp2(s - lse[None, :] * 1.4426950408889634)  # P^T
    if DROPOUT:
        rows64 = rng_base + offs_m.to(tl.int64) * sk_max
        keep = _uniform(seed, rows64.to(tl.uint32), (rows64 >> 32).to(tl.uint32), cols)  # [BLOCK_M, BLOCK_N]
        keep_t = tl.trans(keep) >= dropout_p
        scale_keep = 1.0 / (1.0 - dropout_p)
        zt = tl.where(keep_t, pt * scale_keep, 0.0)
    else:
        zt = pt
    dv = _dot(zt.to(do.dtype), do, dv, IEEE, UPCAST)
    dpt = _dot(v, tl.trans(do), None, IEEE, UPCAST)       # (dO V^T)^T [BLOCK_N, BLOCK_M]
    if DROPOUT:
        dpt = tl.where(keep_t, dpt * scale_keep, 0.0)
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
    dq = _dot(tl.trans(dst_in), k, None, IEEE, UPCAST) * sm_scale  # [BLOCK_M, BLOCK_DMODEL]
    a_ptrs = acc_base + offs_m[:, None].to(tl.int64) * stride_am + offs_d[None, :]
    if DETERMINISTIC:
        if CHECK_M or CHECK_D:
            tl.store(a_ptrs, dq, mask=m_ok[:, None] & d_ok[None, :])
        else:
            tl.store(a_ptrs, dq)
    else:
        if CHECK_M or CHECK_D:
            tl.atomic_add(a_ptrs, dq, mask=m_ok[:, None] & d_ok[None, :], sem="relaxed")
        else:
            tl.atomic_add(a_ptrs, dq, sem="relaxed")
    return dk, dv


@triton.jit
def fmha_bwd_dq_dk_dv(Q, K, V, dO, Lse, D, DQacc, dK, dV, dBias, Bias, Alibi, cu_seqlens_q, cu_seqlens_k,
                      sm_scale, softcap, dropout_p, seed, philox_offset,
                      seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k, nhead_q, nhead_k, head_dim_q, head_dim_v,
                      window_left, window_right, mask_bottom_right, sink,
                      stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                      stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
                      stride_lb, stride_lh, stride_db, stride_dh,
                      stride_as, stride_ab, stride_ah, stride_am,
                      stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                      stride_bb, stride_bh, stride_bm, stride_bn, stride_gb, stride_gh, stride_gm, stride_gn,
                      stride_alb, stride_alh,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DMODEL: tl.constexpr,
                      BLOCK_DV: tl.constexpr, HEAD_DIM_Q: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                      PAD_M: tl.constexpr, PAD_N: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr,
                      CHECK_D: tl.constexpr, CHECK_DV: tl.constexpr, IS_GROUP: tl.constexpr, MASK: tl.constexpr,
                      SINK: tl.constexpr, BIAS_TYPE: tl.constexpr, DBIAS: tl.constexpr, DROPOUT: tl.constexpr,
                      SOFTCAP: tl.constexpr, DETERMINISTIC: tl.constexpr, IEEE: tl.constexpr,
                      UPCAST_DOT: tl.constexpr):
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
        bl = zero
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
        bl = off_b.to(tl.int64) * stride_lb
        bdk = off_b.to(tl.int64) * stride_dkb
        bdv = off_b.to(tl.int64) * stride_dvb
    start_n = pid_n * BLOCK_N
    if start_n >= seqlen_k:
        return
    if PAD_D:
        dq_lim = head_dim_q
    else:
        dq_lim = HEAD_DIM_Q
    if PAD_DV:
        dv_lim = head_dim_v
    else:
        dv_lim = HEAD_DIM_V
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_DMODEL)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_ok = (start_n + offs_n) < seqlen_k
    krow = (k_start + start_n + offs_n).to(tl.int64)
    k = _load(K + bk + off_hk.to(tl.int64) * stride_kh + krow[:, None] * stride_kn + offs_d[None, :],
              n_ok[:, None], offs_d[None, :] < dq_lim, PAD_N, CHECK_D)
    v = _load(V + bv + off_hk.to(tl.int64) * stride_vh + krow[:, None] * stride_vn + offs_dv[None, :],
              n_ok[:, None], offs_dv[None, :] < dv_lim, PAD_N, CHECK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_DMODEL], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    qk_scale = sm_scale * 1.4426950408889634
    cap_scale = sm_scale
    if SOFTCAP:
        cap_scale = sm_scale / softcap
    # the query rows that can see a column of this key block: [q_lo, q_hi)
    mask_off = (seqlen_k - seqlen_q) * mask_bottom_right
    q_lo = start_n * 0
    q_hi = seqlen_q
    if MASK:
        window_left = tl.where(window_left >= seqlen_q + seqlen_k, -1, window_left)
        window_right = tl.where(window_right >= seqlen_q + seqlen_k, -1, window_right)
        sink = tl.maximum(tl.minimum(sink, seqlen_k), 0)
        # row i sees column j when i + mask_off - left <= j <= i + mask_off + right (or j < sink)
        q_lo = tl.where(window_right >= 0, tl.maximum(start_n - mask_off - window_right, 0), 0)
        q_hi = tl.where(window_left >= 0, tl.minimum(start_n + BLOCK_N - mask_off + window_left, seqlen_q),
                        seqlen_q)
        if SINK:  # a key block holding sink columns is seen by every row
            q_lo = tl.where(start_n < sink, 0, q_lo)
            q_hi = tl.where(start_n < sink, seqlen_q, q_hi)
        q_lo = (q_lo // BLOCK_M) * BLOCK_M
    split = pid_n * 0
    if DETERMINISTIC:  # this key block's own dQ partial sum
        split = pid_n
    for i in range(0, group_r):
        off_h = off_hk * group_r + i
        q_base = Q + bq + off_h.to(tl.int64) * stride_qh + q_start.to(tl.int64) * stride_qm
        do_base = dO + bdo + off_h.to(tl.int64) * stride_doh + q_start.to(tl.int64) * stride_dom
        l_base = Lse + bl + off_h.to(tl.int64) * stride_lh + q_start.to(tl.int64)
        d_base = D + off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh
        acc_base = DQacc + split.to(tl.int64) * stride_as + off_b.to(tl.int64) * stride_ab + \
            off_h.to(tl.int64) * stride_ah
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
        for start_m in range(q_lo, q_hi, BLOCK_M):
            start_m = tl.multiple_of(start_m, BLOCK_M)
            dk, dv = _query_block(dk, dv, k, v, dBias, b_ptr, q_base, do_base, l_base,
                                  d_base, acc_base, g_base, start_m, start_n, offs_m0, offs_n, offs_d, offs_dv,
                                  seqlen_q, seqlen_k, mask_off, window_left, window_right, sink, stride_qm,
                                  stride_dom, stride_am, stride_bm, stride_bn, stride_gm, stride_gn, sm_scale,
                                  qk_scale, cap_scale, softcap, slope, dropout_p, seed, rng_base, sk_max,
                                  dq_lim, dv_lim, MASK, SINK, PAD_M, PAD_N, CHECK_D, CHECK_DV, BIAS_TYPE, DBIAS,
                                  SOFTCAP, DROPOUT, DETERMINISTIC, IEEE, UPCAST_DOT)
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


@triton.jit
def fmha_bwd_convert_dq(DQacc, dQ, cu_seqlens_q, seqlen_q, head_dim_q, num_splits,
                        stride_as, stride_ab, stride_ah, stride_am, stride_qb, stride_qh, stride_qm,
                        BLOCK_M: tl.constexpr, BLOCK_DMODEL: tl.constexpr, IS_GROUP: tl.constexpr,
                        CHECK_D: tl.constexpr, DETERMINISTIC: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    if IS_GROUP:
        q_start = tl.load(cu_seqlens_q + off_b)
        seqlen_q = tl.load(cu_seqlens_q + off_b + 1) - q_start
        bq = off_b.to(tl.int64) * 0
    else:
        q_start = off_b * 0
        bq = off_b.to(tl.int64) * stride_qb
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DMODEL)
    ok = (offs_m < seqlen_q)[:, None] & (offs_d < head_dim_q)[None, :]
    a_ptrs = DQacc + off_b.to(tl.int64) * stride_ab + off_h.to(tl.int64) * stride_ah + \
        offs_m[:, None].to(tl.int64) * stride_am + offs_d[None, :]
    dq = tl.load(a_ptrs, mask=ok, other=0.0)
    if DETERMINISTIC:  # the key blocks' partial sums, in a fixed order
        for s in range(1, num_splits):
            dq += tl.load(a_ptrs + s * stride_as, mask=ok, other=0.0)
    q_ptrs = dQ + bq + off_h.to(tl.int64) * stride_qh + (q_start + offs_m)[:, None].to(tl.int64) * stride_qm + \
        offs_d[None, :]
    tl.store(q_ptrs, dq.to(dQ.dtype.element_ty), mask=ok)


# ------------------------------------------------------------------------------------------------------
# host glue for the build, the runtime and the interpreter harness
# ------------------------------------------------------------------------------------------------------

DTYPES = ("fp16", "bf16", "fp32")

DOT_CONSTEXPRS = ("BLOCK_M", "BLOCK_DV", "IS_GROUP", "CHECK_DV")
CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_DMODEL", "BLOCK_DV", "HEAD_DIM_Q", "HEAD_DIM_V",
              "PAD_M", "PAD_N", "PAD_D", "PAD_DV", "CHECK_D", "CHECK_DV", "IS_GROUP", "MASK", "SINK", "BIAS_TYPE",
              "DBIAS", "DROPOUT", "SOFTCAP", "DETERMINISTIC", "IEEE", "UPCAST_DOT")
CONVERT_CONSTEXPRS = ("BLOCK_M", "BLOCK_DMODEL", "IS_GROUP", "CHECK_D", "DETERMINISTIC")

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
        return {"BLOCK_M": DOT_BLOCK_M, "BLOCK_DV": bdv, "IS_GROUP": group, "CHECK_DV": pad_dv or hv != bdv}
    if family == "bwd_convert_dq":
        return {"BLOCK_M": CONVERT_BLOCK_M, "BLOCK_DMODEL": bd, "IS_GROUP": group, "CHECK_D": pad_d or hq != bd,
                "DETERMINISTIC": det}
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
        "UPCAST_DOT": False,
    }
