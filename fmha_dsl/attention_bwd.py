"""``fmha_dsl.attention_backward``: the gradients of attention, on NumPy arrays (the reference) or torch GPU tensors.

    dq, dk, dv = fmha_dsl.attention_backward(q, k, v, out, lse, dout, causal=True)
    dq, dk, dv, dbias = fmha_dsl.attention_backward(q, k, v, out, lse, dout, bias=bias)

``out`` and ``lse`` are the forward's (``attention(..., return_lse=True)``), ``dout`` the gradient of ``out``; every
other keyword is the forward's and must be what the forward was called with (dropout: the same ``seed`` and
``offset``, which recompute the forward's keep-mask exactly).  ``deterministic=True`` sums dQ in a fixed order
(bit-identical results run to run) at the cost of a workspace of one dQ-sized fp32 partial per key block.
``workspace``: a float32 tensor the caller keeps between calls (``Dispatcher.plan(...).workspace_numel(...)``
says its size from upper bounds); default: allocated per call from torch's caching allocator.

* NumPy arrays run :func:`fmha_dsl.reference_bwd.attention_bwd`.
* torch tensors on a GPU run the three-stage Triton backward (:mod:`fmha_dsl.kernels.triton_bwd`), selected and
  compiled on first use like the forward (``registry=None``), or from a build that declares the backward family.
  Gradients come back in the memory order of their inputs; ``dbias`` has the bias's shape (summed over its
  broadcast dims).  Group mode with ``max_seqlen_q/k`` given reads nothing back to the host.

:func:`fmha_dsl.attention` on tensors that require grad goes through this (``torch.library`` custom ops,
:mod:`fmha_dsl.autograd`).  Every bad input is a :class:`~fmha_dsl.errors.UsageError` naming the argument.
"""

from __future__ import annotations

from .attention_args import (CALLER, torch_dtype_names, _bad_dtypes, _bad_types, _batch_shapes, _check_bias,
                             _check_devices, _check_dropout, _check_scale, _check_sink, _check_softcap,
                             _group_shapes, _mask, _usage, accumulation, check_dropout_p, check_numpy_call,
                             check_one_bias, flag, named)
from .errors import UsageError
from .index_args import check_max_lengths, group_lengths

__all__ = ["attention_backward", "compile_backward_ahead"]


def attention_backward(q, k, v, out, lse, dout, *, causal=False, window=None, bias=None, alibi_slopes=None,
                       dropout_p=0.0, seed=None, softcap=None, sink=None, scale=None, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, offset=0, deterministic=False,
                       registry=None, workspace=None):
    """``(dq, dk, dv)``, plus ``dbias`` when a bias is given.  See the module docstring."""
    token = CALLER.set("attention_backward()")
    try:
        if deterministic is not False and deterministic is not True:
            deterministic = flag("deterministic", deterministic)
        mod = type(q).__module__ or ""
        if mod == "numpy":
            check_numpy_call(q, {"k": k, "v": v, "out": out, "lse": lse, "dout": dout, "bias": bias,
                                 "alibi_slopes": alibi_slopes}, {"cu_seqlens_q": cu_seqlens_q,
                                                                 "cu_seqlens_k": cu_seqlens_k}, registry,
                             ("k", "v", "out", "dout", "bias"), workspace)
            return _numpy(q, k, v, out, lse, dout, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink,
                          scale, cu_seqlens_q, cu_seqlens_k, offset, max_seqlen_q, max_seqlen_k)
        if not mod.startswith("torch"):
            raise _usage("usage.type", f"`q` must be a numpy array or a torch tensor, got {type(q).__name__}",
                         "numpy runs the reference; torch GPU tensors run the kernels")
        return _torch_backward(q, k, v, out, lse, dout, causal, window, bias, alibi_slopes, dropout_p, seed, softcap,
                               sink, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, offset,
                               bool(deterministic), registry, workspace)
    finally:
        CALLER.reset(token)


def _numpy(q, k, v, out, lse, dout, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink, scale,
           cu_seqlens_q, cu_seqlens_k, offset, max_seqlen_q, max_seqlen_k):
    from .reference_bwd import attention_bwd

    check_dropout_p(dropout_p)   # (before its truth is asked: an array would raise)
    if dropout_p and seed is None:
        _missing_seed()
    check_one_bias(bias, alibi_slopes)
    try:
        dq, dk, dv, db = attention_bwd(q, k, v, out, lse, dout, causal=causal, window=window, bias=bias,
                                       alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                                       seed=0 if seed is None else seed, offset=offset,
                                       softcap=softcap, sink=0 if sink is None else sink, scale=scale,
                                       cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                       max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                       accum=accumulation(q))
    except UsageError as exc:
        raise named(exc) from None
    return (dq, dk, dv) if db is None else (dq, dk, dv, db)


