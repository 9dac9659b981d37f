"""Argument checks of the serving API (:mod:`fmha_dsl.paged`): page tables, lengths, caches, rotary tables, FP8
descales.

Each check raises a :class:`~fmha_dsl.errors.UsageError` naming the function and the argument, what was expected and
what came, with a hint.  Checks that need device values (page ids, per-sequence lengths) run only when the caller did
not pass ``max_seqlen_*`` (one device-to-host copy then); with them nothing here synchronises.
"""

from __future__ import annotations

from .attention_args import _check_scale, _check_sink, _check_softcap, _usage, named
from .errors import UsageError, error
from .index_args import check_cu_host, cu_seqlens_of, int32_of, max_len
from .kernels.paged_abi import FP8_DTYPES, descale_kind
from .numeric import is_int, shown


def _torch():
    import torch

    return torch


def int_tensor(name: str, x, ndim: int, dev: int, what: str, sync_ok: bool = True):
    """``x`` as an int32 tensor of rank ``ndim`` on device ``dev`` (a host int tensor or array is copied there; a
    wider one checked to fit, on the GPU only when ``sync_ok``: :func:`fmha_dsl.index_args.int32_of`)."""
    torch = _torch()
    if not isinstance(x, torch.Tensor):
        import numpy as np

        a = np.asarray(x)
        if a.dtype.kind not in "iu" and not (a.size == 0 and a.dtype.kind == "f"):   # ([] reads as float64)
            raise _usage("usage.dtype", f"`{name}` must hold integers (int32), got dtype {a.dtype}", what)
        x = torch.from_numpy(np.ascontiguousarray(int32_of(name, a.astype(np.int64) if a.size == 0 else a, what)))
    if x.dim() != ndim:
        raise _usage("usage.shape", f"`{name}` must be {ndim}-D, got shape {tuple(x.shape)}", what)
    if x.dtype != torch.int32:
        if x.dtype not in (torch.int64, torch.int16, torch.uint8, torch.int8):
            raise _usage("usage.dtype", f"`{name}` must be int32, got {x.dtype}", f"pass {name}.to(torch.int32)")
        x = int32_of(name, x, what, sync_ok)
    where = x.get_device()
    if where != dev:
        if where >= 0:
            raise _usage("usage.device", f"`{name}` is on cuda:{where} but q is on "
                         f"{'cpu' if dev < 0 else f'cuda:{dev}'}", f"move it with {name}.to(q.device)")
        x = x.to(f"cuda:{dev}")
    if x.dim() == 1 and x.stride(0) != 1 and x.shape[0] > 1:
        x = x.contiguous()
    if x.dim() == 2 and x.stride(1) != 1 and x.shape[1] > 1:
        raise _usage("usage.stride", f"`{name}`'s rows must be contiguous, got strides {x.stride()}",
                     f"pass {name}.contiguous()")
    return x


def tables(block_table, kv_indptr, kv_indices, batch: int, dev: int, sync_ok: bool = True):
    """``(lookup, block_table, kv_indptr, kv_indices)`` checked: exactly one form, int32, on q's device (``sync_ok``:
    the call reads device values back anyway, so a wider GPU table is checked to fit int32)."""
    if block_table is not None:
        if kv_indptr is not None or kv_indices is not None:
            raise _usage("usage.value", "give one page table: block_table (vLLM) or kv_indptr + kv_indices (SGLang), "
                         "not both", "drop the form you do not use")
        bt = int_tensor("block_table", block_table, 2, dev, "[B, max_pages_per_seq] int32 page ids", sync_ok)
        if bt.shape[0] != batch:
            raise _usage("usage.shape", f"`block_table` must have one row per sequence (B = {batch}), got shape "
                         f"{tuple(bt.shape)}", "B comes from cu_seqlens (B + 1 entries)")
        return "vllm", bt, None, None
    if kv_indptr is None or kv_indices is None:
        raise _usage("usage.value", "give a page table: block_table (vLLM, [B, max_pages]) or kv_indptr [B + 1] + "
                     "kv_indices (SGLang)", "kv_indices[kv_indptr[b]:kv_indptr[b + 1]] are sequence b's pages")
    ip = int_tensor("kv_indptr", kv_indptr, 1, dev, "[B + 1] int32 offsets into kv_indices", sync_ok)
    ix = int_tensor("kv_indices", kv_indices, 1, dev, "[total_pages] int32 page ids", sync_ok)
    if ip.shape[0] != batch + 1:
        raise _usage("usage.shape", f"`kv_indptr` must have B + 1 = {batch + 1} entries, got {ip.shape[0]}",
                     "B comes from cu_seqlens (B + 1 entries)")
    return "sglang", None, ip, ix


