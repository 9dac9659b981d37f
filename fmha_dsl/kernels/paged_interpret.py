"""[kernels] The serving templates on the CPU under Triton's interpreter, on NumPy arrays (tests; no torch).

``TRITON_INTERPRET=1`` must be set before triton is first imported.  The kernels run as the runtime launches them:
arguments from :mod:`fmha_dsl.kernels.paged_abi`'s packers, grids from :func:`fmha_dsl.kernels.fwd_abi.grid_of` /
:func:`~fmha_dsl.kernels.paged_abi.append_grid`, split-KV through the forward family's combine kernel.
"""

from __future__ import annotations

import numpy as np

from . import paged_abi
from .abis import output_dtype
from .interpret_args import dtype_of, mask_args
from .fwd_interpret import _bf16_decode, _bf16_encode, _Shim, guarded

__all__ = ["run_interpreted_paged", "run_interpreted_append"]

_NP = {"fp16": np.float16, "fp32": np.float32, "bf16": np.uint16, "fp8bf16": np.uint8}
_TNAME = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16", "fp8bf16": "float8_e4m3fn"}


def _prep(x, dtype):
    x = np.asarray(x)
    if dtype == "bf16":
        return _bf16_encode(np.asarray(x, dtype=np.float32))
    if dtype == "fp8bf16":  # the e4m3 bytes of the values (rounded to e4m3 if they are not on its grid)
        from ..fp8 import encode_e4m3

        return encode_e4m3(x)
    return np.ascontiguousarray(x.astype(_NP[dtype], copy=False))


def _decode(x, dtype):
    """The values of an array :func:`_prep` made for ``dtype`` (its inverse on the dtype's grid)."""
    if dtype == "bf16":
        return _bf16_decode(x)
    if dtype == "fp8bf16":
        from ..fp8 import decode_e4m3

        return decode_e4m3(x)
    return x


def _descale_args(descales, n: int, dtype: str) -> tuple[list, tuple, tuple, str]:
    """``(shims, strides, token strides, qscale)`` of the ``n`` FP8 descales (q's, K's, V's, or the last two): fp32
    arrays for the kernel -- one element each (1.0 when None), K's and V's ``[num_pages, Hk]`` block scales or
    ``[num_pages, page_size, Hk]`` per-token ones (q's then one element or ``[Tq, Hq]``) --, the ABI's descale and
    token strides (:func:`~fmha_dsl.kernels.paged_abi.descale_strides`, :func:`~.paged_abi.token_strides`) and the
    key's ``qscale`` (``no`` unless ``dtype`` is an FP8 contract).  The arrays end at an unreadable page
    (:func:`.fwd_interpret.guarded`), as the harness's other read-only inputs do: a read past one faults."""
    arrs = [np.ascontiguousarray(np.asarray(1.0 if descales is None else descales[i], np.float32)) for i in range(n)]
    kind = paged_abi.descale_kind(arrs[0].shape if n == 3 else None, arrs[-2].shape, arrs[-1].shape)
    strides = paged_abi.descale_strides(*((a.shape, _el(a)) for a in arrs[-2:]))
    tokens = paged_abi.token_strides(*((None,) * (3 - n) + tuple((a.shape, _el(a)) for a in arrs)))
    qscale = kind if dtype in paged_abi.FP8_DTYPES else "no"
    return [_Shim(guarded(a.reshape(-1) if a.size == 1 else a), "float32") for a in arrs], strides, tokens, qscale


