"""[kernels] The Triton template of append-KV (``fwd_appendkv``): new K/V rows into a paged or contiguous cache, RoPE.

``fmha_appendkv`` writes each sequence's new rows after its cached tokens -- through vLLM's block table or SGLang's
indptr/indices into a linear or vectorized paged cache (the addressing of :mod:`.triton_paged`), or into a
contiguous ``[B, capacity, Hk, D]`` cache --
applying RoPE (interleaved or half-rotated, fp32 cos/sin tables) to the new K and, in the same launch, to Q in place.
It computes :func:`fmha_dsl.reference_paged.append_kv` (docs/semantics.md, "Paged KV cache and append-KV"); rows that
would land outside the table, the cache or the rotary tables are not written.  FP8 caches (``FP8``): bf16 new rows
(and q), each K/V row quantized into the e4m3 cache by its descale -- per tensor, or its page's and head's with KV
block scales (the descale strides tell; :mod:`.paged_abi`).

API: ``fmha_appendkv`` (parameters: :data:`fmha_dsl.kernels.paged_abi.APPEND_ARGS` in order, then
:data:`CONSTEXPRS`) and ``constexprs(sig, alg)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fwd_abi import block_d
from .paged_abi import APPEND_ARGS, APPEND_BLOCK_M, DTYPES, FP8_DTYPES, LOOKUPS, ROPES, kv_vec, page_size, qscales_of
from .triton_paged_rows import _table

__all__ = ["fmha_appendkv", "CONSTEXPRS", "constexprs"]


@triton.jit
def _rotate(X, rows, offs_d, d_ok, cos_rows, sin_rows, p_ok, rotary_half, ROPE: tl.constexpr):
    """Rows ``X + rows`` (``[BLOCK_M, BLOCK_D]``) in fp32 with RoPE applied to their first ``2 * rotary_half`` dims:
    pairs ``(2i, 2i + 1)`` (ROPE 1, interleaved) or ``(i, i + rotary_half)`` (ROPE 2, half-rotated)."""
    ok = p_ok[:, None] & d_ok[None, :]
    x = tl.load(X + rows[:, None] + offs_d[None, :], mask=ok, other=0.0).to(tl.float32)
    if ROPE != 0:
        rd = 2 * rotary_half
        if ROPE == 1:
            i = offs_d // 2
            mate = offs_d ^ 1
            sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
        else:
            i = tl.where(offs_d < rotary_half, offs_d, offs_d - rotary_half)
            mate = tl.where(offs_d < rotary_half, offs_d + rotary_half, offs_d - rotary_half)
            sign = tl.where(offs_d < rotary_half, -1.0, 1.0)
        r_ok = p_ok[:, None] & (offs_d < rd)[None, :]
        c = tl.load(cos_rows[:, None] + i[None, :], mask=r_ok, other=1.0)
        s = tl.load(sin_rows[:, None] + i[None, :], mask=r_ok, other=0.0)
        y = tl.load(X + rows[:, None] + mate[None, :], mask=r_ok, other=0.0).to(tl.float32)
        x = x * c + sign[None, :] * y * s
    return x


@triton.jit
def _round_e4m3(x):
    """fp32 ``x`` (``|x| <= 448``) rounded to e4m3's grid, ties to even, in fp32 arithmetic: the spacing at ``x``'s
    exponent is ``2^(e - 3)`` (3 mantissa bits; ``2^-9`` below e4m3's smallest normal), and adding then subtracting
    ``1.5 * 2^23`` spacings rounds to a multiple of it; ``x``'s sign bit is put back (a negative value that rounds to
    zero is -0, as torch stores it; NaN stays NaN).  Explicit so that every target (and Triton's interpreter, whose
    fp32 -> fp8 cast rounds ties away and drops the carry into the exponent) stores the same bytes."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    step = ((e + 124) << 23).to(tl.float32, bitcast=True)
    big = step * 12582912.0
    r = (x + big) - big
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def _stored(x, Dst, descale, FP8: tl.constexpr):
    """fp32 rows ``x`` as ``Dst``'s elements: FP8 -- ``e4m3(clamp(x / descale, -448, 448))`` (IEEE division, round to
    nearest even: the value attention's ``x_e4m3 * descale`` comes back to; ``descale``: each row's, ``[BLOCK_M]``);
    else a plain conversion."""
    if FP8:
        x = _round_e4m3(tl.clamp(tl.div_rn(x, descale[:, None]), -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL))
    return x.to(Dst.dtype.element_ty)


