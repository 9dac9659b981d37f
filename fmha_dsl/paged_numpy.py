"""The NumPy path of the serving API (:mod:`fmha_dsl.paged`): NumPy arrays run the reference
(:mod:`fmha_dsl.reference_paged`), with the API's argument checks -- writable arrays for in-place appends, FP8
descales as numbers (or arrays: per page or per token and head) -- and the reference's own errors naming the API
function."""

from __future__ import annotations

from .attention_args import _usage, named
from .errors import UsageError
from .numeric import shown
from .index_args import max_len
from .paged_args import check_scalars, contiguous_rows, qscale_of, within_capacity


def paged(q, k_cache, v_cache, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_q, causal, window,
          alibi_slopes, softcap, sink, scale, return_lse, descales, out=None, max_seqlen_q=None, max_seqlen_k=None):
    """``paged_attention`` on NumPy arrays: the reference's result (``(out, lse)`` with ``return_lse``), written
    into ``out`` when one is given; ``max_seqlen_q``/``max_seqlen_k``, when given, checked as the torch path
    checks them (the registry and a workspace are the kernels' concern: unused here)."""
    import numpy as np

    from .reference_paged import paged_attention as ref

    if not isinstance(q, np.ndarray):
        raise _usage("usage.type", f"`q` must be a numpy array or a torch tensor, got {type(q).__name__}",
                     "numpy runs the reference; torch GPU tensors run the kernels")
    check_scalars(softcap, scale, sink)
    ds = _descales(descales)
    try:
        got = ref(q, k_cache, v_cache, block_table=block_table, kv_indptr=kv_indptr, kv_indices=kv_indices,
                  seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q, causal=causal, window=window,
                  alibi_slopes=alibi_slopes, softcap=softcap, sink=0 if sink is None else sink, scale=scale,
                  return_lse=True, descales=ds)
    except UsageError as exc:
        raise named(exc) from None
    cu = np.asarray(cu_seqlens_q).astype(np.int64)
    max_len("max_seqlen_q", max_seqlen_q, np.diff(cu).tolist(), "the longest sequence's query tokens")
    max_len("max_seqlen_k", max_seqlen_k, np.asarray(seqlens_k).astype(np.int64).tolist(),
            "the longest sequence's cached tokens (seqlens_k)")
    if out is not None:
        if not isinstance(out, np.ndarray) or out.shape != got[0].shape or out.dtype != got[0].dtype \
                or not out.flags.writeable:
            raise _usage("usage.value", f"`out` must be a writable numpy array of shape {got[0].shape} and dtype "
                         f"{got[0].dtype}, got " + (f"{out.shape} {out.dtype}" if isinstance(out, np.ndarray)
                                                    else type(out).__name__),
                         f"pass np.empty({got[0].shape}, np.{got[0].dtype}) or leave out=None")
        np.copyto(out, got[0])
        got = (out, got[1])
    return got if return_lse else got[0]


def _contiguous_fits(k_cache, seqlens_k, cu_seqlens_new) -> None:
    """A contiguous cache ``[B, capacity, Hk, D]`` (no page table): one row per sequence, and room in each for its
    cached and new tokens -- said in those terms, as the torch path says it (the reference sees a table of one
    page per sequence)."""
    import numpy as np

    from .reference_paged import _ints, _lengths

    try:
        lens = _lengths(seqlens_k)
        cn = _ints("cu_seqlens_new", cu_seqlens_new, 1)
    except UsageError as exc:   # the reference's checks, naming append_kv
        raise named(exc) from None
    contiguous_rows(k_cache.shape[0], lens.shape[0])
    if cn.shape[0] == lens.shape[0] + 1:   # (else the reference says what cu_seqlens_new must be)
        for i, (n, m) in enumerate(zip(lens.tolist(), np.diff(cn).tolist())):
            within_capacity(i, n, m, k_cache.shape[1])


