"""[kernels] The backward template on the CPU under Triton's interpreter, on NumPy arrays (tests; no torch).

``TRITON_INTERPRET=1`` must be set before triton is first imported.  The three stages run exactly as the runtime
launches them: arguments from :func:`fmha_dsl.kernels.bwd_abi.pack` (the ABI's one packer), grids from
:func:`~fmha_dsl.kernels.bwd_abi.grids`, one zeroed workspace sized by
:func:`~fmha_dsl.kernels.bwd_abi.workspace`.
"""

from __future__ import annotations

import numpy as np

from . import bwd_abi
from .interpret_args import dtype_of, mask_args
from .fwd_interpret import _bf16_decode, _bf16_encode, _Shim, guarded

__all__ = ["run_interpreted_bwd"]


def run_interpreted_bwd(q, k, v, out, lse, dout, *, causal=None, window=None, bias=None, alibi_slopes=None,
                        dropout_p=0.0, seed=0, offset=0, softcap=None, sink=0, scale=None, cu_seqlens_q=None,
                        cu_seqlens_k=None, dtype=None, block_m=16, block_n=16, deterministic=False, dbias=None,
                        pad=None, mask_kernel=None, pipeline="bwd_async"):
    """``(dq, dk, dv, dbias)`` of the Triton backward for :func:`fmha_dsl.reference_bwd.attention_bwd`'s arguments.

    ``dtype``: ``None`` (q's: float16 or float32) or ``"bf16"`` (float32 inputs rounded to bf16); ``block_m``/
    ``block_n``: the main kernel's tile; ``dbias``: compute the bias gradient (default: when a bias is given);
    ``pad``: ``(pad_s, pad_sk, pad_d, pad_dv)`` (default: only the checks the shapes need); ``mask_kernel``: force
    the mask kernel on/off; ``pipeline``: ``"bwd_trload"`` runs the TMA path.  ``dbias`` comes back full-size
    ``[B, Hq, Sq, Sk]`` (the caller sums broadcast dims).
    """
    from . import triton_bwd as T

    dtype = dtype_of(q, dtype)
    npdt = {"fp16": np.float16, "fp32": np.float32, "bf16": np.uint16}[dtype]
    tname = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16"}[dtype]

    def prep(x):
        x = np.asarray(x)
        x = _bf16_encode(np.asarray(x, np.float32)) if dtype == "bf16" else x.astype(npdt)
        return np.ascontiguousarray(x)

    def el(a):
        return tuple(st // a.itemsize for st in a.strides)

    group = cu_seqlens_q is not None
    qa, ka, va, oa, doa = (prep(x) for x in (q, k, v, out, dout))
    la = np.ascontiguousarray(lse, np.float32)
    if group:
        cq = np.ascontiguousarray(cu_seqlens_q, np.int32)
        ckk = np.ascontiguousarray(cu_seqlens_k, np.int32)
        B = cq.shape[0] - 1
        _, Hq, Dq = qa.shape
        Hk, Dv = ka.shape[1], va.shape[-1]
        msq = int(np.diff(cq).max()) if B else 0
        msk = int(np.diff(ckk).max()) if B else 0
        sq = sk = 0
    else:
        cq = ckk = np.zeros(1, np.int32)
        B, Hq, msq, Dq = qa.shape
        Hk, msk, Dv = ka.shape[1], ka.shape[2], va.shape[-1]
        sq, sk = msq, msk

    mode, mask_none, left, right = mask_args(causal, window)
    use_mask = (not mask_none) if mask_kernel is None else bool(mask_kernel)

    nan = np.uint16(0x7FC0) if dtype == "bf16" else np.nan  # every gradient element must be written by the kernels
    dq = np.full(qa.shape, nan, npdt)
    dk = np.full(ka.shape, nan, npdt)
    dv = np.full(va.shape, nan, npdt)
    want_dbias = bias is not None if dbias is None else bool(dbias)
    b_arr = prep(bias) if bias is not None else np.zeros(1, npdt)
    g_arr = np.zeros((B, Hq, msq, msk), npdt) if want_dbias else np.zeros(1, npdt)
    a_arr = np.zeros(1, np.float32)
    bias_kind = "no"
    if bias is not None:
        bias_kind = "bias"
    if alibi_slopes is not None:
        bias_kind = "alibi"
        a_arr = np.ascontiguousarray(np.broadcast_to(np.asarray(alibi_slopes, np.float32), (B, Hq)))

    if pad is None:
        pad = (int(group or msq % block_m != 0), int(group or msk % block_n != 0), 0, 0)
    sig = {"dtype": dtype, "mode": "group" if group else "batch", "hdim_q": Dq, "hdim_v": Dv,
           "mask": "top_left" if use_mask else "no", "bias": bias_kind, "dbias": want_dbias,
           "dropout": dropout_p > 0, "logits": softcap is not None, "sink": sink > 0,
           "deterministic": bool(deterministic)}
    alg = {"tile": (block_m, block_n), "pipeline": pipeline, "pad_s": pad[0], "pad_sk": pad[1], "pad_d": pad[2],
           "pad_dv": pad[3]}
    consts = {f: T.constexprs(dict(sig, family=f), alg) for f in T.KERNELS}
    consts["bwd_dq_dk_dv"]["UPCAST_DOT"] = dtype == "bf16"
    consts["bwd_dq_dk_dv"]["TMA"] = min(consts["bwd_dq_dk_dv"]["TMA"], 1)  # the interpreter has no bulk reductions

    ws = bwd_abi.workspace(B, Hq, msq, msk, Dq, block_n, deterministic)
    buf = np.zeros(ws["numel"], np.float32)
    parts = bwd_abi.workspace_parts(buf, ws)
    acc_part = parts["acc"]
    s32 = _Shim

    def ro(a, t):  # a read-only input: it ends at an unreadable page (a read past it faults)
        return _Shim(guarded(a), t)
    ptrs = {"q": ro(qa, tname), "k": ro(ka, tname), "v": ro(va, tname), "out": ro(oa, tname),
            "dout": ro(doa, tname), "lse": ro(la, "float32"), "dq": s32(dq, tname), "dk": s32(dk, tname),
            "dv": s32(dv, tname), "dbias": s32(g_arr, tname), "bias": ro(b_arr, tname),
            "alibi": ro(a_arr, "float32"), "cu_q": ro(cq, "int32"), "cu_k": ro(ckk, "int32"),
            "d": s32(parts["d"], "float32"), "l2": s32(parts["l2"], "float32"),
            "acc": s32(acc_part if acc_part.size else np.zeros(1, np.float32), "float32")}
    bs = bwd_abi.bias_strides(b_arr.shape, el(b_arr)) if bias is not None else None
    gs = el(g_arr) if want_dbias else None
    as_ = el(a_arr) if alibi_slopes is not None else None
    ls = (la.strides[0] // 4,) if group else el(la)
    dot, main, conv = bwd_abi.pack(ptrs, group, el(qa), el(ka), el(va), el(oa), el(doa), el(dq), el(dk), el(dv), ls,
                                   bs, gs, as_, ws, nhq=Hq, nhk=Hk, dq=Dq, dv=Dv, sq=sq, sk=sk, msq=msq, msk=msk,
                                   scale=scale, softcap=softcap, dropout_p=dropout_p, seed=seed, offset=offset,
                                   wl=left, wr=right, br=mode != "top_left", sink=int(sink))
    g1, g2, g3 = bwd_abi.grids(B, Hq, Hk, msq, msk, block_n, deterministic)
    if not (min(g1) and min(g2)):  # no query row or no key column anywhere: zero gradients, nothing launched
        for x in (dq, dk, dv):
            x[...] = 0
    else:
        T.fmha_bwd_dot_do_o[g1](*dot, **consts["bwd_dot_do_o"])
        T.fmha_bwd_dq_dk_dv[g2](*main, **consts["bwd_dq_dk_dv"])
        if bwd_abi.converts(deterministic):
            T.fmha_bwd_convert_dq[g3](*conv, **consts["bwd_convert_dq"])
    res = [dq, dk, dv, g_arr if want_dbias else None]
    if dtype == "bf16":
        res = [None if x is None else _bf16_decode(x) for x in res]
    return tuple(res)