def check_tables_on_host(bt, ip, ix, lens, page: int, num_pages: int, extra=None):
    """The full check of tables against lengths on host copies (NumPy arrays or None): every used page id inside the
    cache, every sequence's pages enough for ``lens[b] (+ extra[b])`` tokens -- the reference's own check
    (:func:`fmha_dsl.reference_paged._pages_of`), its errors naming the function being called."""
    import numpy as np

    from .errors import UsageError
    from .reference_paged import _pages_of, check_distinct_slots

    lens = np.asarray(lens)
    neg = np.flatnonzero(lens < 0)
    if neg.size:
        raise _usage("usage.value", f"`seqlens_k[{int(neg[0])}]` = {int(lens[neg[0]])} is negative", "lengths are >= 0")
    tokens = lens if extra is None else lens + np.asarray(extra)
    what = None if extra is None else (lambda b: f"{int(lens[b])} cached + {int(extra[b])} new")
    try:
        rows = _pages_of(bt, ip, ix, lens.shape[0], num_pages, tokens, page, what)
        if extra is not None:   # an append's new rows: one slot each
            check_distinct_slots(rows, lens, np.asarray(extra), page)
    except UsageError as exc:
        raise named(exc) from None


def host_values(*tensors):
    """The tensors' values as NumPy arrays (one device-to-host copy each; None stays None)."""
    return [None if t is None else t.cpu().numpy() for t in tensors]


def cache_pair(k_cache, v_cache, dt, dev, like="q", on=None):
    """``(layout, num_pages, page_size, Hk, D, Dv)`` of the caches, checked: same dtype/device as q, and either the
    linear layout (4-D ``[num_pages, page_size, Hk, D]``, unit head-dim stride) or CK's vectorized one (5-D, K
    ``[num_pages, Hk, D / x, page_size, x]`` and V ``[num_pages, Hk, page_size / x, D, x]``, x = 16 bytes of the
    dtype, the last two dims contiguous).  ``like``: the argument whose dtype ``dt`` they must have, ``on``: whose
    device (default: ``like``)."""
    torch = _torch()
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, torch.Tensor):
            raise _usage("usage.type", f"`{name}` must be a torch tensor like {on or like}, got {type(x).__name__}",
                         "pass torch tensors throughout, or numpy arrays throughout (the reference)")
        if x.dtype is not dt:
            raise _usage("usage.dtype", f"`{name}` must have {like}'s dtype {dt}, got {x.dtype}",
                         f"pass {name}.to({like}.dtype)")
        if x.get_device() != dev:
            raise _usage("usage.device", f"`{name}` is on {x.device} but {on or like} is on "
                         f"{'cpu' if dev < 0 else f'cuda:{dev}'}", f"move it with {name}.to({on or like}.device)")
    if k_cache.dim() == 5 or v_cache.dim() == 5:
        return ("vectorized",) + _vectorized_pair(k_cache, v_cache, dt)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dim() != 4:
            raise _usage("usage.shape", f"`{name}` must be 4-D [num_pages, page_size, Hk, D] (linear) or 5-D (CK's "
                         f"vectorized layout), got shape {tuple(x.shape)}", "the linear (NHD) layout of vLLM and "
                         "FlashInfer is 4-D")
        if x.stride(3) != 1 and x.shape[3] > 1:
            raise _usage("usage.stride", f"`{name}`'s head dim must have stride 1, got strides {x.stride()}",
                         "the other dims may be strided (e.g. an HND cache through a permuted view)")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise _usage("usage.shape", f"`k_cache` and `v_cache` must agree on [num_pages, page_size, Hk], got "
                     f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}", "one page table addresses both caches")
    return "linear", k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], k_cache.shape[3], v_cache.shape[3]