def _el(a):
    """Element strides (a size-1 dim's stride normalised)."""
    return tuple(0 if n == 1 else st // a.itemsize for n, st in zip(a.shape, a.strides))


def _layout(ka, va, vectorized: bool):
    """``(layout, K, V)``: the linear caches, or copies in CK's vectorized layout (16-byte vectors)."""
    if not vectorized:
        return "linear", ka, va
    from ..reference_paged import vectorized_caches

    k5, v5 = vectorized_caches(ka, va, paged_abi.VECTOR_BYTES // ka.itemsize)
    return "vectorized", k5, v5


def _table(block_table, kv_indptr, kv_indices, batch):
    """``(lookup, Table, kv_indptr, table_width, row stride)`` as int32 arrays."""
    if block_table is not None:
        bt = np.ascontiguousarray(block_table, dtype=np.int32)
        return "vllm", bt, np.zeros(1, np.int32), bt.shape[1], bt.shape[1]
    ix = np.ascontiguousarray(kv_indices, dtype=np.int32)
    if ix.size == 0:
        ix = np.zeros(1, np.int32)
    return "sglang", ix, np.ascontiguousarray(kv_indptr, dtype=np.int32), 0, 0


def run_interpreted_paged(q, k_cache, v_cache, *, seqlens_k, cu_seqlens_q, block_table=None, kv_indptr=None,
                          kv_indices=None, causal=None, window=None, sink=0, softcap=None, alibi_slopes=None,
                          scale=None, dtype=None, block_m=16, block_n=16, lse=True, num_splits=0,
                          pipeline="qr_async", hnd=False, vectorized=False, descales=None, partials=False):
    """``(out [Tq, Hq, Dv], lse [Hq, Tq] | None)`` of ``fmha_paged`` for :func:`fmha_dsl.reference_paged.
    paged_attention`'s arguments (linear NHD caches ``[P, page_size, Hk, D]``; ``hnd``: run on an HND copy
    ``[P, Hk, page_size, D]`` through its strides; ``vectorized``: on a copy in CK's vectorized layout, 16-byte
    vectors of the dtype).  ``num_splits`` > 0 runs the split-KV kernel (``fwd_pagedkv``)
    and the combine kernel; ``pipeline="qr_nwarp_sshuffle"`` packs the query heads of a GQA group.  ``dtype=
    "fp8bf16"``: q and the caches as e4m3 bytes, ``descales`` their ``(q, k, v)`` descales (numbers; K's and V's
    ``[num_pages, Hk]`` arrays: KV block scales, or ``[num_pages, page_size, Hk]`` ones with q's a number or ``[Tq,
    Hq]``: per token and head), the output bf16.  ``partials`` (split-KV): also return the splits' partial LSEs
    ``[batch, Hq * splits, max_seqlen_q]`` (natural log, ``-inf`` where a split saw no key)."""
    from . import triton_combine as C
    from . import triton_paged as T
    from .fwd_abi import grid_of, workspace_strides

    dtype = dtype_of(q, dtype)
    qa, ka, va = _prep(q, dtype), _prep(k_cache, dtype), _prep(v_cache, dtype)
    odt = output_dtype(dtype)
    page = ka.shape[1]
    if hnd:
        ka = np.ascontiguousarray(ka.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        va = np.ascontiguousarray(va.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    layout, ka, va = _layout(ka, va, vectorized)
    cq = np.ascontiguousarray(cu_seqlens_q, dtype=np.int32)
    lens = np.ascontiguousarray(seqlens_k, dtype=np.int32)
    B = cq.shape[0] - 1
    Tq, Hq, Dq = qa.shape
    num_pages, _, Hk, _, Dv, ks, vs = paged_abi.cache_geometry(layout, ka.shape, _el(ka), va.shape, _el(va))
    lookup, tab, ip, width, tb_stride = _table(block_table, kv_indptr, kv_indices, B)
    msq = int(np.diff(cq).max()) if B else 0
    msk = int(lens.max()) if B else 0
    nan = np.uint16(0x7FC0) if odt == "bf16" else np.nan
    out = np.full((Tq, Hq, Dv), nan, dtype=_NP[odt])
    lse_arr = np.full((Hq, Tq), np.nan, dtype=np.float32)

    mode, mask_none, left, right = mask_args(causal, window)
    a_arr, a_st = np.zeros(1, np.float32), None
    if alibi_slopes is not None:
        a_arr = np.ascontiguousarray(alibi_slopes, dtype=np.float32)
        a_st = (0, 1) if a_arr.ndim == 1 else (a_arr.strides[0] // 4, a_arr.strides[1] // 4)
    shims, dstrides, tstrides, qscale = _descale_args(descales, 3, dtype)
    sig = {"family": "fwd_pagedkv" if num_splits else "batch_prefill", "dtype": dtype, "hdim_q": Dq, "hdim_v": Dv,
           "mask": "no" if mask_none else "top_left", "bias": "alibi" if alibi_slopes is not None else "no",
           "lse": bool(lse), "logits": softcap is not None, "sink": sink > 0, "kv_layout": layout,
           "kv_lookup": lookup, "page_size": page, "qscale": qscale}
    alg = {"tile": (block_m, block_n, 0, 0, 0, 0), "pipeline": pipeline, "pad_d": 0, "pad_dv": 0}
    const = T.constexprs(sig, alg)
    const["UPCAST_DOT"] = odt == "bf16"
    g = grid_of(const["PACK_GQA"], B, Hq, Hk, msq, block_m)
    if min(g) == 0:
        return _decode(out, odt), (lse_arr if lse else None)
    t = _TNAME[dtype]
    args = paged_abi.pack(
        [_Shim(guarded(qa), t), _Shim(guarded(ka), t), _Shim(guarded(va), t), _Shim(out, _TNAME[odt]),
         _Shim(lse_arr, "float32"), _Shim(guarded(a_arr), "float32"), _Shim(guarded(cq), "int32"),
         _Shim(guarded(lens), "int32"), _Shim(guarded(tab), "int32"), _Shim(guarded(ip), "int32"), *shims],
        _el(qa)[:2], ks, vs, _el(out), _el(lse_arr), tb_stride, a_st, Hq, Hk, Dq, Dv, msq, msk,
        num_pages, width, scale, softcap, left, right, int(mode != "top_left"), int(sink), dstrides, tstrides)
    if num_splits:
        ws = np.full((B, Hq * num_splits, msq, Dv), np.nan, np.float32)
        lws = np.full((B, Hq * num_splits, msq), np.nan, np.float32)
        wst, lst = workspace_strides(B, Hq, num_splits, msq, Dv)
        sargs, cargs = paged_abi.split_args(args, _Shim(ws, "float32"), _Shim(lws, "float32"), wst, lst, Hq,
                                            num_splits)
        T.fmha_paged[grid_of(const["PACK_GQA"], B, Hq, Hk, msq, block_m, num_splits)](*sargs, **const)
        cconst = C.constexprs({"hdim_v": Dv, "mode": "group", "lse": bool(lse)})
        C.fmha_fwd_combine[((msq + cconst["BLOCK_M"] - 1) // cconst["BLOCK_M"], Hq, B)](*cargs, **cconst)
        if partials:
            return _decode(out, odt), (lse_arr if lse else None), lws
    else:
        T.fmha_paged[g](*args, **const)
    return _decode(out, odt), (lse_arr if lse else None)


def run_interpreted_append(k_cache, v_cache, k_new, v_new, *, seqlens_k, cu_seqlens_new, block_table=None,
                           kv_indptr=None, kv_indices=None, rotary_cos=None, rotary_sin=None,
                           rotary_interleaved=False, q=None, dtype=None, contiguous=False, vectorized=False,
                           descales=None):
    """``(k_cache, v_cache, q)`` after ``fmha_appendkv`` (copies; as :func:`fmha_dsl.reference_paged.append_kv`).
    ``contiguous``: the caches are ``[B, capacity, Hk, D]`` (no table); ``vectorized``: the kernel writes copies in
    CK's vectorized layout (returned in that layout).  ``dtype="fp8bf16"``: e4m3 caches, bf16 new rows and q,
    ``descales`` the ``(k, v)`` descales (numbers, or ``[num_pages, Hk]`` arrays: KV block scales)."""
    from . import triton_appendkv as T

    dtype = dtype_of(k_new, dtype)
    new_dt = output_dtype(dtype)   # the new rows' and q's dtype (bf16 for an FP8 cache)
    ka, va = _prep(k_cache, dtype).copy(), _prep(v_cache, dtype).copy()
    page = ka.shape[1]
    layout, ka, va = _layout(ka, va, vectorized)
    kn, vn = _prep(k_new, new_dt), _prep(v_new, new_dt)
    qa = _prep(q, new_dt).copy() if q is not None else None
    cn = np.ascontiguousarray(cu_seqlens_new, dtype=np.int32)
    lens = np.ascontiguousarray(seqlens_k, dtype=np.int32)
    B = cn.shape[0] - 1
    Hk, Dq, Dv = kn.shape[1], kn.shape[2], vn.shape[2]
    Hq = qa.shape[1] if qa is not None else Hk
    if contiguous:
        lookup, tab, ip, width, tb_stride = "contiguous", np.zeros(1, np.int32), np.zeros(1, np.int32), ka.shape[1], 0
    else:
        lookup, tab, ip, width, tb_stride = _table(block_table, kv_indptr, kv_indices, B)
    rope = "none"
    cos = sin = np.zeros((1, 1), np.float32)
    if rotary_cos is not None:
        rope = "inter" if rotary_interleaved else "half"
        cos = np.ascontiguousarray(rotary_cos, dtype=np.float32)
        sin = np.ascontiguousarray(rotary_sin, dtype=np.float32)
    shims, dstrides, _, qscale = _descale_args(descales, 2, dtype)
    sig = {"family": "fwd_appendkv", "dtype": dtype, "qscale": qscale, "hdim_q": Dq, "hdim_v": Dv,
           "rope": rope, "paged_kv": not contiguous, "kv_lookup": lookup if not contiguous else "vllm",
           "page_size": page, "kv_layout": layout}
    const = T.constexprs(sig, {})
    max_new = int(np.diff(cn).max()) if B else 0
    g = paged_abi.append_grid(B, Hq, Hk, max_new, qa is not None)
    if min(g):
        num_pages, _, _, _, _, ks, vs = paged_abi.cache_geometry(layout, ka.shape, _el(ka), va.shape, _el(va))
        t, tn = _TNAME[dtype], _TNAME[new_dt]
        qsh = _Shim(qa, tn) if qa is not None else _Shim(np.zeros(1, _NP[new_dt]), tn)
        args = paged_abi.pack_append(
            [qsh, _Shim(ka, t), _Shim(va, t), _Shim(guarded(kn), tn), _Shim(guarded(vn), tn),
             _Shim(guarded(cos), "float32"), _Shim(guarded(sin), "float32"), _Shim(guarded(cn), "int32"),
             _Shim(guarded(lens), "int32"), _Shim(guarded(tab), "int32"), _Shim(guarded(ip), "int32"), *shims],
            _el(qa)[:2] if qa is not None else (0, 0), ks, vs, _el(kn)[:2], _el(vn)[:2],
            cos.strides[0] // 4, tb_stride, Hq, Hk, Dq, Dv, max_new, cos.shape[1] if rope != "none" else 0,
            cos.shape[0] if rope != "none" else 0, num_pages, width, dstrides)
        T.fmha_appendkv[g](*args, **const)
    return _decode(ka, dtype), _decode(va, dtype), (_decode(qa, new_dt) if qa is not None else None)
