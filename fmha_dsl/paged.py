"""``fmha_dsl.paged_attention`` and ``fmha_dsl.append_kv``: the serving API over a paged KV cache.

    out = fmha_dsl.paged_attention(q, k_cache, v_cache, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                                   max_seqlen_q=mq, max_seqlen_k=mk, causal=True)
    fmha_dsl.append_kv(k_cache, v_cache, k_new, v_new, kv_indptr=ip, kv_indices=ix, seqlens_k=lens,
                       cu_seqlens_new=cn, rotary_cos=cos, rotary_sin=sin, q=q)      # in place

What they compute is docs/semantics.md ("Paged KV cache and append-KV"), the NumPy twins being
:func:`fmha_dsl.reference_paged.paged_attention` and :func:`~fmha_dsl.reference_paged.append_kv`.

* ``q [Tq, Hq, D]`` (group mode: ``cu_seqlens_q [B + 1]``); caches ``[num_pages, page_size, Hk, D]`` (linear, NHD;
  any strides with a unit head-dim stride, so an HND cache passed as a permuted view works too; the page size is the
  cache's second dim) or CK's vectorized layout, 5-D: K ``[num_pages, Hk, D / x, page_size, x]``, V
  ``[num_pages, Hk, page_size / x, D, x]`` with x = 8 for fp16/bf16 (16-byte vectors;
  :func:`fmha_dsl.reference_paged.vectorized_caches` converts).  Page tables: vLLM's ``block_table [B, max_pages]``
  or SGLang's ``kv_indptr [B + 1]`` + ``kv_indices``, exactly one.  ``seqlens_k [B]``: cached tokens per sequence.
* NumPy arrays run the reference (``append_kv`` then writes into the given arrays).
* torch tensors on a GPU run the Triton serving kernels, compiled and chosen on first use per problem class
  (:mod:`fmha_dsl.first_use`): decode-sized problems (few query blocks) also get the split-KV kernels
  (``fwd_pagedkv``, with the forward family's combine kernel), and the timing decides.
* A prefill-sized call (at least 128 query rows per K/V head) also has the gathered route timed on first use: its
  cached K/V copied into contiguous rows (a workspace of ``B x max_seqlen_k`` rows, at most ``FMHA_DSL_GATHER_MIB``),
  then the forward family's kernels (:mod:`fmha_dsl.runtime.plan_gather`); the faster route is kept, and
  recorded with the first-use decisions in the cache, so a later process takes it without timing it again.
* A server step: pass ``max_seqlen_q``/``max_seqlen_k`` (``max_seqlen_new`` for ``append_kv``) and, for split-KV
  plans, a ``workspace`` (``fmha_dsl.paged.workspace_numel``): then nothing reads device memory on the host and
  nothing is allocated, and the call is CUDA-graph capturable.  Without the maxima the lengths and tables are read
  back once and fully checked (page ids inside the cache, enough pages for every sequence).  Inside the kernels a page
  id is clamped into the cache and a sequence never reads past its table: a bad table gives wrong numbers, never an
  illegal address.
"""

from __future__ import annotations

import math

from . import api_dispatch as _api
from . import paged_numpy
from . import replay as _fast
from .attention_args import (CALLER, _mask, _usage, as_bool, causal_mode, check_numpy_call, flag,
                             torch_dtype_names)
from .errors import UsageError, error
from .index_args import max_len
from .kernels.paged_abi import FP8_DTYPES
from .paged_args import (append_descales, cache_pair, check_scalars, check_tables_on_host, contiguous_rows,
                         host_values, required, rotary_tables, sequences, tables,
                         within_capacity, workspace_args)
from .paged_args import descales as check_descales

__all__ = ["paged_attention", "append_kv", "workspace_numel"]


def _is_torch(x) -> bool:
    return (type(x).__module__ or "").startswith("torch")


def _is_fp8(x) -> bool:
    """Whether torch tensor ``x`` holds FP8 e4m3 (``torch.float8_e4m3fn``, CK's ``fp8bf16`` storage)."""
    return str(x.dtype) == "torch.float8_e4m3fn"


