"""``fmha_dsl.attention``: forward attention on NumPy arrays (the reference) or torch GPU tensors (the kernels).

    out = fmha_dsl.attention(q, k, v, causal=True)                     # torch CUDA/ROCm tensors, [B, H, S, D]
    out, lse = fmha_dsl.attention(q, k, v, return_lse=True, registry="build/bench")
    out = fmha_dsl.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=mq, max_seqlen_k=mk)

What it computes is ``docs/semantics.md`` (the same as :func:`fmha_dsl.reference.attention_fwd`).

* NumPy arrays run the reference: float16/float32 arrays accumulate in float32, as the kernels do; float64
  arrays (which no kernel takes) in float64.
* torch tensors on a GPU run a kernel.  Shapes are logical ``[B, Hq, Sq, D]`` (group mode ``[T, H, D]`` with
  ``cu_seqlens_q/k``); any strides work as long as the head dim has stride 1 (V may instead have its key
  axis at stride 1: column-major V).  A BSHD tensor is passed as ``x.transpose(1, 2)``; the output then has the
  same memory order as ``q``.
* ``registry``: a build directory, a ``registry.json`` path, a :class:`~fmha_dsl.registry.Registry` or a
  :class:`~fmha_dsl.runtime.dispatch.Dispatcher`.  ``None`` (default): selection by measurement on first use
  (:mod:`fmha_dsl.runtime.autotune`): the first call of a problem class and length octave compiles the
  rule-checked candidates (:class:`fmha_dsl.first_use.Builder`: exact head dims, every tile and pipeline, split-KV
  for few query blocks), times them on this call's arguments, keeps the fastest and records it per device (a
  decision recorded on this device compiles only the winner; a shipped one too, unless its runners-up came within
  6 % of it: then those few are timed again here first); binaries go through the build's artifact cache.
  ``FMHA_DSL_AUTOTUNE=0`` skips the timing (cost model), ``FMHA_DSL_NO_BUILD=1`` makes a missing kernel an error
  (``dispatch.no-kernel``).  A registry without a seqtune table is timed the same way on first use.
* Group mode: ``max_seqlen_q/k`` (ints) avoid a device-to-host copy of ``cu_seqlens``; without them the
  lengths are read back (one synchronisation) and fully checked.
* Dropout: ``seed=None`` draws a seed from torch's CPU generator (NumPy inputs: from NumPy's); ``offset`` is
  the Philox base offset.  With a fixed seed the kernels and the reference drop the same elements.

Every input problem is a :class:`fmha_dsl.errors.UsageError` naming the argument, the expected and the
actual value, and a hint.  Importing this module does no work (torch and numpy are imported on first call).
"""

from __future__ import annotations

import math

from . import api_dispatch as _api
from .api_dispatch import dispatcher as _dispatcher
from .api_dispatch import timer as _timer
from .attention_args import TORCH_DTYPES as _TORCH_DTYPES  # torch dtype -> key dtype name
from .attention_args import (torch_dtype_names as _torch_dtype_names, _bad_dtypes, _bad_strides, _batch_shapes,
                             _bad_types, _check_bias, _check_devices, _check_dropout, _check_scale, _check_sink,
                             _check_softcap, _group_shapes, _mask, _usage, accumulation, check_numpy_call,
                             check_one_bias, flag, named)
from .errors import UsageError
from .index_args import check_max_lengths, group_lengths
from .numeric import FP32_TINY, SCALAR_MAX

__all__ = ["attention"]


class _NoTensor:  # stands for torch.Tensor until torch is first seen
    pass


_T = _NoTensor              # torch.Tensor once torch is imported
_torch = None               # the torch module
_fwd_args = None            # fmha_dsl.kernels.fwd_abi.pack (the forward ABI's one packer)
_Dispatcher = _NoTensor     # fmha_dsl.runtime.dispatch.Dispatcher
_raw_stream = None          # torch._C._cuda_getCurrentRawStream
_grid_of = None             # fmha_dsl.kernels.fwd_abi.grid_of (the launch grid of a plan's kernel)
_JIT = _api._JIT            # device -> the compile-on-first-use dispatcher (shared with attention_backward)