def _vectorized_pair(k, v, dt):
    from .kernels.paged_abi import VECTOR_BYTES

    x = VECTOR_BYTES // k.element_size()
    want = {"k_cache": f"[num_pages, Hk, D / {x}, page_size, {x}]", "v_cache": f"[num_pages, Hk, page_size / {x}, D, {x}]"}
    for name, t in (("k_cache", k), ("v_cache", v)):
        if t.dim() != 5 or t.shape[4] != x:
            raise _usage("usage.shape", f"`{name}` in CK's vectorized layout is 5-D {want[name]} ({x} {dt} elements "
                         f"are 16 bytes), got shape {tuple(t.shape)}", "pass both caches in one layout: 4-D linear "
                         "[num_pages, page_size, Hk, D] or 5-D vectorized")
        if t.stride(4) != 1 or t.stride(3) != x:
            raise _usage("usage.stride", f"`{name}`'s last two dims must be contiguous (strides ({x}, 1)), got "
                         f"strides {t.stride()}", f"pass {name}.contiguous()")
        for i in range(3):
            if t.stride(i) % x:
                raise _usage("usage.stride", f"`{name}`'s stride {t.stride(i)} over dim {i} is not a multiple of {x}"
                             " (whole 16-byte vectors)", f"pass {name}.contiguous()")
    num_pages, hk, page = k.shape[0], k.shape[1], k.shape[3]
    if (v.shape[0], v.shape[1], v.shape[2] * x) != (num_pages, hk, page):
        raise _usage("usage.shape", f"`k_cache` {tuple(k.shape)} and `v_cache` {tuple(v.shape)} must agree on "
                     f"num_pages, Hk and page_size (V's dim 2 is page_size / {x})", "one page table addresses both "
                     "caches")
    return num_pages, page, hk, k.shape[2] * x, v.shape[3]


def sequences(cu_name: str, cu, total: int, seqlens_k, dev: int, max_given, max_name: str, max_what: str,
              lens_what: str, reads: bool | None = None):
    """``(cu_seqlens, B, seqlens_k, lengths, max_length)`` of a group-mode call: ``cu`` (``cu_name``, over ``total``
    rows) and ``seqlens_k`` as int32 tensors on device ``dev``; ``lengths``: each sequence's rows read on the host (only
    when ``max_given`` is None or ``cu`` was on the host -- one device-to-host copy), else None; ``max_length``: the
    caller's ``max_given`` (checked against the host lengths when there are some) or their maximum.  ``reads``:
    whether the call reads device values back at all (default: when ``max_given`` is None): then a wide integer
    tensor is checked to fit int32 too."""

    reads = max_given is None if reads is None else reads
    cu, host = cu_seqlens_of(cu_name, cu, total, dev, _torch(), reads)
    b = cu.shape[0] - 1
    lens = int_tensor("seqlens_k", seqlens_k, 1, dev, lens_what, reads)
    if lens.shape[0] != b:
        raise _usage("usage.shape", f"`seqlens_k` must have one entry per sequence (B = {b}), got {lens.shape[0]}",
                     f"B comes from {cu_name} (B + 1 entries)")
    if max_given is None and host is None:
        host = cu.tolist()  # one device-to-host copy: pass the maximum to avoid it
    if host is not None:
        check_cu_host(cu_name, host, total)
        host = [host[i + 1] - host[i] for i in range(b)]
    return cu, b, lens, host, max_len(max_name, max_given, host, max_what)


def check_scalars(softcap, scale, sink) -> None:
    """paged_attention's soft-cap (None or > 0), scale (None or >= 0) and sink count (None or an int >= 0)."""
    if softcap is not None:
        _check_softcap(softcap)
    if scale is not None:
        _check_scale(scale)
        if scale < 0:
            raise _usage("usage.value", f"paged_attention takes scale >= 0, got {scale!r}",
                         "fold a negative sign into q")
    if sink is not None:
        _check_sink(sink)


def contiguous_rows(rows: int, batch: int) -> None:
    """A contiguous cache ``[B, capacity, Hk, D]`` (no page table) holds one sequence per row."""
    if rows != batch:
        raise _usage("usage.shape", f"without a page table the caches are contiguous [B, capacity, Hk, D] with "
                     f"B = {batch} (len(seqlens_k)), got {rows} rows",
                     "pass block_table or kv_indptr + kv_indices for a paged cache")


def within_capacity(i: int, cached: int, new: int, capacity: int) -> None:
    """Sequence ``i`` of a contiguous cache has room for its cached and new tokens."""
    if cached + new > capacity:
        raise _usage("usage.value", f"sequence {i}: {cached} cached + {new} new tokens exceed the cache's capacity "
                     f"{capacity}", "a contiguous cache is [B, capacity, Hk, D]")


