"""[kernels] The forward template on the CPU under Triton's interpreter, on NumPy arrays (tests; no torch).

``TRITON_INTERPRET=1`` must be set before triton is first imported.  :func:`run_interpreted` runs ``fmha_fwd`` (and,
for split-KV, the combine kernel) with :func:`fmha_dsl.reference.attention_fwd`'s keyword arguments; the duck-typed
tensor :class:`_Shim` and the bf16 helpers are shared with the other harnesses (:mod:`.bwd_interpret`,
:mod:`.paged_interpret`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

from .fwd_host import ARGS, constexprs, grid, pack_args
from .interpret_args import dtype_of, mask_args
from .triton_fwd import fmha_fwd

__all__ = ["run_interpreted", "bf16_round", "guarded", "guard_side", "run_guarded", "GUARD_SIDES"]


_GUARD_SIDE = contextvars.ContextVar("fmha_dsl_guard_side", default="end")
GUARD_SIDES = ("end", "start")


@functools.lru_cache(maxsize=None)
def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def guard_side(side: str):
    """Within this block :func:`guarded` puts the unreadable page before each input's first byte (``"start"``:
    reads before an input fault) instead of after its last (``"end"``, the default: reads past it fault).  One
    side at a time: an input is page-aligned at one end only, the other end shares a page with the mapping's
    slack."""
    if side not in GUARD_SIDES:
        raise ValueError(f"guard side: one of {', '.join(GUARD_SIDES)}, got {side!r}")
    token = _GUARD_SIDE.set(side)
    try:
        yield
    finally:
        _GUARD_SIDE.reset(token)


def run_guarded(side: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` within :func:`guard_side` ``(side)`` (module level, so that a test's worker process
    can be handed it)."""
    with guard_side(side):
        return fn(*args, **kwargs)


def guarded(arr):
    """A copy of read-only input ``arr`` next to an unreadable page, so that a kernel that reads outside it under
    the interpreter (which reads raw host addresses) faults instead of reading a neighbour's memory: after its last
    byte, or before its first within :func:`guard_side` ``("start")``.  Arrays that are not C-contiguous (their
    strides are the kernel's) or empty come back as they are."""
    import ctypes
    import mmap

    import numpy as np

    if arr.size == 0 or not arr.flags.c_contiguous or not hasattr(mmap, "PROT_READ"):
        return arr
    page = mmap.PAGESIZE
    pages = -(-arr.nbytes // page)
    m = mmap.mmap(-1, (pages + 1) * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    start = _GUARD_SIDE.get() == "start"
    fence = 0 if start else pages * page
    if _libc().mprotect(ctypes.c_void_p(base + fence), ctypes.c_size_t(page), 0) != 0:   # PROT_NONE
        return arr
    buf = np.frombuffer(m, dtype=np.uint8)   # (holds the mapping alive)
    first = page if start else pages * page - arr.nbytes
    out = buf[first: first + arr.nbytes].view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return out


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
                    pad=None, mask_kernel=None, num_splits=0, pipeline="qr_async", partials=False):
    """Run :func:`fmha_fwd` on the CPU (``TRITON_INTERPRET=1`` must have been set before triton was
    imported) with the keyword arguments of :func:`fmha_dsl.reference.attention_fwd`.

    Extra knobs: ``dtype`` (``None``: q's dtype, float16 or float32; ``"bf16"``: float32 inputs rounded to
    bf16 and run as bf16), ``block_m``/``block_n``, ``lse`` (store it), ``vlayout`` (``"c"`` copies V into
    a column-major view), ``hdim_q``/``hdim_v`` (the kernel's head-dim bounds, default the problem's),
    ``pad`` (``(pad_s, pad_sk, pad_d, pad_dv)``; default: only the checks the shapes need), ``mask_kernel``
    (force the mask kernel on or off; default: on when a causal mask or window is given), ``num_splits`` (> 0:
    run the split-KV kernel with that many splits, then the combine kernel), ``pipeline`` (``"qr_async_trload"``:
    K/V through tensor descriptors), ``partials`` (split-KV: also return the splits' partial LSEs, an array
    ``[batch, nhead_q * splits, max_seqlen_q]`` (natural log), ``-inf`` where a split saw no key).
    q/k/v may be any strided views whose head dim is contiguous.  Returns ``(out, lse)`` as NumPy arrays
    (``out`` float32 for bf16; ``lse`` None when ``lse`` is False).
    """
    import numpy as np

    dtype = dtype_of(q, dtype)
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

    mode, mask_none, left, right = mask_args(causal, window)
    bottom_right = mode != "top_left"
    use_mask = (not mask_none) if mask_kernel is None else bool(mask_kernel)

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
        q=_Shim(guarded(qa), tname), k=_Shim(guarded(ka), tname), v=_Shim(guarded(va), tname),
        out=_Shim(out, tname),
        q_strides=el(qa), k_strides=el(ka), v_strides=el(va, seq_axis if vlayout == "c" else -1),
        out_strides=el(out),
        nhead_q=Hq, nhead_k=Hk, head_dim_q=Dq, head_dim_v=Dv, mode="group" if group else "batch",
        seqlen_q=seqlen_q, seqlen_k=seqlen_k, max_seqlen_q=sq_max, max_seqlen_k=sk_max,
        cu_seqlens_q=_Shim(guarded(cq), "int32"), cu_seqlens_k=_Shim(guarded(ckk), "int32"),
        lse=_Shim(lse_arr, "float32"), lse_strides=el(lse_arr), bias=_Shim(guarded(b_arr), tname),
        bias_strides=b_st, alibi=_Shim(guarded(a_arr), "float32"), alibi_strides=a_st, sm_scale=scale,
        softcap=0.0 if softcap is None else float(softcap), dropout_p=float(dropout_p), seed=seed, offset=offset,
        window_left=left, window_right=right, bottom_right=bottom_right, sink=int(sink), vlayout=vlayout)
    if num_splits:
        lws = _run_split_interpreted(args, const, g, int(num_splits), sq_max, Dv, Hk)
    else:
        fmha_fwd[g](*args, **const)
    if dtype == "bf16":
        out = _bf16_decode(out)
    if partials and num_splits:
        return out, (lse_arr if lse else None), lws
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
    return lws