def _dtype_name(q):
    """The key dtype of ``q``'s torch dtype: fp16, bf16, fp32, or CK's FP8 contract ``fp8bf16`` for
    ``torch.float8_e4m3fn`` (e4m3 inputs, bf16 output)."""
    name = torch_dtype_names().get(q.dtype)
    if name is None and _is_fp8(q):
        return FP8_DTYPES[0]
    if name is None:
        raise _usage("usage.dtype", f"`q` must be float16, bfloat16, float32 or float8_e4m3fn, got {q.dtype}",
                     "convert with q.half()")
    return name


def paged_attention(q, k_cache, v_cache, *, block_table=None, kv_indptr=None, kv_indices=None, seqlens_k=None,
                    cu_seqlens_q=None, max_seqlen_q=None, max_seqlen_k=None, causal=False, window=None,
                    alibi_slopes=None, softcap=None, sink=None, scale=None, return_lse=False, registry=None, out=None,
                    workspace=None, q_descale=None, k_descale=None, v_descale=None):
    """Attention of ``q [Tq, Hq, D]`` over the paged cache; returns ``out [Tq, Hq, Dv]`` (or ``(out, lse [Hq, Tq])``
    with ``return_lse``).  FP8 (CK's ``fp8bf16``): q and both caches ``torch.float8_e4m3fn`` with per-tensor
    ``q_descale``/``k_descale``/``v_descale`` (float32 tensors of one element on the device; NumPy: numbers, the
    arrays holding the e4m3 values) -- or, CK's KV block scales, ``k_descale``/``v_descale`` both ``[num_pages, Hk]``
    (one per page and K/V head, any strides), or CK's per-token-head scales, both ``[num_pages, page_size, Hk]`` with
    ``q_descale`` one element or ``[Tq, Hq]``; the result is bfloat16. Masks, ALiBi, soft-cap, sink tokens and scale as
    :func:`fmha_dsl.attention` (the mask's bottom-right corner is each sequence's last cached key), except that
    ``causal=True`` is bottom-right aligned here: a sequence's queries are its last tokens (as in FlashAttention-2's
    varlen and FlashInfer); ``causal="top_left"`` aligns the first query with the first key. ``out``: a preallocated
    output; ``workspace``: a float32 buffer of :func:`workspace_numel` elements for split-KV plans (see the module
    docstring)."""
    if seqlens_k is None or cu_seqlens_q is None:
        required("paged_attention()", seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q)
    causal = causal_mode(causal, "bottom_right", "paged_attention()")
    if return_lse is not True and return_lse is not False:
        return_lse = flag("return_lse", return_lse, "paged_attention()")
    descales = (q_descale, k_descale, v_descale)
    torch_in = _is_torch(q)
    # the call for the replay path (fmha_dsl/replay.py): tensors in a fixed order (out, lse and the workspace
    # at 3, 4 and 11, allocated by the recipe when the call leaves them None), then the other arguments
    call = None
    if torch_in and max_seqlen_q is not None and max_seqlen_k is not None:
        call = ((q, k_cache, v_cache, out, None, alibi_slopes, cu_seqlens_q, seqlens_k, block_table, kv_indptr,
                 kv_indices, workspace, *descales),
                ("paged", max_seqlen_q, max_seqlen_k, causal, window, softcap, sink, scale, bool(return_lse),
                 _fast.registry_key(registry)))
        made = _fast.run(*call)
        if made is not None:  # a call like one already launched: replayed with this call's addresses
            o = made[0] if out is None else out
            lse = made[0 if out is not None else 1] if return_lse else None
            return (o, lse) if return_lse else o
    token = CALLER.set("paged_attention()")
    try:
        if not torch_in:  # NumPy arrays run the reference
            check_numpy_call(q, {"k_cache": k_cache, "v_cache": v_cache, "alibi_slopes": alibi_slopes},
                             {"block_table": block_table, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
                              "seqlens_k": seqlens_k, "cu_seqlens_q": cu_seqlens_q, "q_descale": q_descale,
                              "k_descale": k_descale, "v_descale": v_descale}, registry, workspace=workspace)
            return paged_numpy.paged(q, k_cache, v_cache, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_q,
                                     causal, window, alibi_slopes, softcap, sink, scale, return_lse, descales, out,
                                     max_seqlen_q, max_seqlen_k)
        if workspace is not None:  # (whether or not the plan first use picks reads it)
            from .runtime.plan import WORKSPACE_HINT, check_workspace_kind

            check_workspace_kind(workspace, q.device, WORKSPACE_HINT)
        plan, dev, b, hq, msq, args, out, lse, used = _prepare(
            q, k_cache, v_cache, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_q, max_seqlen_q,
            max_seqlen_k, causal, window, alibi_slopes, softcap, sink, scale, return_lse, registry, out, descales)
        if plan is not None:
            steps, buf = plan.launch(dev, b, hq, msq, args, workspace=workspace)
            mine = (cu_seqlens_q, seqlens_k, block_table if block_table is not None else kv_indices, kv_indptr)
            if call is not None and all(a is b for a, b in zip(used, mine)):  # the caller's own tensors: replayable
                t = list(call[0])
                t[3], t[4] = out, lse
                if buf is not None:  # (a plan without split-KV leaves a caller's workspace unused)
                    t[11] = buf
                allocated = {i for i, mine in ((3, call[0][3]), (4, None), (11, workspace))
                             if mine is None and t[i] is not None}
                _fast.record(tuple(t), allocated, call[1], plan, steps)
    finally:
        CALLER.reset(token)
    return (out, lse) if return_lse else out