@triton.jit
def fmha_appendkv(Q, K, V, Knew, Vnew, Cos, Sin, cu_seqlens_new, seqlens_k, Table, kv_indptr, k_descale, v_descale,
                  max_seqlen_new, nhead_q, nhead_k, head_dim_q, head_dim_v, rotary_half, max_position,
                  num_pages, table_width, stride_qm, stride_qh, stride_kp, stride_ks, stride_kh,
                  stride_vp, stride_vs, stride_vh, stride_knm, stride_knh, stride_vnm, stride_vnh,
                  stride_cos, stride_tb, stride_kdp, stride_kdh, stride_vdp, stride_vdh,
                  BLOCK_M: tl.constexpr, BLOCK_DMODEL: tl.constexpr, BLOCK_DV: tl.constexpr, ROPE: tl.constexpr,
                  PAGE_SIZE: tl.constexpr, LOOKUP: tl.constexpr, KV_VEC: tl.constexpr, FP8: tl.constexpr):
    pid_m = tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    n_start = tl.load(cu_seqlens_new + off_b)
    n_new = tl.load(cu_seqlens_new + off_b + 1) - n_start
    start_m = pid_m * BLOCK_M
    if start_m >= n_new:
        return
    cached = tl.load(seqlens_k + off_b)
    offs_t = start_m + tl.arange(0, BLOCK_M)
    t_ok = offs_t < n_new
    pos = cached + offs_t                           # each new row's position in its sequence
    p_ok = t_ok & (pos >= 0) & (pos < max_position)  # rows the rotary tables cover
    if ROPE == 0:
        p_ok = t_ok
    pos_c = tl.minimum(tl.maximum(pos, 0), tl.maximum(max_position - 1, 0))
    cos_rows = Cos + pos_c.to(tl.int64) * stride_cos
    sin_rows = Sin + pos_c.to(tl.int64) * stride_cos
    tok = (n_start + offs_t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_DMODEL)
    if off_h >= nhead_k:  # Q's heads: rotate in place
        hq = off_h - nhead_k
        rows = tok * stride_qm + hq * stride_qh
        d_ok = offs_d < head_dim_q
        x = _rotate(Q, rows, offs_d, d_ok, cos_rows, sin_rows, p_ok, rotary_half, ROPE)
        tl.store(Q + rows[:, None] + offs_d[None, :], x.to(Q.dtype.element_ty), mask=p_ok[:, None] & d_ok[None, :])
    else:
        # where each row goes: page and slot (rows outside the table or the cache are not written)
        if LOOKUP == 2:  # contiguous cache [B, capacity, Hk, D]: the sequence is its page
            w_ok = p_ok & (pos >= 0) & (pos < table_width)
            page = (offs_t * 0 + off_b).to(tl.int64)
            slot = pos
        else:
            tb, n_tab = _table(kv_indptr, off_b, stride_tb, table_width, LOOKUP)
            idx = pos // PAGE_SIZE
            w_ok = p_ok & (pos >= 0) & (idx < n_tab)
            page = tl.load(Table + tb + idx, mask=w_ok, other=0)
            w_ok = w_ok & (page >= 0) & (page < num_pages)
            page = page.to(tl.int64)
            slot = pos % PAGE_SIZE
        d_ok = offs_d < head_dim_q
        krows = tok * stride_knm + off_h * stride_knh
        x = _rotate(Knew, krows, offs_d, d_ok, cos_rows, sin_rows, p_ok, rotary_half, ROPE)
        offs_dv = tl.arange(0, BLOCK_DV)
        dv_ok = offs_dv < head_dim_v
        slot = slot.to(tl.int64)
        if KV_VEC:  # the vectorized layout (paged_abi): K [P, Hk, D / VEC, page, VEC], V [P, Hk, page / VEC, D, VEC]
            dst = page * stride_kp + slot * KV_VEC + off_h * stride_kh
            k_cols = (offs_d // KV_VEC) * stride_ks + offs_d % KV_VEC
            vdst = page * stride_vp + (slot // KV_VEC) * stride_vs + slot % KV_VEC + off_h * stride_vh
            v_cols = offs_dv * KV_VEC
        else:
            dst = page * stride_kp + slot * stride_ks + off_h * stride_kh
            k_cols = offs_d
            vdst = page * stride_vp + slot * stride_vs + off_h * stride_vh
            v_cols = offs_dv
        kd = 1.0
        vd = 1.0
        if FP8:  # each row's descales: the one element (strides 0), or its page's and head's (KV block scales)
            kd = tl.load(k_descale + page * stride_kdp + off_h * stride_kdh, mask=w_ok, other=1.0)
            vd = tl.load(v_descale + page * stride_vdp + off_h * stride_vdh, mask=w_ok, other=1.0)
        tl.store(K + dst[:, None] + k_cols[None, :], _stored(x, K, kd, FP8), mask=w_ok[:, None] & d_ok[None, :])
        vals = tl.load(Vnew + (tok * stride_vnm + off_h * stride_vnh)[:, None] + offs_dv[None, :],
                       mask=w_ok[:, None] & dv_ok[None, :])
        if FP8:
            vals = _stored(vals.to(tl.float32), V, vd, FP8)
        tl.store(V + vdst[:, None] + v_cols[None, :], vals, mask=w_ok[:, None] & dv_ok[None, :])


CONSTEXPRS: tuple[str, ...] = ("BLOCK_M", "BLOCK_DMODEL", "BLOCK_DV", "ROPE", "PAGE_SIZE", "LOOKUP", "KV_VEC", "FP8")


def _check_names():
    import inspect

    params = list(inspect.signature(fmha_appendkv.fn).parameters)
    want = [n for n, _ in APPEND_ARGS] + list(CONSTEXPRS)
    assert params == want, f"fmha_appendkv parameters drifted from its ABI:\n{params}\n{want}"


_check_names()


def constexprs(sig: dict, alg: dict | None = None) -> dict:
    """Constexpr values of a ``fwd_appendkv`` key: the head dims' blocks, the rope kind, the table's lookup and page
    size (``paged_kv(false)``: a contiguous cache)."""
    if sig.get("family", "fwd_appendkv") != "fwd_appendkv":
        raise ValueError(f"the triton append-KV template does not implement family={sig['family']!r}")
    dtype = sig.get("dtype", "fp16")
    if dtype not in DTYPES and dtype not in FP8_DTYPES:
        raise ValueError(f"the triton append-KV template takes dtype fp16, bf16, fp32 or fp8bf16, not {dtype!r}")
    if sig.get("qscale", "no") not in qscales_of(dtype, "fwd_appendkv"):
        kinds = " | ".join(qscales_of("fp8bf16", "fwd_appendkv"))
        raise ValueError(f"the triton append-KV template takes qscale={kinds} with FP8 (fp8bf16) and no qscale "
                         f"otherwise, not {sig.get('qscale')!r} with {dtype}")
    hq, hv = int(sig["hdim_q"]), int(sig["hdim_v"])
    if not (1 <= hq <= 256 and 1 <= hv <= 256):
        raise ValueError(f"head dims must be in 1..256, got {hq}, {hv}")
    rope = sig.get("rope", "none")
    if rope not in ROPES:
        raise ValueError(f"unknown rope {rope!r} (none, inter, half)")
    lookup = "contiguous" if not sig.get("paged_kv", True) else sig.get("kv_lookup", "vllm")
    if lookup == "contiguous" and sig.get("kv_layout", "linear") != "linear":
        raise ValueError("a contiguous cache ([B, capacity, Hk, D]) has the linear layout only")
    return {"BLOCK_M": APPEND_BLOCK_M, "BLOCK_DMODEL": block_d(hq), "BLOCK_DV": block_d(hv),
            "ROPE": ROPES[rope], "PAGE_SIZE": page_size(sig) if lookup != "contiguous" else 1,
            "LOOKUP": LOOKUPS[lookup], "KV_VEC": kv_vec(sig), "FP8": dtype in FP8_DTYPES}
