"""The forward template's run-time parameter list: plain data shared by the template and the runtime.

Kept free of Triton so the runtime (which must not import the compiler) and the template read the same
tuple: ``fmha_fwd``'s non-constexpr parameters in order; ``"*{dtype}"`` is the input dtype's pointer.
"""

from __future__ import annotations

import math

ARGS: tuple[tuple[str, str], ...] = (
    ("Q", "*{dtype}"), ("K", "*{dtype}"), ("V", "*{dtype}"), ("Out", "*{dtype}"), ("Lse", "*fp32"),
    ("Bias", "*{dtype}"), ("Alibi", "*fp32"), ("cu_seqlens_q", "*i32"), ("cu_seqlens_k", "*i32"),
    ("sm_scale", "fp32"), ("softcap", "fp32"), ("dropout_p", "fp32"), ("seed", "i64"), ("philox_offset", "i64"),
    ("seqlen_q", "i32"), ("seqlen_k", "i32"), ("max_seqlen_q", "i32"), ("max_seqlen_k", "i32"),
    ("nhead_q", "i32"), ("nhead_k", "i32"), ("head_dim_q", "i32"), ("head_dim_v", "i32"),
    ("window_left", "i32"), ("window_right", "i32"), ("mask_bottom_right", "i32"), ("sink", "i32"),
    ("stride_qb", "i32"), ("stride_qh", "i32"), ("stride_qm", "i32"), ("stride_qd", "i32"),
    ("stride_kb", "i32"), ("stride_kh", "i32"), ("stride_kn", "i32"), ("stride_kd", "i32"),
    ("stride_vb", "i32"), ("stride_vh", "i32"), ("stride_vn", "i32"), ("stride_vd", "i32"),
    ("stride_ob", "i32"), ("stride_oh", "i32"), ("stride_om", "i32"), ("stride_od", "i32"),
    ("stride_lb", "i32"), ("stride_lh", "i32"), ("stride_lm", "i32"),
    ("stride_bb", "i32"), ("stride_bh", "i32"), ("stride_bm", "i32"), ("stride_bn", "i32"),
    ("stride_ab", "i32"), ("stride_ah", "i32"),
)

# Arguments that are multiples of 16 (bytes for pointers, elements for strides) in the usual case:
# 16-byte aligned base pointers and head dims that are multiples of 16.  V's non-unit stride is added
# per layout (aligned_names).  See fwd_host.attrs() / aligned().
ALIGNED: tuple[str, ...] = (
    "Q", "K", "V", "Out",
    "stride_qb", "stride_qh", "stride_qm", "stride_kb", "stride_kh", "stride_kn",
    "stride_vb", "stride_vh", "stride_ob", "stride_oh", "stride_om",
)


# Lengths that are multiples of this get unpadded first-use candidates (of the tiles that divide it); the runtime's
# decision keys record it (fmha_dsl.first_use, fmha_dsl.runtime.autotune)
SEQ_ALIGN = 128


# Pipelines whose programs each serve one K/V head, with the query heads of its GQA group packed into the tile's
# rows (row t = query t // g of head kv_head * g + t % g, g = nhead_q // nhead_k): the K/V of a group is read once
# instead of g times.  Their grid is (cdiv(max_seqlen_q * g, BLOCK_M), nhead_k [* splits], batch): see grid_of.
PACKED_PIPELINES = ("qr_nwarp_sshuffle",)


def packs_gqa(pipeline: str) -> bool:
    return pipeline in PACKED_PIPELINES