def rotary_tables(cos, sin, d: int, dev: int):
    """``(cos, sin, half)`` float32 ``[max_position, rotary_dim / 2]`` on q's device (``half`` 0 without RoPE)."""
    torch = _torch()
    if cos is None and sin is None:
        return None, None, 0
    if cos is None or sin is None:
        raise _usage("usage.value", "RoPE needs both rotary_cos and rotary_sin", "pass both, or neither")
    out = []
    for name, x in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(x, torch.Tensor):
            raise _usage("usage.type", f"`{name}` must be a torch tensor, got {type(x).__name__}",
                         f"pass torch.as_tensor({name}, device=k_cache.device)")
        if x.dim() != 2:
            raise _usage("usage.shape", f"`{name}` must be [max_position, rotary_dim / 2], got {tuple(x.shape)}",
                         "one row per position, one column per rotated pair")
        if x.get_device() != dev:
            raise _usage("usage.device", f"`{name}` is on {x.device}, the caches on cuda:{dev}",
                         f"move it with {name}.to(k_cache.device)")
        if not x.dtype.is_floating_point:   # (the NumPy path refuses integer tables too)
            raise _usage("usage.dtype", f"`{name}` must hold floats (float32), got {x.dtype}",
                         "cos/sin of each position's angles, float32")
        if x.dtype != torch.float32 or x.stride(1) != 1:
            x = x.float().contiguous()  # a copy; float32 tables with unit stride avoid it
        out.append(x)
    if out[0].shape != out[1].shape:
        raise _usage("usage.shape", f"`rotary_cos` and `rotary_sin` must have one shape, got {tuple(out[0].shape)} "
                     f"and {tuple(out[1].shape)}", "cos and sin of the same angles")
    half = out[0].shape[1]
    if half < 1 or 2 * half > d:
        raise _usage("usage.shape", f"rotary_dim = 2 x {half} must be in [2, head dim {d}]",
                     "rotary_cos/sin are [max_position, rotary_dim / 2]")
    if out[1].stride(0) != out[0].stride(0):
        out[1] = out[1].contiguous()
        out[0] = out[0].contiguous()
    return out[0], out[1], half


def append_descales(dname, given, dev, pages):
    """``((k_descale, v_descale), qscale)`` of an append, checked as :func:`descales` checks attention's (none, and
    qscale ``no``, for caches that are not FP8)."""
    got, qscale = descales(dname, (None, *given), dev, pages, first=1)
    return got[1:], qscale


def descales(dname, given, dev, pages, first=0, page=None, tokens=None):
    """FP8's ``(q_descale, k_descale, v_descale)`` (checked from index ``first``) and the key's ``qscale``: float32
    tensors on the inputs' device (read there, never on the host) -- K's and V's both of one element
    (``pertensor``), both ``[num_pages, Hk]`` (``kv_blockscale``: one per page and K/V head; ``pages`` =
    ``(num_pages, Hk)`` of the caches) or, where ``page`` (the page size) is given, both ``[num_pages, page_size,
    Hk]`` (``per_token_head``: one per cached token and K/V head, CK's newest); q's of one element, or with
    per-token-head K/V scales ``[Tq, Hq]`` (``tokens``).  None, and ``no``, for other dtypes."""
    import torch

    names = ("q_descale", "k_descale", "v_descale")
    if dname not in FP8_DTYPES:
        for name, d in zip(names, given):
            if d is not None:
                raise _usage("usage.value", f"`{name}` scales FP8 (float8_e4m3fn) data; the inputs are {dname}",
                             f"drop {name}, or pass float8_e4m3fn caches")
        return (None, None, None), "no"
    where = "cpu" if dev < 0 else f"cuda:{dev}"
    forms = {"pertensor": "of one element", "kv_blockscale": f"[num_pages, Hk] = [{pages[0]}, {pages[1]}] (one per "
             "page and K/V head)"}
    if page is not None:
        forms["per_token_head"] = (f"[num_pages, page_size, Hk] = [{pages[0]}, {page}, {pages[1]}] (one per token "
                                   "and K/V head)")
    q_forms = "of one element" + (f" or [Tq, Hq] = [{tokens[0]}, {tokens[1]}] (one per token and head, with "
                                  "per-token-head K/V descales)" if tokens is not None and page is not None else "")
    for i, (name, d) in list(enumerate(zip(names, given)))[first:]:
        accepted = " or ".join(forms.values()) if i else q_forms
        if d is None:
            raise _usage("usage.value", f"FP8 data needs `{name}`: a float32 tensor {accepted} on {where}",
                         f"the dequantization scale of the {name[0]} tensor; torch.ones(1, device='{where}') for "
                         "none")
        shape = tuple(getattr(d, "shape", ()))
        if i == 0:   # q's: one element, or [Tq, Hq] where per-token scales are taken
            shaped = tokens is not None and page is not None and shape == tuple(tokens)
        else:        # K's, V's: one element, [num_pages, Hk] or, where taken, [num_pages, page_size, Hk]
            shaped = shape == tuple(pages) or page is not None and shape == (pages[0], page, pages[1])
        ok = isinstance(d, torch.Tensor) and d.dtype == torch.float32 and d.get_device() == dev and (
            d.numel() == 1 or shaped)
        if not ok:
            raise _usage("usage.value", f"`{name}` must be a float32 tensor {accepted} on {where}, got "
                         f"{type(d).__name__} {shape} {getattr(d, 'dtype', '')} on {getattr(d, 'device', '?')}",
                         f"e.g. torch.tensor([s], device='{where}')" + (
                             f" or torch.full(({pages[0]}, {pages[1]}), s, device='{where}')" if i else "")
                         + (f" or torch.full(({pages[0]}, {page}, {pages[1]}), s, device='{where}')"
                            if i and page is not None else "")
                         + (f" or torch.full(({tokens[0]}, {tokens[1]}), s, device='{where}')"
                            if not i and tokens is not None and page is not None else ""))
    return tuple(given), qscale_of(given[0].shape if first == 0 else None, given[1].shape, given[2].shape)