def workspace_numel(q, k_cache, v_cache, *, batch: int, max_seqlen_q: int, max_seqlen_k: int, registry=None) -> int:
    """fp32 elements of a workspace that serves every :func:`paged_attention` call of these tensors' shapes within
    these bounds, whichever plan its first use selects (a split-KV plan needs at most this much; a prefill that may
    take the gathered route -- its K/V copied contiguous, ``batch x max_seqlen_k`` rows, at most
    ``FMHA_DSL_GATHER_MIB`` -- that copy's size).  Allocate it once and pass it as ``workspace=`` each step."""
    from .kernels.paged_abi import gather_numel, workspace_bound
    from .runtime.plan_gather import fits
    from .runtime.plan_paged import geometry

    if not _is_torch(q):
        raise error("usage.type", f"workspace_numel(): `q` must be a torch tensor on the GPU, got {type(q).__name__}",
                    None, "a workspace serves the kernels; NumPy arrays run the reference, which needs none",
                    cls=UsageError)
    token = CALLER.set("workspace_numel()")
    try:
        workspace_args(q, k_cache, v_cache, batch, max_seqlen_q, max_seqlen_k, registry)
        dname = _dtype_name(q)
        disp = _api.dispatcher(registry, q.get_device())
        _, _, hk, dk, dv, _, _ = geometry(k_cache, v_cache)
        n = workspace_bound(batch, q.shape[1], hk, max_seqlen_q, max_seqlen_k, dv, disp.compute_units)
        if fits(dname, dk, dv, batch, q.shape[1], hk, max_seqlen_q, max_seqlen_k):  # the gathered route's copy
            n = max(n, gather_numel(batch, hk, max_seqlen_k, dk, dv, dname))
        return n
    finally:
        CALLER.reset(token)


def _problem(disp, dname, qscale, b, hq, hk, msq, msk, dq, dv, mask, wl, wr, alibi, lse, softcap, sink, layout, lookup,
             page):
    from .keys import Problem

    return Problem(family="batch_prefill", dtype=dname, qscale=qscale, arch=disp.arch,
                   batch=max(1, int(b)), nhead_q=int(hq), nhead_k=int(hk), seqlen_q=int(msq), seqlen_k=int(msk),
                   max_seqlen_q=int(msq),
                   max_seqlen_k=int(msk), hdim_q=int(dq), hdim_v=int(dv), mode="group", mask=mask,
                   window_left=int(wl), window_right=int(wr), bias="alibi" if alibi else "no", lse=bool(lse),
                   logits=bool(softcap), sink=bool(sink), paged_kv=True, kv_layout=layout, kv_lookup=lookup,
                   page_size=int(page))


