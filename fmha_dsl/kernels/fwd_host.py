"""[kernels] The host side of the Triton forward template (:mod:`.triton_fwd`), free of Triton: what the build and
the runtime need to compile and launch ``fmha_fwd``.

``CONSTEXPRS`` / ``constexprs(sig, alg) -> dict``
    The kernel's constexpr names in order, and their values for a kernel key's field dicts
    (``fmha_dsl.fields.SIG_KEYS`` / ``ALG_KEYS``).
``ARGS`` (from :mod:`.fwd_abi`)
    ``(name, type)`` of every run-time parameter in order.  ``"*{dtype}"`` stands for the input dtype's
    pointer (``*fp16``/``*bf16``/``*fp32``); :func:`signature` fills it in.
``signature(dtype) -> dict``
    The full ``triton.compiler.ASTSource`` signature (constexprs marked ``"constexpr"``).
``attrs(dtype, vlayout) -> dict`` / ``aligned(args, vlayout) -> bool``
    Optional ``ASTSource(attrs=...)``: ``tt.divisibility 16`` for the pointers and strides named (the
    JIT would infer it; ahead of time it must be promised, or loads are not vectorised).  A runtime
    that uses such a binary must check :func:`aligned` on the packed arguments.
``grid(batch, nhead_q, max_seqlen_q, block_m) -> (x, y, z)``
    ``(cdiv(max_seqlen_q, block_m), nhead_q, batch)``; any zero means there is nothing to launch.
``pack_args(...) -> list``
    The positional run-time arguments in :data:`ARGS` order (pointers as ints, or any object).
"""

from __future__ import annotations

from .fwd_abi import ALIGNED, ARGS, aligned_names, block_d, packs_gqa  # noqa: F401  (shared with runtime/rules)

__all__ = ["ARGS", "CONSTEXPRS", "ALIGNED", "DTYPES", "signature", "constexprs", "attrs", "aligned", "aligned_names",
           "grid", "pack_args", "block_d"]

DTYPES = ("fp16", "bf16", "fp32")

CONSTEXPRS: tuple[str, ...] = (
    "BLOCK_M", "BLOCK_N", "BLOCK_DMODEL", "BLOCK_DV", "HEAD_DIM_Q", "HEAD_DIM_V",
    "PAD_M", "PAD_N", "PAD_D", "PAD_DV", "CHECK_D", "CHECK_DV",
    "IS_GROUP", "MASK", "SINK", "BIAS_TYPE", "STORE_LSE", "DROPOUT", "SOFTCAP", "VLAYOUT_C", "IEEE", "UPCAST_DOT",
    "SPLIT", "TMA", "PACK_GQA",
)


_BIAS = {"no": 0, "bias": 1, "alibi": 2}
_MASKS = ("no", "top_left", "bottom_right", "generic")


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