_ALIGNED_IDX: dict = {}     # V column-major? -> argument positions the 16-divisibility promise covers
_fast_path = None           # the torch fast path's FastPath once it is built (runtime/torch_fast.py)
_fast_run = None            # its run(), bound once for the hot path


def attention(q, k, v, *, causal=False, window=None, bias=None, alibi_slopes=None, dropout_p=0.0, seed=None,
              softcap=None, sink=None, scale=None, return_lse=False, cu_seqlens_q=None, cu_seqlens_k=None,
              registry=None, offset=0, max_seqlen_q=None, max_seqlen_k=None):
    """Forward attention; returns ``out`` or ``(out, lse)`` with ``return_lse=True``.  See the module docstring.

    ``causal``: ``False``/``None``, ``True`` or ``"top_left"`` (``j <= i``), ``"bottom_right"``.
    ``window``: ``(left, right)``, negative = unbounded, bottom-right aligned unless ``causal`` is top-left;
    with ``causal`` set, ``right`` becomes 0.  ``bias``: ``[B|1, Hq|1, Sq, Sk]`` in q's dtype.
    ``alibi_slopes``: ``[Hq]`` or ``[B, Hq]`` float32.  ``softcap``: ``None`` or ``> 0``.  ``sink``: number of
    key columns every masked row also sees.  ``scale``: default ``1/sqrt(Dq)``.
    """
    if type(q) is not _T:
        return _other(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale, return_lse,
                      cu_seqlens_q, cu_seqlens_k, registry, offset, max_seqlen_q, max_seqlen_k)
    if (q.requires_grad or getattr(k, "requires_grad", False) or getattr(v, "requires_grad", False)
            or getattr(bias, "requires_grad", False)) and _torch.is_grad_enabled():
        return _differentiable(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale,
                               return_lse, cu_seqlens_q, cu_seqlens_k, registry, offset, max_seqlen_q, max_seqlen_k)
    # a call of a class already launched (the same shapes but for a key length the same decision serves):
    # replayed in C++ (runtime/torch_fast.cpp).  A bytes token means "new to the fast path": the Python path below
    # runs and records what it launched under that token.
    ftok = None
    if _fast_run is not None:
        ftok = _fast_run(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale,
                         return_lse, cu_seqlens_q, cu_seqlens_k, registry, offset, max_seqlen_q, max_seqlen_k, _JIT)
        if ftok is not None and ftok.__class__ is not bytes:
            return ftok
    # torch tensors.  The common case runs straight through (this is the per-call overhead that
    # bench/bench_dispatch.py measures); every branch that can fail calls a helper that raises.
    if return_lse is not False and return_lse is not True:
        return_lse = flag("return_lse", return_lse)
    if type(k) is not _T or type(v) is not _T:
        _bad_types(k, v)
    dt = q.dtype
    dname = _TORCH_DTYPES.get(dt)
    if dname is None or k.dtype is not dt or v.dtype is not dt:
        _bad_dtypes(q, k, v)
    qsh, ksh, vsh = q.shape, k.shape, v.shape
    group = cu_seqlens_q is not None or cu_seqlens_k is not None
    if group:
        tq, hq, dq, tk, hk, dv = _group_shapes(qsh, ksh, vsh, cu_seqlens_q, cu_seqlens_k)
    else:
        b, hq, sq, dq, hk, sk, dv = _batch_shapes(qsh, ksh, vsh)
    dev = q.get_device()
    if dev < 0 or k.get_device() != dev or v.get_device() != dev:
        _check_devices(q, k, v, registry)
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    if (qs[-1] != 1 or ks[-1] != 1) and dq > 1:
        _bad_strides(q, k)
    if vs[-1] == 1 or dv == 1:
        vc = False
    elif vs[0 if group else 2] == 1:
        vc = True
    else:
        raise _usage("usage.stride", f"`v` needs stride 1 along the head dim (or the key axis), got strides {vs}",
                     "pass v.contiguous()")
    # scalars
    if causal is False and window is None:
        mask, wl, wr, br = "no", -1, -1, 1
    else:
        mask, wl, wr, br = _mask(causal, window)
    if dropout_p:
        seed = _check_dropout(dropout_p, seed, offset)
    elif dropout_p is not None and dropout_p.__class__ not in (float, int):
        _check_dropout(dropout_p, seed, offset)
    if softcap is not None and (softcap.__class__ is not float or not FP32_TINY <= softcap <= SCALAR_MAX):
        _check_softcap(softcap)
    if scale is not None and (scale.__class__ is not float or not -SCALAR_MAX <= scale <= SCALAR_MAX):
        _check_scale(scale)
    if sink:
        if sink.__class__ is not int or sink < 0:
            sink = _check_sink(sink)
        if mask == "no":
            sink = 0  # every column is visible anyway
    elif sink is not None and sink.__class__ is not int:
        sink = _check_sink(sink)
    else:
        sink = 0
    if group:
        cu_seqlens_q, cu_seqlens_k, b, sq, sk = group_lengths(cu_seqlens_q, cu_seqlens_k, tq, tk, dev, max_seqlen_q,
                                                               max_seqlen_k)
    elif max_seqlen_q is not None or max_seqlen_k is not None:
        check_max_lengths(max_seqlen_q, max_seqlen_k, [sq], [sk])
    if bias is None and alibi_slopes is None:
        bias_kind = "no"
        bst = ast = None
    else:
        bias_kind, bst, ast = _check_bias(bias, alibi_slopes, q, b, hq, sq, sk, group, dev)

    # outputs: same memory order as q (a BSHD q gives a BSHD out)
    if dv == dq:
        out = _torch.empty_like(q)
    elif not group and qs[1] < qs[2]:
        out = q.new_empty((b, sq, hq, dv)).transpose(1, 2)
    else:
        out = q.new_empty((tq, hq, dv) if group else (b, hq, sq, dv))
    lse = q.new_empty((hq, tq) if group else (b, hq, sq), dtype=_torch.float32) if return_lse else None
    if (tq == 0 or tk == 0 or b == 0 or hq == 0) if group else (sq == 0 or sk == 0 or b == 0 or hq == 0):
        return _nothing_to_do(out, lse, return_lse)

    if registry is None:
        disp = _JIT.get(dev)
        if disp is None:
            disp = _JIT[dev] = _dispatcher(None, dev)
    elif type(registry) is _Dispatcher:
        disp = registry
    else:
        disp = _dispatcher(registry, dev)
    if dev >= 0:
        ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr(),
                0 if bias is None else bias.data_ptr(), 0 if alibi_slopes is None else alibi_slopes.data_ptr(),
                cu_seqlens_q.data_ptr() if group else 0, cu_seqlens_k.data_ptr() if group else 0]
    else:  # the CPU interpreter takes the tensors themselves
        ptrs = [q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q if group else None, cu_seqlens_k if group else None]
    args = _fwd_args(ptrs, group, qs, ks, vs, out.stride(), None if lse is None else lse.stride(), bst, ast, hq, hk,
                     dq, dv, 0 if group else sq, 0 if group else sk, sq, sk, scale, softcap, dropout_p, seed, offset,
                     wl, wr, br, sink)
    # binaries built with the 16-divisibility promise serve only arguments that keep it (fwd_abi.aligned_names; the
    # others get a variant without it); tests/test_gpu.py runs misaligned pointers and strides through here.  The CPU
    # interpreter takes tensors and has no such promise.
    aligned = dev < 0 or not any(args[i] & 15 for i in _ALIGNED_IDX[vc])
    key = (dname, group, dq, dv, vc, mask != "no", bias_kind, bool(return_lse), bool(dropout_p),
           softcap is not None, sink > 0, aligned, hq // hk, disp.window_key(wl, wr, sk)) + disp.seq_key(sq, sk, b * hq)
    plan = disp.fast.get(key)
    if plan is None:
        plan = _plan(disp, key, dname, group, b, hq, hk, sq, sk, dq, dv, vc, mask, wl, wr, bias_kind, return_lse,
                     dropout_p, softcap, sink, aligned, _measurer(dev, b, hq, sq, args))
        if dev >= 0 and _fast_path is None and disp.arch.startswith("sm"):
            from .runtime import torch_fast

            torch_fast.start(_fast_ready)  # once per process; the Python path serves calls until it is ready
    kern = plan._kernels.get(dev)
    if kern is None or plan._extra_aligned_idx or plan.splits:
        plan.launch(dev, b, hq, sq, args)  # first launch on this device, promises the class key does not cover, or
        # split-KV (two stages and a workspace)
    else:
        grid = _grid_of(plan.packed, b, hq, hk, sq, plan.block_m)  # GQA-packed rows: one program per K/V head
        kern.launch(grid, args, _raw_stream(dev) if dev >= 0 else 0)
    if ftok is not None:
        _teach_fast_path(ftok, disp, plan, dev, b, hq, sq, sk, args, vc, aligned, out, lse)
    return (out, lse) if return_lse else out


def _teach_fast_path(token, disp, plan, dev, b, hq, sq, sk, args, vc, aligned, out, lse) -> None:
    """Hand the torch fast path what this batch-mode call launched, for every call of its class whose key length
    is in the span the decision covers (or decline them, when a kernel is launched by another launcher)."""
    span = disp.seq_span(sq, sk, b * hq)
    replay = plan.replay(dev, b, hq, sq, args)
    if replay is None:
        _fast_path.decline(token, disp, span)
        return
    steps, split = replay
    native = tuple((*spec, grid, a, patches, splits) for _, spec, grid, a, patches, splits in steps)
    _fast_path.commit(token, disp, tuple(st[0] for st in steps), native, span, _ALIGNED_IDX[vc], plan._aligned_idx,
                      aligned, split, out, lse)


def _differentiable(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale, return_lse,
                    cu_seqlens_q, cu_seqlens_k, registry, offset, max_seqlen_q, max_seqlen_k):
    """A call that autograd records (q, k, v or the bias require grad): through the custom ops of
    :mod:`fmha_dsl.autograd`, whose backward runs :func:`fmha_dsl.attention_backward`."""
    from .autograd import attention_autograd

    return_lse = flag("return_lse", return_lse)
    return attention_autograd(attention, q, k, v, causal=causal, window=window, bias=bias, alibi_slopes=alibi_slopes,
                              dropout_p=dropout_p, seed=seed, softcap=softcap, sink=sink, scale=scale,
                              return_lse=return_lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              registry=registry, offset=offset, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)


def _nothing_to_do(out, lse, return_lse):
    """No query row, or no key column: out = 0, lse = -inf (docs/semantics.md), no launch."""
    out.zero_()
    if lse is not None:
        lse.fill_(-math.inf)
    return (out, lse) if return_lse else out


def _other(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale, return_lse,
           cu_seqlens_q, cu_seqlens_k, registry, offset, max_seqlen_q, max_seqlen_k):
    """Everything but a plain torch.Tensor q once torch is loaded: NumPy, the first torch call, subclasses."""
    mod = type(q).__module__ or ""
    if mod.startswith("torch") or _T is not _NoTensor and isinstance(q, _T):
        _init_torch()
        if isinstance(q, _T):
            if type(q) is not _T:  # a Parameter or other subclass: as a plain tensor (autograd still sees it)
                q = q.as_subclass(_T)
            return attention(q, k, v, causal=causal, window=window, bias=bias, alibi_slopes=alibi_slopes,
                             dropout_p=dropout_p, seed=seed, softcap=softcap, sink=sink, scale=scale,
                             return_lse=return_lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             registry=registry, offset=offset, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if mod == "numpy":
        return_lse = flag("return_lse", return_lse)
        check_numpy_call(q, {"k": k, "v": v, "bias": bias, "alibi_slopes": alibi_slopes},
                         {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}, registry, ("k", "v", "bias"))
        return _numpy_attention(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale,
                                return_lse, cu_seqlens_q, cu_seqlens_k, offset, max_seqlen_q, max_seqlen_k)
    raise _usage("usage.type", f"`q` must be a numpy array or a torch tensor, got {type(q).__name__}",
                 "numpy runs the reference; torch GPU tensors run the kernels")


def _init_torch():
    global _T, _torch, _fwd_args, _Dispatcher, _raw_stream, _grid_of
    if _torch is not None:
        return
    import torch

    from .runtime.dispatch import Dispatcher
    from .kernels.fwd_abi import pack as fwd_args

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:  # pragma: no cover  (old torch)
        def raw(dev):
            return torch.cuda.current_stream(dev).cuda_stream
    _torch_dtype_names()
    from .kernels.fwd_abi import ARGS, aligned_names, grid_of

    names = [n for n, _ in ARGS]
    _ALIGNED_IDX.update({vc: tuple(names.index(n) for n in aligned_names("c" if vc else "r")) for vc in (False, True)})
    _fwd_args, _Dispatcher, _raw_stream, _grid_of = fwd_args, Dispatcher, raw, grid_of
    _torch = torch
    _T = torch.Tensor


# ---------------------------------------------------------------------------------------------------------
# NumPy: the reference
# ---------------------------------------------------------------------------------------------------------
def _numpy_attention(q, k, v, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale,
                     return_lse, cu_seqlens_q, cu_seqlens_k, offset, max_seqlen_q, max_seqlen_k):
    import numpy as np

    from .reference import attention_fwd

    check_one_bias(bias, alibi_slopes)
    if seed is None:
        seed = int(np.random.default_rng().integers(0, 1 << 63)) if dropout_p else 0
    try:
        out, lse = attention_fwd(q, k, v, causal=causal, window=window, bias=bias, alibi_slopes=alibi_slopes,
                                 dropout_p=dropout_p, seed=seed, offset=offset, softcap=softcap,
                                 sink=0 if sink is None else sink, scale=scale, cu_seqlens_q=cu_seqlens_q,
                                 cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                 accum=accumulation(q))
    except UsageError as exc:
        raise named(exc) from None
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------------------
# torch: the kernels
# ---------------------------------------------------------------------------------------------------------
def _measurer(dev: int, b: int, hq: int, sq: int, args):
    """``measure(plan, n)`` for a forward call: launches of a candidate plan on this call's own arguments."""
    return _timer(dev, lambda plan: plan.launch(dev, b, hq, sq, args))


def _plan(disp, key, dname, group, b, hq, hk, sq, sk, dq, dv, vlayout_c, mask, wl, wr, bias_kind, return_lse,
          dropout_p, softcap, sink, aligned=True, measure=None):
    from .keys import Problem

    problem = Problem(family="fwd", dtype=dname, arch=disp.arch, batch=max(1, int(b)), nhead_q=int(hq),
                      nhead_k=int(hk), seqlen_q=int(sq), seqlen_k=int(sk), max_seqlen_q=int(sq), max_seqlen_k=int(sk),
                      hdim_q=int(dq), hdim_v=int(dv), mode="group" if group else "batch",
                      vlayout="c" if vlayout_c else "r", mask=mask, window_left=int(wl), window_right=int(wr),
                      bias=bias_kind, lse=bool(return_lse), dropout=bool(dropout_p), logits=softcap is not None,
                      sink=bool(sink))
    before = disp.fast
    plan = disp.plan(problem, aligned, measure)
    if disp.fast is not before:  # a JIT compile re-indexed the dispatcher: every cached decision is redone
        if _fast_path is not None:
            _fast_path.clear()  # and the fast path learns its recipes again
        key = key[:14] + disp.seq_key(sq, sk, b * hq)  # the tile lcm (the key's residues) may have changed
    disp.fast[key] = plan
    return plan


def _fast_ready(mod):
    """Called (in the build thread) once the torch fast path is loaded: attention() starts using it."""
    global _fast_path, _fast_run
    _fast_path = mod.FastPath(_T, _Dispatcher, _raw_stream, "cuda")
    _fast_run = _fast_path.run


class _CallableModule(__import__("types").ModuleType):
    """``import fmha_dsl.attention`` binds the package attribute ``fmha_dsl.attention`` to this module (the
    import system does that for submodules); calling the module calls the function, so ``fmha_dsl.attention(q,
    k, v)`` works whichever of the two the attribute holds."""

    def __call__(self, *args, **kwargs):
        return attention(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