def _prepare(q, k_cache, v_cache, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_q, max_seqlen_q,
             max_seqlen_k, causal, window, alibi_slopes, softcap, sink, scale, return_lse, registry, out, descales):
    import torch

    from .kernels import paged_abi

    _fast.start()
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise _usage("usage.shape", f"`q` must be a 3-D torch tensor [Tq, Hq, D], got "
                     f"{tuple(getattr(q, 'shape', ()))}", "queries of every sequence, concatenated (group mode)")
    dname = _dtype_name(q)
    dev = q.get_device()
    if dev < 0 and not (registry is not None and getattr(registry, "launcher", None) == "interpret"):
        raise _usage("usage.device", f"`q` is on {q.device}; torch tensors run on a GPU",
                     "move the tensors with .cuda(), or pass numpy arrays to run the reference")
    tq, hq, dq = q.shape
    layout, num_pages, page, hk, dk, dv = cache_pair(k_cache, v_cache, q.dtype, dev)
    if page & (page - 1):
        raise _usage("usage.shape", f"the caches' page size must be a power of two for the kernels, got {page} (the "
                     "caches' page_size dim)", "allocate pages of 1, 16, 64 or 1024 tokens, for example (numpy "
                     "arrays run the reference, which takes any page size)")
    descales, qscale = check_descales(dname, descales, dev, (num_pages, hk), page=page, tokens=(tq, q.shape[1]))
    odt = torch.bfloat16 if dname in FP8_DTYPES else q.dtype   # CK's FP8 contract writes bf16
    if dk != dq:
        raise _usage("usage.shape", f"`k_cache`'s head dim ({dk}) must equal q's ({dq})",
                     "q and K share the head dim (V's may differ)")
    if hk < 1 or hq % hk:
        raise _usage("usage.shape", f"q's heads ({hq}) must be a multiple of the caches' ({hk}) (GQA/MQA)",
                     "the caches are [num_pages, page_size, Hk, D]; Hq = group x Hk")
    if q.stride(2) != 1 and dq > 1:
        raise _usage("usage.stride", f"`q`'s head dim must have stride 1, got strides {q.stride()}",
                     "pass q.contiguous()")
    reads = max_seqlen_q is None or max_seqlen_k is None   # (device values are read back: wide ones checked too)
    cq, b, lens, _, msq = sequences("cu_seqlens_q", cu_seqlens_q, tq, seqlens_k, dev, max_seqlen_q, "max_seqlen_q",
                                    "the longest query sequence", "[B] int32 cached tokens per sequence", reads)
    lookup, bt, ip, ix = tables(block_table, kv_indptr, kv_indices, b, dev, reads)
    if max_seqlen_k is None:  # read the lengths and tables back once, and check them fully
        lv, btv, ipv, ixv = host_values(lens, bt, ip, ix)
        check_tables_on_host(btv, ipv, ixv, lv, page, num_pages)
        msk = max_len("max_seqlen_k", None, lv, "the longest cached sequence")
    else:
        msk = max_len("max_seqlen_k", max_seqlen_k, None, "the longest cached sequence")
        if lookup == "vllm" and bt.shape[1] * page < msk:
            raise _usage("usage.value", f"max_seqlen_k={msk} needs {-(-msk // page)} pages of {page} per sequence, "
                         f"block_table has {bt.shape[1]} columns", "widen the block table or lower max_seqlen_k")
    mask, wl, wr, br = _mask(causal, window)
    check_scalars(softcap, scale, sink)
    sink = int(sink or 0) if mask != "no" else 0
    if alibi_slopes is not None:
        from .attention_args import _check_bias

        _check_bias(None, alibi_slopes, q, b, hq, msq, msk, True, dev)
    if out is None:
        out = q.new_empty((tq, hq, dv), dtype=odt)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (tq, hq, dv) or out.dtype != odt
          or out.get_device() != dev or out.stride(2) != 1):
        raise _usage("usage.value", f"`out` must be a [{tq}, {hq}, {dv}] {odt} tensor on q's device with a "
                     f"unit head-dim stride, got {tuple(getattr(out, 'shape', ()))} {getattr(out, 'dtype', '')}",
                     "or leave out=None")
    lse = q.new_empty((hq, tq), dtype=torch.float32) if return_lse else None
    if tq == 0 or b == 0:
        if lse is not None:
            lse.fill_(-math.inf)
        return None, dev, b, hq, msq, None, out, lse, None
    from .runtime.plan_paged import pack_call

    disp = _api.dispatcher(registry, dev)
    objects = dev < 0
    args = pack_call(q, k_cache, v_cache, out, lse, lookup=lookup, seqlens_k=lens, cu_seqlens_q=cq, max_seqlen_q=msq,
                     max_seqlen_k=msk, block_table=bt, kv_indptr=ip, kv_indices=ix, alibi_slopes=alibi_slopes,
                     scale=scale, softcap=softcap, window=(wl, wr), bottom_right=br, sink=sink, descales=descales,
                     objects=objects)
    # binaries built with the 16-divisibility promise (and the TMA kernels, which also need each page's rows to follow
    # the previous page's: a linear NHD cache) serve only arguments that keep it; the others get builds without it
    aligned = objects or (not any(args[i] & 15 for i in paged_abi.ALIGNED_AT) and num_pages * page < 1 << 31 and (
        layout == "vectorized" or (k_cache.stride(0) == page * k_cache.stride(1)
                                   and v_cache.stride(0) == page * v_cache.stride(1))))
    key = (dname, qscale, dq, dv, hq, hk, mask != "no", alibi_slopes is not None, bool(return_lse), softcap is not None,
           sink > 0, layout, lookup, page, aligned, disp.window_key(wl, wr, msk)) + disp.seq_key(msq, msk, b * hq)
    plan = disp.fast_paged.get(key)
    if plan is None:
        problem = _problem(disp, dname, qscale, b, hq, hk, msq, msk, dq, dv, mask, wl, wr, alibi_slopes is not None,
                           return_lse, softcap is not None, sink, layout, lookup, page)
        measure = _api.timer(dev, lambda p: p.launch(dev, b, hq, msq, args))
        from .runtime.plan_gather import with_gathered

        # a prefill may run faster on its K/V copied contiguous: with_gathered times that route against the plan
        plan = disp.fast_paged[key] = with_gathered(disp, disp.plan(problem, aligned, measure), problem, aligned, dev,
                                                    b, hq, msq, args, lambda launch: _api.timer(dev, launch))
    return plan, dev, b, hq, msq, args, out, lse, (cq, lens, ix if lookup == "sglang" else bt, ip)