def qscale_of(q_shape, k_shape, v_shape) -> str:
    """The FP8 ``qscale`` that descales of these shapes make (``q_shape`` None: an append's, none), for the torch
    and the NumPy paths alike: the kernels' and the interpreter harness's one decision, paged_abi.descale_kind,
    its refusals as located usage errors."""
    try:
        return descale_kind(q_shape, k_shape, v_shape)
    except ValueError as exc:
        raise _usage("usage.value", str(exc), "pass K's and V's descales in one form; a [Tq, Hq] q_descale goes with "
                     "one-element or per-token K/V descales") from None


_REQUIRED = {
    "seqlens_k": "the cached tokens of each sequence: a [B] int32 array (torch: on q's device)",
    "cu_seqlens_q": "[B + 1] int32 offsets of each sequence's queries in q (group mode)",
    "cu_seqlens_new": "[B + 1] int32 offsets of each sequence's new rows in k_new and v_new",
}


def required(fn: str, **given) -> None:
    """The keywords every call of ``fn`` needs, as a located error naming the one left out (None)."""
    name = next(n for n, x in given.items() if x is None)
    raise error("usage.missing", f"{fn}: `{name}` is required", None, _REQUIRED[name], cls=UsageError)


def workspace_args(q, k_cache, v_cache, batch, max_seqlen_q, max_seqlen_k, registry) -> None:
    """:func:`fmha_dsl.paged.workspace_numel`'s arguments: the bounds ints >= 0, ``q`` 3-D on the GPU (or on the CPU
    for an interpreting dispatcher), caches as ``paged_attention`` takes them."""
    from .runtime.dispatch import Dispatcher

    for name, x in (("batch", batch), ("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not is_int(x) or x < 0:
            raise _usage("usage.value", f"`{name}` must be an int >= 0, got {shown(x)}",
                         "the bounds every call the workspace serves stays within")
    if q.dim() != 3:
        raise _usage("usage.shape", f"`q` must be 3-D [Tq, Hq, D], got shape {tuple(q.shape)}",
                     "q as paged_attention takes it")
    if q.get_device() < 0 and not (isinstance(registry, Dispatcher) and registry.launcher == "interpret"):
        raise _usage("usage.device", f"`q` is on {q.device}; a workspace serves the GPU kernels",
                     "pass the tensors the calls will get, on the GPU")
    cache_pair(k_cache, v_cache, getattr(k_cache, "dtype", None), q.get_device())


__all__ = ["contiguous_rows", "within_capacity", "int_tensor", "tables", "sequences", "check_tables_on_host",
           "workspace_args", "host_values", "cache_pair", "rotary_tables", "named", "descales",
           "append_descales", "qscale_of", "required"]