def grid_of(packed: bool, batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int, block_m: int,
            splits: int = 1) -> tuple[int, int, int]:
    """The launch grid of a forward (or split-KV: ``splits`` > 1) kernel; any zero means nothing to launch."""
    if packed:
        g = nhead_q // max(nhead_k, 1)
        return ((int(max_seqlen_q) * g + block_m - 1) // block_m, int(nhead_k) * splits, int(batch))
    return ((int(max_seqlen_q) + block_m - 1) // block_m, int(nhead_q) * splits, int(batch))


def aligned_names(vlayout: str = "r") -> tuple[str, ...]:
    """:data:`ALIGNED` plus V's non-unit stride (``stride_vn`` for "r", ``stride_vd`` for "c")."""
    return ALIGNED + (("stride_vd",) if vlayout == "c" else ("stride_vn",))


def block_d(hdim: int) -> int:
    """Head dims are processed as one power-of-two block of at least 16 (the dot's k minimum)."""
    return max(16, 1 << max(0, (int(hdim) - 1).bit_length()))


# ---- split-KV ------------------------------------------------------------------------------------------
# The split kernel is ``fmha_fwd`` with ``SPLIT``: same ARGS, ``Out``/``Lse`` pointing at the fp32 workspaces
# ``[B, Hq * splits, max_seqlen_q, Dv]`` / ``[B, Hq * splits, max_seqlen_q]`` (every mode), launched on the grid
# ``(cdiv(max_seqlen_q, BLOCK_M), nhead_q * splits, batch)``.  The combine kernel's run-time parameters:
COMBINE_ARGS: tuple[tuple[str, str], ...] = (
    ("Ows", "*fp32"), ("Lws", "*fp32"), ("Out", "*{dtype}"), ("Lse", "*fp32"), ("cu_seqlens_q", "*i32"),
    ("seqlen_q", "i32"), ("nhead_q", "i32"), ("num_splits", "i32"), ("head_dim_v", "i32"),
    ("stride_wb", "i32"), ("stride_wh", "i32"), ("stride_wm", "i32"), ("stride_xb", "i32"), ("stride_xh", "i32"),
    ("stride_ob", "i32"), ("stride_oh", "i32"), ("stride_om", "i32"),
    ("stride_lb", "i32"), ("stride_lh", "i32"), ("stride_lm", "i32"),
)
COMBINE_BLOCK_M = 1    # query rows per combine program (grid: max_seqlen_q x nhead_q x batch)
COMBINE_BLOCK_S = 16   # splits a combine program reads at once (a row's splits in cdiv(splits, 16) steps)
COMBINE_WARPS = 2      # its warps: 16 x Dv fp32 partials a step in few registers, so that a decode batch's rows (one
#                        program each) run in one wave (32 splits x 4 warps held 167 registers a thread on sm90: three
#                        programs per SM, 1.3 waves at batch 8 x 64 heads)


def combine_args(ws, lws, out, lse, cu_seqlens_q, *, seqlen_q, nhead_q, num_splits, head_dim_v, ws_strides,
                 lws_strides, out_strides, lse_strides) -> list:
    """The combine kernel's run-time arguments in :data:`COMBINE_ARGS` order.  ``ws_strides``: the workspace's
    ``[B, Hq*S, Sq, Dv]`` strides; ``lws_strides``: ``[B, Hq*S, Sq]``; ``out_strides``/``lse_strides``: as the
    forward kernel's (batch ``(b, h, m, d)`` / ``(b, h, m)``; group mode with batch stride 0)."""
    return [ws, lws, out, lse, cu_seqlens_q, int(seqlen_q), int(nhead_q), int(num_splits), int(head_dim_v),
            ws_strides[0], ws_strides[1], ws_strides[2], lws_strides[0], lws_strides[1],
            out_strides[0], out_strides[1], out_strides[2], lse_strides[0], lse_strides[1], lse_strides[2]]


def split_args(args, ws, lws, ws_strides, lws_strides, nhead_q: int, num_splits: int) -> tuple[list, list]:
    """``(split kernel args, combine kernel args)`` from the forward kernel's arguments ``args`` (:data:`ARGS` order,
    as packed for the problem): the split kernel writes the workspaces ``ws``/``lws`` (pointers or tensors, with
    :func:`workspace_strides`) instead of ``Out``/``Lse``; the combine kernel reads them and writes ``Out``/``Lse``
    with the strides ``args`` carries (group mode: batch stride 0)."""
    a = list(args)
    a[_AT["Out"]], a[_AT["Lse"]] = ws, lws
    o, lo = _AT["stride_ob"], _AT["stride_lb"]
    a[o:o + 4] = ws_strides
    a[lo:lo + 3] = lws_strides
    comb = combine_args(ws, lws, args[_AT["Out"]], args[_AT["Lse"]], args[_AT["cu_seqlens_q"]],
                        seqlen_q=args[_AT["seqlen_q"]], nhead_q=nhead_q, num_splits=num_splits,
                        head_dim_v=args[_AT["head_dim_v"]], ws_strides=ws_strides, lws_strides=lws_strides,
                        out_strides=args[o:o + 3], lse_strides=args[lo:lo + 3])
    return a, comb


_AT = {name: i for i, (name, _) in enumerate(ARGS)}


_I64 = 1 << 63
_U64 = (1 << 64) - 1


def pack(ptrs, group, qs, ks, vs, os_, ls, bs, as_, nhq, nhk, dq, dv, sq, sk, msq, msk, scale, softcap,
         dropout_p, seed, offset, wl, wr, br, sink) -> list:
    """The forward kernel's run-time arguments in :data:`ARGS` order -- the one packer of this ABI: the runtime's
    Python path, ``fmha_dsl.attention`` and the interpreter harness's checked
    :func:`~fmha_dsl.kernels.fwd_host.pack_args` call it; the torch fast path replays what it packed.

    ``ptrs``: the 9 pointer values (Q, K, V, Out, Lse, Bias, Alibi, cu_seqlens_q, cu_seqlens_k).  ``qs``, ``ks``,
    ``vs``, ``os_``: the tensors' own strides (batch ``[B, H, S, D]``, group ``[T, H, D]``); ``ls``: LSE strides
    (``[B, Hq, Sq]`` / ``[Hq, Tq]``, or None); ``bs``: bias strides over ``[B, Hq, Sq, Sk]`` with 0 for broadcast
    dims (or None); ``as_``: ALiBi strides over ``[B, Hq]`` (or None).  ``sq``/``sk``: batch-mode lengths (0 in
    group mode); ``msq``/``msk``: the maximum lengths.  ``scale`` None = ``1/sqrt(dq)``; ``softcap`` None = off.
    """
    if group:
        qs = (0, qs[1], qs[0], qs[2])
        ks = (0, ks[1], ks[0], ks[2])
        vs = (0, vs[1], vs[0], vs[2])
        os_ = (0, os_[1], os_[0], os_[2])
        ls = (0, 0, 1) if ls is None else (0, ls[0], ls[1])
    elif ls is None:
        ls = (0, 0, 1)
    if dropout_p:
        seed = int(seed) & _U64
        if seed >= _I64:
            seed -= 1 << 64
    else:
        seed = 0
    return [*ptrs, 1.0 / math.sqrt(dq) if scale is None else float(scale), 0.0 if softcap is None else float(softcap),
            float(dropout_p or 0.0), seed, int(offset) if dropout_p else 0, sq, sk, msq, msk, nhq, nhk, dq, dv, wl, wr,
            br, sink, *qs, *ks, *vs, *os_, *ls, *((0, 0, 0, 1) if bs is None else bs),
            *((0, 1) if as_ is None else as_)]


def workspace_strides(batch: int, nhead_q: int, splits: int, max_seqlen_q: int, dv: int) -> tuple[tuple, tuple]:
    """Element strides of the contiguous split-KV workspaces ``O [B, Hq*S, Sq, Dv]`` and ``LSE [B, Hq*S, Sq]``."""
    hs, sq = int(nhead_q) * int(splits), max(1, int(max_seqlen_q))
    return (hs * sq * dv, sq * dv, dv, 1), (hs * sq, sq, 1)


# ---- the torch fast path's replay (runtime/torch_fast.cpp) ------------------------------------------------------
# A batch-mode call replayed in C++ recomputes these arguments from the call's own tensors (so that one recipe serves
# every seqlen_k of its dispatcher's bucket: a decode loop that grows K/V by one token per step); every other argument
# is the recorded call's.  A patch is (argument index, source, operand):
R_PTR, R_STRIDE, R_SEQLEN_K, R_SCALE, R_SPLITS, R_WS = range(6)
# R_PTR's operand: the tensor whose address the argument holds
T_Q, T_K, T_V, T_OUT, T_LSE, T_WS, T_LWS = range(7)
# R_STRIDE's operand: 4 * (0 q, 1 k, 2 v) + dim.  R_WS's: the split workspaces' strides, 0-2 O's (b, h, m), 3-4 the
# LSE's (b, h): :func:`workspace_strides` for the replayed call's split count (R_SPLITS: that count).

_STRIDES = tuple((f"stride_{t}{d}", 4 * i + j) for i, t in enumerate("qkv")
                 for j, d in enumerate(("b", "h", "m" if t == "q" else "n", "d")))


def replay_patches(split: bool) -> tuple[tuple, tuple]:
    """``(main, combine)``: the patches of the forward (or split) kernel's :data:`ARGS` and, for a split plan, of the
    combine kernel's :data:`COMBINE_ARGS` (``()`` otherwise)."""
    main = [(_AT["Q"], R_PTR, T_Q), (_AT["K"], R_PTR, T_K), (_AT["V"], R_PTR, T_V),
            (_AT["Out"], R_PTR, T_WS if split else T_OUT), (_AT["Lse"], R_PTR, T_LWS if split else T_LSE),
            (_AT["sm_scale"], R_SCALE, 0), (_AT["seqlen_k"], R_SEQLEN_K, 0), (_AT["max_seqlen_k"], R_SEQLEN_K, 0)]
    main += [(_AT[name], R_STRIDE, operand) for name, operand in _STRIDES]
    if not split:
        return tuple(main), ()
    main += [(_AT[n], R_WS, i) for i, n in enumerate(("stride_ob", "stride_oh", "stride_om", "stride_lb", "stride_lh"))]
    at = {name: i for i, (name, _) in enumerate(COMBINE_ARGS)}
    comb = [(at["Ows"], R_PTR, T_WS), (at["Lws"], R_PTR, T_LWS), (at["Out"], R_PTR, T_OUT), (at["Lse"], R_PTR, T_LSE),
            (at["num_splits"], R_SPLITS, 0)]
    comb += [(at[n], R_WS, i) for i, n in enumerate(("stride_wb", "stride_wh", "stride_wm", "stride_xb", "stride_xh"))]
    return tuple(main), tuple(comb)