def append_kv(k_cache, v_cache, k_new, v_new, *, block_table=None, kv_indptr=None, kv_indices=None, seqlens_k=None,
              cu_seqlens_new=None, max_seqlen_new=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
              q=None, k_descale=None, v_descale=None, registry=None) -> None:
    """Write ``k_new``/``v_new [Tnew, Hk, D|Dv]`` (``cu_seqlens_new [B + 1]``) into each sequence's tokens
    ``seqlens_k[b] ...`` of the cache, in place, RoPE applied to the new K (and to ``q [Tnew, Hq, D]``, in place) at
    those positions when ``rotary_cos``/``rotary_sin [max_position, rotary_dim / 2]`` are given: pairs ``(2i, 2i + 1)``
    with ``rotary_interleaved``, else ``(i, i + rotary_dim / 2)``.  Without a page table the caches are contiguous
    ``[B, capacity, Hk, D]``.  ``seqlens_k`` is not updated (the caller's bookkeeping: add the new lengths).
    FP8 caches (``torch.float8_e4m3fn``, CK's ``fp8bf16``): ``k_new``/``v_new`` (and ``q``) are bfloat16 and
    ``k_descale``/``v_descale`` (float32 tensors on the device, the ones attention reads: one element each, or
    ``[num_pages, Hk]`` block scales -- a contiguous cache's pages are its sequences) quantize each new row by its
    page's and head's: ``e4m3(clamp(x / descale, -448, 448))``, RoPE applied first; q is rotated in bfloat16."""
    if rotary_interleaved is not False and rotary_interleaved is not True:
        rotary_interleaved = as_bool(rotary_interleaved)
    if rotary_interleaved is not False and rotary_interleaved is not True:
        raise error("usage.type", f"append_kv(): rotary_interleaved must be True or False, got {rotary_interleaved!r}",
                    None, "True: pairs (2i, 2i + 1) (GPT-J); False: (i, i + rotary_dim / 2) (GPT-NeoX)",
                    cls=UsageError)
    if seqlens_k is None or cu_seqlens_new is None:
        required("append_kv()", seqlens_k=seqlens_k, cu_seqlens_new=cu_seqlens_new)
    torch_in = _is_torch(k_new)
    call = None
    if torch_in and max_seqlen_new is not None:  # the call for the replay path (fmha_dsl/replay.py)
        call = ((q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cu_seqlens_new, seqlens_k, block_table,
                 kv_indptr, kv_indices, k_descale, v_descale),
                ("append", max_seqlen_new, bool(rotary_interleaved), _fast.registry_key(registry)))
        if _fast.run(*call) is not None:
            return
    token = CALLER.set("append_kv()")
    try:
        if not torch_in:  # NumPy arrays run the reference
            check_numpy_call(k_new, {"k_new": k_new, "v_new": v_new},
                             {"block_table": block_table, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
                              "seqlens_k": seqlens_k, "cu_seqlens_new": cu_seqlens_new, "rotary_cos": rotary_cos,
                              "rotary_sin": rotary_sin, "k_descale": k_descale, "v_descale": v_descale}, registry,
                             like="k_new")
            return paged_numpy.append(k_cache, v_cache, k_new, v_new, block_table, kv_indptr, kv_indices, seqlens_k,
                                      cu_seqlens_new, rotary_cos, rotary_sin, rotary_interleaved, q,
                                      (k_descale, v_descale), max_seqlen_new)
        _append(k_cache, v_cache, k_new, v_new, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_new,
                max_seqlen_new, rotary_cos, rotary_sin, rotary_interleaved, q, registry, call, (k_descale, v_descale))
    finally:
        CALLER.reset(token)