def _torch_backward(q, k, v, out, lse, dout, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink,
                    scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, offset, deterministic, registry,
                    workspace):
    import torch

    from . import replay as _replay
    from .api_dispatch import dispatcher, timer
    T = torch.Tensor
    # a call like one already launched (same shapes, strides, dtypes, devices and scalars; no dropout, no bias, the
    # workspace ours, group mode with its maxima given): its recorded launches replayed with this call's addresses
    # (fmha_dsl/replay.py; in C++ by the torch fast path's Replayer) -- a training loop's backward skips the checks
    # and the packing below
    call = None
    if not dropout_p and bias is None and workspace is None and (
            cu_seqlens_q is None and cu_seqlens_k is None or max_seqlen_q is not None and max_seqlen_k is not None):
        _replay.start()
        call = ((q, k, v, out, lse, dout, None, None, None, None, alibi_slopes, cu_seqlens_q, cu_seqlens_k),
                ("bwd", causal, window, softcap, sink, scale, max_seqlen_q, max_seqlen_k, bool(deterministic),
                 _replay.registry_key(registry)))
        made = _replay.run(*call)
        if made is not None:
            return _result(made[0], made[1], made[2], None, None)
    if not isinstance(k, T) or not isinstance(v, T):
        _bad_types(k, v)
    for name, x in (("out", out), ("lse", lse), ("dout", dout)):
        if not isinstance(x, T):
            raise _usage("usage.type", f"`{name}` must be a torch tensor like q, got {type(x).__name__}",
                         "pass the forward's out and lse (return_lse=True) and the gradient of out")
    q, k, v, out, dout = (x.detach() for x in (q, k, v, out, dout))
    dt = q.dtype
    dname = torch_dtype_names().get(dt)
    if dname is None or k.dtype != dt or v.dtype != dt:
        _bad_dtypes(q, k, v)
    for name, x in (("out", out), ("dout", dout)):
        if x.dtype != dt:
            raise _usage("usage.dtype", f"`{name}` must have q's dtype {dt}, got {x.dtype}",
                         "out and dout are the forward's output and its gradient, in q's dtype")
    if lse.dtype != torch.float32:
        raise _usage("usage.dtype", f"`lse` must be float32 (the forward's), got {lse.dtype}",
                     "call the forward with return_lse=True")
    group = cu_seqlens_q is not None or cu_seqlens_k is not None
    qsh, ksh, vsh = q.shape, k.shape, v.shape
    if group:
        tq, hq, dq, tk, hk, dv = _group_shapes(qsh, ksh, vsh, cu_seqlens_q, cu_seqlens_k)
    else:
        b, hq, sq, dq, hk, sk, dv = _batch_shapes(qsh, ksh, vsh)
    want_o = tuple(qsh[:-1]) + (dv,)
    for name, x in (("out", out), ("dout", dout)):
        if tuple(x.shape) != want_o:
            raise _usage("usage.shape", f"`{name}` must have the forward output's shape {list(want_o)}, got "
                         f"{list(x.shape)}", "pass the forward's out and a dout of its shape")
    want_l = (hq, tq) if group else (b, hq, sq)
    if tuple(lse.shape) != want_l:
        raise _usage("usage.shape", f"`lse` must be the forward's LSE of shape {list(want_l)}, got {list(lse.shape)}",
                     "call the forward with return_lse=True")
    dev = q.get_device()
    if dev < 0 or k.get_device() != dev or v.get_device() != dev:
        _check_devices(q, k, v, registry)
    for name, x in (("out", out), ("lse", lse), ("dout", dout)):
        if x.get_device() != dev:
            raise _usage("usage.device", f"`{name}` is on {x.device} but q is on {q.device}",
                         f"move it with {name}.to(q.device)")
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)):
        if x.stride(-1) != 1 and x.shape[-1] > 1:
            raise _usage("usage.stride", f"`{name}`'s last dim (head dim) must have stride 1, got strides "
                         f"{x.stride()}", f"pass {name}.contiguous(); the other dims may be strided")
    if lse.stride(-1) != 1 and lse.shape[-1] > 1:
        raise _usage("usage.stride", f"`lse` must be contiguous along its last dim, got strides {lse.stride()}",
                     "pass lse.contiguous()")
    mask, wl, wr, br = _mask(causal, window)
    if dropout_p:
        if seed is None:
            _missing_seed()
        seed = _check_dropout(dropout_p, seed, offset)
    elif dropout_p is not None and dropout_p.__class__ not in (float, int):
        _check_dropout(dropout_p, seed, offset)
    if softcap is not None:
        _check_softcap(softcap)
    if scale is not None:
        _check_scale(scale)
    if sink is not None:
        _check_sink(sink)
    sink = int(sink or 0) if mask != "no" else 0
    if group:
        cu_seqlens_q, cu_seqlens_k, b, sq, sk = group_lengths(cu_seqlens_q, cu_seqlens_k, tq, tk, dev, max_seqlen_q,
                                                               max_seqlen_k)
    elif max_seqlen_q is not None or max_seqlen_k is not None:
        check_max_lengths(max_seqlen_q, max_seqlen_k, [sq], [sk])
    bias_kind = "no"
    if bias is not None or alibi_slopes is not None:
        bias_kind, _, _ = _check_bias(bias, alibi_slopes, q, b, hq, sq, sk, group, dev)
    if bias is not None:
        bias = bias.detach()

    dqt, dkt, dvt = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = None if bias is None else torch.zeros((b, hq, sq, sk), dtype=dt, device=q.device)
    empty = (tq == 0 or tk == 0) if group else (sq == 0 or sk == 0)
    if empty or b == 0 or hq == 0:
        for x in (dqt, dkt, dvt):
            x.zero_()
        return _result(dqt, dkt, dvt, dbias, bias)

    disp = dispatcher(registry, dev)
    kw = {"dbias": dbias, "bias": bias, "alibi_slopes": alibi_slopes, "cu_seqlens_q": cu_seqlens_q if group else None,
          "cu_seqlens_k": cu_seqlens_k if group else None, "max_seqlen_q": sq, "max_seqlen_k": sk, "scale": scale,
          "softcap": softcap, "dropout_p": dropout_p or 0.0, "seed": seed or 0, "offset": offset, "window": (wl, wr),
          "bottom_right": bool(br), "sink": sink}
    tensors = (q, k, v, out, lse, dout, dqt, dkt, dvt)
    aligned = dev < 0 or _aligned(tensors)
    # the plans of this call's class, by a plain tuple (a training loop's repeat calls build no Problem)
    cls = (dname, group, dq, dv, mask != "no", bias_kind, bool(dropout_p), softcap is not None, sink > 0,
           bias is not None, deterministic, aligned, hq // hk, disp.window_key(wl, wr, sk))
    cache = disp.fast_bwd
    plan = cache.get(cls + disp.seq_key(sq, sk, b * hq))
    if plan is None:
        problem = _problem(disp.arch, dname, group, b, hq, hk, sq, sk, dq, dv, mask, wl, wr, bias_kind, dropout_p,
                           softcap, sink, bias is not None, deterministic)
        plan = disp.plan(problem, aligned, timer(dev, lambda pl: pl.run(*tensors, **kw)))
        cache[cls + disp.seq_key(sq, sk, b * hq)] = plan  # (a first-use compile may have re-indexed the dispatcher)
    steps, buf = plan.run(*tensors, workspace=workspace, **kw)
    if call is not None and steps and (not group or call[0][11] is cu_seqlens_q and call[0][12] is cu_seqlens_k):
        t = list(call[0])  # (group mode: only the caller's own cu_seqlens tensors are replayable)
        t[6:10] = dqt, dkt, dvt, buf
        _replay.record(tuple(t), {6, 7, 8, 9}, call[1], plan, steps, zeroed={9} if plan.accumulates else ())
    return _result(dqt, dkt, dvt, dbias, bias)


def _problem(arch, dname, group, b, hq, hk, sq, sk, dq, dv, mask, wl, wr, bias_kind, dropout_p, softcap, sink, dbias,
             deterministic):
    """The backward's problem (its dispatcher decision's key) from the call's checked arguments."""
    from .keys import Problem

    return Problem(family="bwd_dq_dk_dv", dtype=dname, arch=arch, batch=max(1, int(b)), nhead_q=int(hq),
                   nhead_k=int(hk), seqlen_q=int(sq), seqlen_k=int(sk), max_seqlen_q=int(sq), max_seqlen_k=int(sk),
                   hdim_q=int(dq), hdim_v=int(dv), mode="group" if group else "batch", mask=mask,
                   window_left=int(wl), window_right=int(wr), bias=bias_kind, dropout=bool(dropout_p),
                   logits=softcap is not None, sink=sink > 0, dbias=dbias, deterministic=deterministic)


_AHEAD_SEEN: set = set()  # the training forwards' classes whose backward was named ahead (at most _AHEAD_SEEN_MAX)
_AHEAD_SEEN_MAX = 4096


def compile_backward_ahead(q, k, v, *, causal, window, bias, alibi_slopes, dropout_p, softcap, sink, cu_seqlens_q,
                           cu_seqlens_k, max_seqlen_q, max_seqlen_k, registry):
    """Before a training forward (the autograd route of :func:`fmha_dsl.attention`, called with the backward's own
    keywords): name its backward's problem to the dispatcher, which has first use's builder compile that problem's
    candidates in the background after the forward's own (:meth:`MeasuredSelection.compile_ahead
    <fmha_dsl.runtime.autotune.MeasuredSelection.compile_ahead>`): the backward's first call then finds them
    compiled.  Returns the dispatcher when it queued something (the caller starts what the forward did not take:
    ``start_ahead()``), else None -- for a class seen before, a decided or prebuilt one, and any argument the forward
    will reject (it reports that itself).  Group mode only with ``max_seqlen_q/k`` given (nothing is read back)."""
    import torch

    group = cu_seqlens_q is not None or cu_seqlens_k is not None
    if group and (max_seqlen_q is None or max_seqlen_k is None):
        return None
    det = torch.are_deterministic_algorithms_enabled()
    try:
        seen = (q.shape, k.shape, v.shape, q.dtype, q.device, causal, window, None if bias is None else bias.shape,
                alibi_slopes is None, bool(dropout_p), softcap is None, sink, max_seqlen_q, max_seqlen_k, det,
                registry if registry is None or isinstance(registry, str) else id(registry))
        if seen in _AHEAD_SEEN:
            return None
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: the forward says what is wrong
        return None
    if len(_AHEAD_SEEN) >= _AHEAD_SEEN_MAX:
        _AHEAD_SEEN.clear()
    _AHEAD_SEEN.add(seen)
    try:
        dname = torch_dtype_names().get(q.dtype)
        dev = q.get_device()
        if dname is None or k.dtype != q.dtype or v.dtype != q.dtype or dev < 0:
            return None
        if group:
            _, hq, dq, _, hk, dv = _group_shapes(q.shape, k.shape, v.shape, cu_seqlens_q, cu_seqlens_k)
            b, sq, sk = cu_seqlens_q.shape[0] - 1, int(max_seqlen_q), int(max_seqlen_k)
        else:
            b, hq, sq, dq, hk, sk, dv = _batch_shapes(q.shape, k.shape, v.shape)
        mask, wl, wr, _ = _mask(causal, window)
        sink = int(sink or 0) if mask != "no" else 0
        bias_kind = "no"
        if bias is not None or alibi_slopes is not None:
            bias_kind = _check_bias(bias, alibi_slopes, q, b, hq, sq, sk, group, dev)[0]
        from .api_dispatch import dispatcher

        disp = dispatcher(registry, dev)
        p = _problem(disp.arch, dname, group, b, hq, hk, sq, sk, dq, dv, mask, wl, wr, bias_kind, dropout_p, softcap,
                     sink, bias is not None, det)
        # (the gradients are made like q, k and v; out and dO are contiguous as a rule)
        return disp if disp.compile_ahead(p, _all_aligned((q, k, v))) else None
    except Exception:  # noqa: BLE001  (compiling ahead only saves time: the forward and backward report errors)
        _AHEAD_SEEN.discard(seen)  # (e.g. tensors without storage: a later call of the class may name it)
        return None


def _missing_seed():
    raise _usage("usage.value", "dropout needs the forward's seed: pass seed=", "the keep-mask is recomputed from "
                 "(seed, offset); call the forward with an explicit seed")


def _result(dq, dk, dv, dbias, bias):
    if bias is None:
        return dq, dk, dv
    dims = tuple(i for i in range(2) if bias.shape[i] == 1 and dbias.shape[i] != 1)
    if dims:
        dbias = dbias.float().sum(dim=dims, keepdim=True).to(bias.dtype)
    return dq, dk, dv, dbias


def _aligned(tensors) -> bool:
    """The backward's 16-divisibility promise (:data:`fmha_dsl.kernels.bwd_abi.ALIGNED` and the 1-d stages'
    ``DOT_ALIGNED`` / ``CONVERT_ALIGNED``): 16-byte aligned bases and every non-unit stride a multiple of 16
    elements, for q, k, v, the output, dO and the gradients."""
    q, k, v, out, lse, dout, dq, dk, dv = tensors
    return _all_aligned((q, k, v, out, dout, dq, dk, dv))


def _all_aligned(xs) -> bool:
    return not any(x.data_ptr() & 15 or any(s & 15 for s in x.stride()[:-1]) for x in xs)

