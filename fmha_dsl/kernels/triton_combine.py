"""[kernels] The split-KV combine kernel: reduce the per-split partial outputs into O (and the LSE).

The split kernel (``triton_fwd.fmha_fwd`` with ``SPLIT``) leaves, for every split ``s`` of the key axis, the
normalised partial output ``O_s`` and its log-sum-exp ``lse_s`` in fp32 workspaces.  The exact result is

    lse = log(sum_s exp(lse_s)),     O = sum_s exp(lse_s - lse) * O_s

computed here in one pass over the splits, 16 at a time (``COMBINE_BLOCK_S``, in 2 warps), with a running maximum
(so no split's ``exp`` overflows). A split that saw no allowed key has ``lse_s = -inf`` and weight 0; a row no split
saw gives ``O = 0``, ``lse = -inf`` (docs/semantics.md). Run-time parameters:
:data:`fmha_dsl.kernels.fwd_abi.COMBINE_ARGS`.

``WAIT_PRIOR`` (archs with programmatic dependent launch, set by the build): the kernel starts with
``griddepcontrol.wait``, so the runtime may launch it to overlap the split kernel's end -- its programs are placed
while the split kernel's last ones run and read the partials once all of them are written (about 1 us less per
decode call on an H200; docs/benchmarks.md).  Without that launch attribute the wait returns at once.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .fwd_abi import COMBINE_ARGS, COMBINE_BLOCK_M, COMBINE_BLOCK_S, block_d
from .triton_steps import _sequence

__all__ = ["fmha_fwd_combine", "COMBINE_CONSTEXPRS", "signature", "constexprs"]


@triton.jit
def fmha_fwd_combine(Ows, Lws, Out, Lse, cu_seqlens_q, seqlen_q, nhead_q, num_splits, head_dim_v,
                     stride_wb, stride_wh, stride_wm, stride_xb, stride_xh,
                     stride_ob, stride_oh, stride_om, stride_lb, stride_lh, stride_lm,
                     BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, IS_GROUP: tl.constexpr,
                     STORE_LSE: tl.constexpr, WAIT_PRIOR: tl.constexpr):
    if WAIT_PRIOR:  # before the first read: the partials are the split kernel's writes
        gdc_wait()
    # one query row per program (BLOCK_M = 1); its splits are read BLOCK_S at a time, so that a chunk's loads are
    # in flight together (a loop over single splits would wait one memory latency per split)
    row = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    q_start, seqlen_q, b = _sequence(cu_seqlens_q, off_b, seqlen_q, IS_GROUP)
    bo = b * stride_ob
    bl = b * stride_lb
    if row >= seqlen_q:
        return
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < head_dim_v  # memory-bound: the head-dim check costs nothing
    w_base = Ows + off_b.to(tl.int64) * stride_wb + row.to(tl.int64) * stride_wm
    x_base = Lws + off_b.to(tl.int64) * stride_xb + row
    m_i = tl.full([1], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        sp = s0 + offs_s
        s_ok = sp < num_splits
        h2 = (off_h * num_splits + sp).to(tl.int64)
        lse_s = tl.load(x_base + h2 * stride_xh, mask=s_ok, other=float("-inf"))
        o_s = tl.load(w_base + h2[:, None] * stride_wh + offs_dv[None, :], mask=s_ok[:, None] & dv_ok[None, :],
                      other=0.0)
        m_new = tl.maximum(m_i, tl.max(lse_s, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        w = tl.exp(lse_s - m_use)
        l_i = l_i * alpha + tl.sum(w, 0)
        acc = acc * alpha + tl.sum(w[:, None] * o_s, 0)
        m_i = m_new
    live = l_i > 0.0
    inv = tl.where(live, 1.0 / tl.where(live, l_i, 1.0), 0.0)
    out = acc * inv
    o_ptrs = Out + bo + off_h.to(tl.int64) * stride_oh + (q_start + row).to(tl.int64) * stride_om + offs_dv
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=dv_ok)
    if STORE_LSE:
        lse = tl.where(live, m_i + tl.log(tl.where(live, l_i, 1.0)), float("-inf"))
        l_ptrs = Lse + bl + off_h.to(tl.int64) * stride_lh + (q_start + row).to(tl.int64) * stride_lm
        tl.store(l_ptrs + tl.arange(0, 1), lse)


COMBINE_CONSTEXPRS: tuple[str, ...] = ("BLOCK_M", "BLOCK_S", "BLOCK_DV", "IS_GROUP", "STORE_LSE", "WAIT_PRIOR")


def signature(dtype: str) -> dict[str, str]:
    """The ``ASTSource`` signature of the combine kernel for output dtype ``fp16`` | ``bf16`` | ``fp32``."""
    sig = {name: ty.format(dtype=dtype) for name, ty in COMBINE_ARGS}
    sig.update({name: "constexpr" for name in COMBINE_CONSTEXPRS})
    return sig


def constexprs(sig: dict, alg: dict | None = None) -> dict:
    """Constexprs of the combine kernel that goes with a split-KV key's signature fields (``alg``: unused, as every
    template's ``constexprs`` takes it).  ``WAIT_PRIOR`` is False here; the build sets it for archs with
    programmatic dependent launch (:func:`fmha_dsl.compile_triton.compile_companion`)."""
    return {"BLOCK_M": COMBINE_BLOCK_M, "BLOCK_S": COMBINE_BLOCK_S, "BLOCK_DV": block_d(int(sig["hdim_v"])),
            "IS_GROUP": sig.get("mode", "batch") == "group", "STORE_LSE": bool(sig.get("lse", False)),
            "WAIT_PRIOR": False}

