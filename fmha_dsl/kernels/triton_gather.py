"""[kernels] The Triton template of the gathered route's copy (``kv_gather``): paged K/V rows into contiguous K/V.

``fmha_kv_gather`` copies each sequence's cached tokens -- the rows the paged kernel would read: the first
``min(seqlens_k[b], table length x PAGE_SIZE)``, through vLLM's block table or SGLang's indptr/indices, from a
linear or CK's vectorized cache, every page id clamped into the cache -- to ``Kout [rows, Hk, D]`` /
``Vout [rows, Hk, Dv]``, sequence ``b`` starting at row ``cu_seqlens_k[b]`` (the sum of the earlier sequences'
rows, which it also writes).  The forward family's group-mode kernels then attend over them
(:class:`fmha_dsl.runtime.plan_gather.GatheredPlan`): attention over a paged cache at the forward's speed, for one
copy of the batch's K/V (:mod:`fmha_dsl.kernels.paged_abi`, "the gathered route").

API: ``fmha_kv_gather`` (parameters: :data:`fmha_dsl.kernels.paged_abi.GATHER_ARGS` in order, then
:data:`CONSTEXPRS`) and ``constexprs(sig, alg)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fwd_abi import block_d
from .paged_abi import DTYPES, GATHER_ARGS, GATHER_BLOCK_M, LOOKUPS, kv_vec, page_size
from .triton_paged_rows import _page, _slots, _table

__all__ = ["fmha_kv_gather", "CONSTEXPRS", "constexprs"]

BLOCK_B = 256   # sequence lengths summed per step of a program's prefix sum


@triton.jit
def _kept(seqlens_k, kv_indptr, i, ok, table_width, PAGE_SIZE: tl.constexpr, LOOKUP: tl.constexpr):
    """The rows of sequences ``i`` (where ``ok``) the paged kernel reads: ``seqlens_k`` within the table, >= 0."""
    n = tl.load(seqlens_k + i, mask=ok, other=0)
    if LOOKUP == 0:
        n_tab = table_width
    else:
        n_tab = tl.load(kv_indptr + i + 1, mask=ok, other=0) - tl.load(kv_indptr + i, mask=ok, other=0)
    return tl.maximum(tl.minimum(n, n_tab * PAGE_SIZE), 0)


@triton.jit
def _copy(Src, Dst, page_base, slot, rows_ok, offs_d, stride_s, dst_rows,
          HEAD_DIM: tl.constexpr, VEC: tl.constexpr, SLOT_MAJOR: tl.constexpr):
    """Rows ``[BLOCK_M, BLOCK_D]`` from the cache (``page_base`` per row, int64) to ``Dst + dst_rows``.  Linear layout
    (``VEC`` 0): ``slot * stride_s + d``.  Vectorized: K (``SLOT_MAJOR`` False) ``(d / VEC) * stride_s + slot * VEC +
    d % VEC``; V (True) ``(slot / VEC) * stride_s + d * VEC + slot % VEC``."""
    if VEC == 0:
        cols = _slots(slot, stride_s, 0)[:, None] + offs_d[None, :]
    elif SLOT_MAJOR:
        cols = _slots(slot, stride_s, VEC)[:, None] + (offs_d * VEC)[None, :]
    else:
        cols = (slot * VEC)[:, None] + ((offs_d // VEC) * stride_s + offs_d % VEC)[None, :]
    ok = rows_ok[:, None] & (offs_d < HEAD_DIM)[None, :]  # a constant bound: 16-byte vectors along d
    x = tl.load(Src + page_base[:, None] + cols, mask=ok, other=0.0)
    tl.store(Dst + dst_rows[:, None] + offs_d[None, :], x, mask=ok)


@triton.jit
def fmha_kv_gather(K, V, Kout, Vout, seqlens_k, Table, kv_indptr, cu_seqlens_k,
                   batch, nhead_k, num_pages, table_width,
                   stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_tb,
                   BLOCK_M: tl.constexpr, BLOCK_DMODEL: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_B: tl.constexpr,
                   HEAD_DIM_Q: tl.constexpr, HEAD_DIM_V: tl.constexpr, PAGE_SIZE: tl.constexpr, LOOKUP: tl.constexpr,
                   KV_VEC: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    start = off_b * 0
    for i0 in range(0, off_b, BLOCK_B):  # this sequence's first row: the earlier sequences' rows
        i = i0 + tl.arange(0, BLOCK_B)
        start += tl.sum(_kept(seqlens_k, kv_indptr, i, i < off_b, table_width, PAGE_SIZE, LOOKUP))
    seqlen_k = tl.sum(_kept(seqlens_k, kv_indptr, off_b + tl.arange(0, 1), tl.arange(0, 1) < 1, table_width,
                            PAGE_SIZE, LOOKUP))
    if (pid_m == 0) & (off_h == 0):
        tl.store(cu_seqlens_k + off_b + 1, start + seqlen_k)
        if off_b == 0:
            tl.store(cu_seqlens_k, start)
    t = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if pid_m * BLOCK_M >= seqlen_k:
        return
    rows_ok = t < seqlen_k
    tb, _ = _table(kv_indptr, off_b, stride_tb, table_width, LOOKUP)
    page = tl.load(Table + tb + t // PAGE_SIZE, mask=rows_ok, other=0)
    page = _page(page, num_pages).to(tl.int64)  # never outside the cache
    slot = t % PAGE_SIZE
    dst = (start + t).to(tl.int64) * nhead_k + off_h
    _copy(K + off_h.to(tl.int64) * stride_kh, Kout, page * stride_kp, slot, rows_ok, tl.arange(0, BLOCK_DMODEL),
          stride_ks, dst * HEAD_DIM_Q, HEAD_DIM_Q, KV_VEC, False)
    _copy(V + off_h.to(tl.int64) * stride_vh, Vout, page * stride_vp, slot, rows_ok, tl.arange(0, BLOCK_DV),
          stride_vs, dst * HEAD_DIM_V, HEAD_DIM_V, KV_VEC, True)


CONSTEXPRS = ("BLOCK_M", "BLOCK_DMODEL", "BLOCK_DV", "BLOCK_B", "HEAD_DIM_Q", "HEAD_DIM_V", "PAGE_SIZE", "LOOKUP",
              "KV_VEC")


def constexprs(sig: dict, alg: dict | None = None) -> dict:
    """Constexpr values of a ``kv_gather`` signature (:data:`fmha_dsl.kernels.paged_abi.GATHER_FIELDS`)."""
    if sig.get("family", "kv_gather") != "kv_gather":
        raise ValueError(f"the triton gather template does not implement family={sig['family']!r}")
    if sig.get("dtype", "fp16") not in DTYPES:
        raise ValueError(f"the triton gather template takes dtype fp16, bf16 or fp32, not {sig.get('dtype')!r}")
    hq, hv = int(sig["hdim_q"]), int(sig["hdim_v"])
    if not (1 <= hq <= 256 and 1 <= hv <= 256):
        raise ValueError(f"head dims must be in 1..256, got {hq}, {hv}")
    return {"BLOCK_M": GATHER_BLOCK_M, "BLOCK_DMODEL": block_d(hq), "BLOCK_DV": block_d(hv), "BLOCK_B": BLOCK_B,
            "HEAD_DIM_Q": hq, "HEAD_DIM_V": hv, "PAGE_SIZE": page_size(sig),
            "LOOKUP": LOOKUPS[sig.get("kv_lookup", "vllm")], "KV_VEC": kv_vec(sig)}


def _check_names():
    import inspect

    params = list(inspect.signature(fmha_kv_gather.fn).parameters)
    want = [n for n, _ in GATHER_ARGS] + list(CONSTEXPRS)
    assert params == want, f"fmha_kv_gather parameters drifted from its ABI:\n{params}\n{want}"


_check_names()
