"""[kernels] The Triton backward's small stages around its main kernel (:mod:`.triton_bwd`): ``fmha_bwd_dot_do_o``
(``D = rowsum(dO * O)`` per query row and the LSE in log2 units, before) and ``fmha_bwd_convert_dq`` (the fp32 dQ accumulator -- in the
deterministic mode the key blocks' partial sums, added in a fixed order -- scaled and converted to dQ's dtype, after).  Their
run-time arguments: :data:`fmha_dsl.kernels.bwd_abi.DOT_ARGS` / :data:`~fmha_dsl.kernels.bwd_abi.CONVERT_ARGS`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_steps import _load, _sequence

__all__ = ["fmha_bwd_dot_do_o", "fmha_bwd_convert_dq"]


@triton.jit
def fmha_bwd_dot_do_o(O, dO, Lse, D, L2, cu_seqlens_q, seqlen_q, head_dim_v,
                      stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_lb, stride_lh,
                      stride_db, stride_dh,
                      BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, IS_GROUP: tl.constexpr,
                      CHECK_DV: tl.constexpr, PAD_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    q_start, seqlen_q, b = _sequence(cu_seqlens_q, off_b, seqlen_q, IS_GROUP)
    bo = b * stride_ob
    bdo = b * stride_dob
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < seqlen_q
    if PAD_DV:  # the run-time head dim; else the key's, a constant (16-byte vector loads of whole rows)
        d_ok = offs_d < head_dim_v
    else:
        d_ok = offs_d < HEAD_DIM_V
    rows = (q_start + offs_m).to(tl.int64)
    o = _load(O + bo + off_h.to(tl.int64) * stride_oh + rows[:, None] * stride_om + offs_d[None, :],
              m_ok[:, None], d_ok[None, :], True, CHECK_DV)
    do = _load(dO + bdo + off_h.to(tl.int64) * stride_doh + rows[:, None] * stride_dom + offs_d[None, :],
               m_ok[:, None], d_ok[None, :], True, CHECK_DV)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    # the LSE as the main stage's loop uses it: log2 units, +inf for a row that saw no key (its P = exp2(S - L2) = 0)
    lse = tl.load(Lse + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh + rows, mask=m_ok, other=0.0)
    l2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    w = off_b.to(tl.int64) * stride_db + off_h.to(tl.int64) * stride_dh + offs_m
    tl.store(D + w, delta, mask=m_ok)
    tl.store(L2 + w, l2, mask=m_ok)


@triton.jit
def fmha_bwd_convert_dq(DQacc, dQ, cu_seqlens_q, sm_scale, seqlen_q, head_dim_q, num_splits,
                        stride_as, stride_ab, stride_ah, stride_am, stride_qb, stride_qh, stride_qm,
                        BLOCK_M: tl.constexpr, BLOCK_DMODEL: tl.constexpr, IS_GROUP: tl.constexpr,
                        CHECK_D: tl.constexpr, DETERMINISTIC: tl.constexpr, PAD_D: tl.constexpr,
                        HEAD_DIM_Q: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    q_start, seqlen_q, b = _sequence(cu_seqlens_q, off_b, seqlen_q, IS_GROUP)
    bq = b * stride_qb
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DMODEL)
    if not CHECK_D:  # whole rows (16-byte vector accesses)
        ok = (offs_m < seqlen_q)[:, None]
    elif PAD_D:
        ok = (offs_m < seqlen_q)[:, None] & (offs_d < head_dim_q)[None, :]
    else:
        ok = (offs_m < seqlen_q)[:, None] & (offs_d < HEAD_DIM_Q)[None, :]
    a_ptrs = DQacc + off_b.to(tl.int64) * stride_ab + off_h.to(tl.int64) * stride_ah + \
        offs_m[:, None].to(tl.int64) * stride_am + offs_d[None, :]
    dq = tl.load(a_ptrs, mask=ok, other=0.0)
    if DETERMINISTIC:  # the key blocks' partial sums, in a fixed order
        for s in range(1, num_splits):
            dq += tl.load(a_ptrs + s * stride_as, mask=ok, other=0.0)
    q_ptrs = dQ + bq + off_h.to(tl.int64) * stride_qh + (q_start + offs_m)[:, None].to(tl.int64) * stride_qm + \
        offs_d[None, :]
    tl.store(q_ptrs, (dq * sm_scale).to(dQ.dtype.element_ty), mask=ok)  # (the main stage adds dS K unscaled)