def _descales(descales, names=("q_descale", "k_descale", "v_descale")):
    """FP8's descales on the NumPy path, all given or none: numbers (the arrays hold the e4m3 values); K's and V's
    also ``[num_pages, Hk]`` arrays (KV block scales) or, for attention, ``[num_pages, page_size, Hk]`` ones (per
    token and head), q's then a number or ``[Tq, Hq]`` (the reference checks the shapes against the inputs)."""
    import numpy as np

    given = [d is not None for d in descales]
    if not any(given):
        return None
    if not all(given):
        missing = ", ".join(n for n, g in zip(names, given) if not g)
        raise _usage("usage.value", f"FP8 descales come as a set: {missing} missing",
                     ("pass all three" if len(names) == 3 else "pass both") + " (1.0 for none)")
    attention = len(names) == 3
    allowed_ndims = {"q_descale": (2,) if attention else (), "k_descale": (2, 3) if attention else (2,)}
    what = {2: "a [num_pages, Hk] array (KV block scales)",
            3: "a [num_pages, page_size, Hk] array (per token and head)"}
    out = []
    for name, d in zip(names, descales):
        ndims = allowed_ndims.get(name, allowed_ndims["k_descale"])
        try:
            a = None if isinstance(d, (bool, np.bool_, str, bytes)) or (  # "1" would read as 1.0
                isinstance(d, np.ndarray) and d.dtype.kind not in "fiu") else np.asarray(d, dtype=np.float64)
        except OverflowError:
            raise _usage("usage.value", f"`{name}` = {shown(d)} is beyond float64", "descales are floats") from None
        except (TypeError, ValueError):
            a = None
        if a is None or a.ndim not in ndims and a.size != 1:
            alts = ["a [Tq, Hq] array (per token and head)"] if name == "q_descale" and ndims else \
                [what[n] for n in ndims]
            raise _usage("usage.value", f"on NumPy inputs `{name}` is a number" + "".join(f" or {w}" for w in alts)
                         + f", got {type(d).__name__}" + ("" if a is None else f" of shape {a.shape}"),
                         "pass floats" + (" (or arrays of them, as above)" if alts else ""))
        out.append(a if a.size != 1 else float(a.reshape(-1)[0]))   # ([[s]]: one number, per tensor)
    qscale_of(np.shape(out[0]) if attention else None, *(np.shape(d) for d in out[-2:]))   # the torch path's check
    return tuple(out)


def append(k_cache, v_cache, k_new, v_new, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_new,
           rotary_cos, rotary_sin, rotary_interleaved, q, descales, max_seqlen_new=None):
    """``append_kv`` on NumPy arrays: the caches (and q) updated in place by the reference's result
    (``max_seqlen_new``, when given, checked as the torch path checks it)."""
    import numpy as np

    from .reference_paged import append_kv as ref

    arrays = [("k_cache", k_cache), ("v_cache", v_cache)] + ([("q", q)] if q is not None else [])
    for name, x in arrays:
        if not isinstance(x, np.ndarray) or not x.flags.writeable:
            raise _usage("usage.type", f"`{name}` must be a writable numpy array (append_kv updates it in place), got "
                         f"{type(x).__name__}", f"pass np.array({name}) (a writable copy) and read the result from it")
    if block_table is None and kv_indptr is None and kv_indices is None:  # contiguous [B, capacity, Hk, D]
        if k_cache.ndim != 4:
            raise _usage("usage.shape", f"a cache without a page table is contiguous [B, capacity, Hk, D], got "
                         f"`k_cache` of shape {k_cache.shape}", "a vectorized (5-D) cache is paged: pass its table")
        _contiguous_fits(k_cache, seqlens_k, cu_seqlens_new)
        block_table = np.arange(k_cache.shape[0], dtype=np.int32)[:, None]
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        dt = getattr(x, "dtype", None)
        if all(d is None for d in descales) and dt is not None and dt != k_cache.dtype:
            raise _usage("usage.dtype", f"`{name}` must have the cache's dtype {k_cache.dtype}, got {dt}",
                         f"pass {name}.astype(k_cache.dtype)")
    ds = _descales(descales, ("k_descale", "v_descale"))
    try:
        kc, vc, qr = ref(k_cache, v_cache, k_new, v_new, block_table=block_table, kv_indptr=kv_indptr,
                         kv_indices=kv_indices, seqlens_k=seqlens_k, cu_seqlens_new=cu_seqlens_new,
                         rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved, q=q,
                         descales=ds)
    except UsageError as exc:
        raise named(exc) from None
    max_len("max_seqlen_new", max_seqlen_new, np.diff(np.asarray(cu_seqlens_new).astype(np.int64)).tolist(),
            "pass at least the most new tokens of one sequence, or None to have it computed")
    np.copyto(k_cache, kc, casting="unsafe")
    np.copyto(v_cache, vc, casting="unsafe")
    if q is not None:
        np.copyto(q, qr, casting="unsafe")


__all__ = ["paged", "append"]