def _append(k_cache, v_cache, k_new, v_new, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_new,
            max_seqlen_new, rotary_cos, rotary_sin, rotary_interleaved, q, registry, call, descales):
    import torch

    from .keys import Problem

    _fast.start()
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise _usage("usage.shape", f"`{name}` must be a 3-D torch tensor [Tnew, Hk, D], got "
                         f"{tuple(getattr(x, 'shape', ()))}", "the new tokens of every sequence, concatenated")
        if x.stride(2) != 1 and x.shape[2] > 1:
            raise _usage("usage.stride", f"`{name}`'s head dim must have stride 1, got strides {x.stride()}",
                         f"pass {name}.contiguous()")
    dname = _dtype_name(k_new)
    if dname in FP8_DTYPES:
        raise _usage("usage.dtype", "`k_new` holds the new rows before quantization: bfloat16 for an FP8 cache, got "
                     "float8_e4m3fn", "pass the bfloat16 rows; append_kv quantizes them with k_descale/v_descale")
    fp8 = isinstance(k_cache, torch.Tensor) and _is_fp8(k_cache)
    if fp8:
        if k_new.dtype is not torch.bfloat16:
            raise _usage("usage.dtype", f"an FP8 (float8_e4m3fn) cache takes bfloat16 new rows, got {k_new.dtype}",
                         "pass k_new.bfloat16() and v_new.bfloat16() (CK's fp8bf16 contract)")
        dname = FP8_DTYPES[0]
    dev = k_new.get_device()
    if dev < 0 and not (registry is not None and getattr(registry, "launcher", None) == "interpret"):
        raise _usage("usage.device", f"`k_new` is on {k_new.device}; torch tensors run on a GPU",
                     "move the tensors with .cuda(), or pass numpy arrays to run the reference")
    if v_new.dtype is not k_new.dtype or v_new.get_device() != dev or v_new.shape[:2] != k_new.shape[:2]:
        raise _usage("usage.value", f"`v_new` must match k_new's dtype, device and [Tnew, Hk] ({tuple(k_new.shape)}), "
                     f"got {tuple(v_new.shape)} {v_new.dtype} on {v_new.device}",
                     "k_new and v_new hold the same tokens")
    layout, num_pages, page, hk, dk, dv = cache_pair(k_cache, v_cache, k_cache.dtype if fp8 else k_new.dtype, dev,
                                                     like="k_cache" if fp8 else "k_new", on="k_new")
    (kd, vd), qscale = append_descales(dname, descales, dev, (num_pages, hk))
    tn = k_new.shape[0]
    if (k_new.shape[1], k_new.shape[2], v_new.shape[2]) != (hk, dk, dv):
        raise _usage("usage.shape", f"`k_new`/`v_new` must be [Tnew, {hk}, {dk}] / [Tnew, {hk}, {dv}] like the caches, "
                     f"got {tuple(k_new.shape)} and {tuple(v_new.shape)}", "heads and head dims follow the caches")
    cn, b, lens, host_n, max_new = sequences("cu_seqlens_new", cu_seqlens_new, tn, seqlens_k, dev, max_seqlen_new,
                                             "max_seqlen_new", "the most new tokens of one sequence",
                                             "[B] int32 cached tokens per sequence (before the append)")
    paged = block_table is not None or kv_indptr is not None or kv_indices is not None
    if paged:
        lookup, bt, ip, ix = tables(block_table, kv_indptr, kv_indices, b, dev, max_seqlen_new is None)
    else:
        lookup, bt, ip, ix = "vllm", None, None, None
        if layout != "linear":
            raise _usage("usage.shape", "without a page table the caches are contiguous [B, capacity, Hk, D] (4-D), "
                         "not in the vectorized layout", "pass block_table or kv_indptr + kv_indices for a paged "
                         "vectorized cache")
        contiguous_rows(num_pages, b)
    cos, sin, half = rotary_tables(rotary_cos, rotary_sin, dk, dev)
    if max_seqlen_new is None:  # the lengths are on the host anyway: check that every new row has a place
        lv, btv, ipv, ixv = host_values(lens, bt, ip, ix)
        if paged:
            check_tables_on_host(btv, ipv, ixv, lv, page, num_pages, host_n)
        for i, (n, m) in enumerate(zip(lv, host_n)):
            if not paged:
                within_capacity(i, n, m, page)
            if cos is not None and n + m > cos.shape[0]:
                raise _usage("usage.value", f"sequence {i}: positions up to {n + m - 1} need rotary tables of at "
                             f"least {n + m} rows, they have {cos.shape[0]}", "extend rotary_cos/rotary_sin")
    if q is not None:
        if not isinstance(q, torch.Tensor):
            raise _usage("usage.type", f"`q` must be a torch tensor like k_new, got {type(q).__name__}",
                         "pass torch tensors throughout, or numpy arrays throughout (the reference)")
        if (q.dim() != 3 or q.shape[0] != tn or q.shape[2] != dk
                or q.dtype is not k_new.dtype or q.get_device() != dev or q.shape[1] % hk):
            raise _usage("usage.value", f"`q` must be the new tokens' queries [Tnew = {tn}, Hq, {dk}] (Hq a multiple "
                         f"of {hk}) in k_new's dtype {k_new.dtype} on its device, got "
                         f"{tuple(getattr(q, 'shape', ()))} {getattr(q, 'dtype', '')} on {getattr(q, 'device', '?')}",
                         "q holds the queries of the tokens being appended, one row per k_new row"
                         + (" (bfloat16 for an FP8 cache: quantize it for paged_attention afterwards)" if fp8 else ""))
        if q.stride(2) != 1:
            raise _usage("usage.stride", f"`q`'s head dim must have stride 1, got strides {q.stride()}",
                         "pass q.contiguous() and use the result (q is rotated in place)")
    if tn == 0 or b == 0:
        return
    disp = _api.dispatcher(registry, dev)
    rope = "none" if cos is None else ("inter" if rotary_interleaved else "half")
    key = ("append", dname, qscale, dk, dv, rope, paged, layout, lookup, page if paged else 1)
    plan = disp.fast_paged.get(key)
    if plan is None:
        hq = q.shape[1] if q is not None else hk
        problem = Problem(family="fwd_appendkv", dtype=dname, qscale=qscale, arch=disp.arch,
                          batch=max(1, b), nhead_q=hq, nhead_k=hk,
                          seqlen_q=max(1, max_new), seqlen_k=max(1, max_new), hdim_q=dk, hdim_v=dv, mode="batch",
                          rope=rope, paged_kv=paged, kv_layout=layout, kv_lookup=lookup,
                          page_size=page if paged else 1)
        plan = disp.fast_paged[key] = disp.plan(problem)
    steps = plan.run(k_cache, v_cache, k_new, v_new, seqlens_k=lens, cu_seqlens_new=cn, max_seqlen_new=max_new,
                     block_table=bt, kv_indptr=ip, kv_indices=ix, rotary_cos=cos, rotary_sin=sin, q=q,
                     k_descale=kd, v_descale=vd)
    used = (cos, sin, cn, lens, bt, ip, ix, kd, vd)
    mine = (rotary_cos, rotary_sin, cu_seqlens_new, seqlens_k, block_table, kv_indptr, kv_indices) + tuple(descales)
    if call is not None and all(a is b for a, b in zip(used, mine)):  # the caller's own tensors: replayable
        _fast.record(call[0], set(), call[1], plan, steps)
