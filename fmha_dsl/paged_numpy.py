"""The NumPy path of the serving API (:mod:`fmha_dsl.paged`): NumPy arrays run the reference
(:mod:`fmha_dsl.reference_paged`), with the API's argument checks -- writable arrays for in-place appends, FP8
descales as numbers."""

from __future__ import annotations

import math

from .attention_args import _usage


def paged(q, k_cache, v_cache, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_q, causal, window,
          alibi_slopes, softcap, sink, scale, return_lse, descales):
    """``paged_attention`` on NumPy arrays: the reference's result (``(out, lse)`` with ``return_lse``)."""
    import numpy as np

    from .reference_paged import paged_attention as ref

    if not isinstance(q, np.ndarray):
        raise _usage("usage.type", f"`q` must be a numpy array or a torch tensor, got {type(q).__name__}",
                     "numpy runs the reference; torch GPU tensors run the kernels")
    got = ref(q, k_cache, v_cache, block_table=block_table, kv_indptr=kv_indptr, kv_indices=kv_indices,
              seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q, causal=causal, window=window, alibi_slopes=alibi_slopes,
              softcap=softcap, sink=0 if sink is None else sink, scale=scale, return_lse=True,
              descales=_descales(descales))
    return got if return_lse else got[0]


def _descales(descales, names=("q_descale", "k_descale", "v_descale")):
    """FP8's descales on the NumPy path: all of them numbers (the arrays hold the e4m3 values), or none."""
    given = [d is not None for d in descales]
    if not any(given):
        return None
    if not all(given):
        missing = ", ".join(n for n, g in zip(names, given) if not g)
        raise _usage("usage.value", f"FP8 descales come as a set: {missing} missing",
                     ("pass all three" if len(names) == 3 else "pass both") + " (1.0 for none)")
    try:
        return tuple(float(d) for d in descales)
    except (TypeError, ValueError):
        raise _usage("usage.value", f"on NumPy inputs the descales are numbers, got "
                     f"{[type(d).__name__ for d in descales]}", "pass floats") from None


def _append_descales(descales):
    """An FP8 append's ``(k_descale, v_descale)`` on the NumPy path: finite, nonzero numbers (they divide), or none."""
    got = _descales(descales, ("k_descale", "v_descale"))
    for name, d in zip(("k_descale", "v_descale"), got or ()):
        if not (math.isfinite(d) and d != 0):
            raise _usage("usage.value", f"`{name}` divides the new rows into the FP8 cache: it must be a finite, "
                         f"nonzero number, got {d}", "the scale the cache's values are multiplied by when read")
    return got


def append(k_cache, v_cache, k_new, v_new, block_table, kv_indptr, kv_indices, seqlens_k, cu_seqlens_new,
           rotary_cos, rotary_sin, rotary_interleaved, q, descales):
    """``append_kv`` on NumPy arrays: the caches (and q) updated in place by the reference's result."""
    import numpy as np

    from .reference_paged import append_kv as ref

    arrays = [("k_cache", k_cache), ("v_cache", v_cache)] + ([("q", q)] if q is not None else [])
    for name, x in arrays:
        if not isinstance(x, np.ndarray) or not x.flags.writeable:
            raise _usage("usage.type", f"`{name}` must be a writable numpy array (append_kv updates it in place), got "
                         f"{type(x).__name__}", f"pass np.array({name}) (a writable copy) and read the result from it")
    if block_table is None and kv_indptr is None and kv_indices is None:  # contiguous [B, capacity, Hk, D]
        block_table = np.arange(np.asarray(k_cache).shape[0], dtype=np.int32)[:, None]
    kc, vc, qr = ref(k_cache, v_cache, k_new, v_new, block_table=block_table, kv_indptr=kv_indptr,
                     kv_indices=kv_indices, seqlens_k=seqlens_k, cu_seqlens_new=cu_seqlens_new,
                     rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=rotary_interleaved, q=q,
                     descales=_append_descales(descales))
    np.copyto(k_cache, kc, casting="unsafe")
    np.copyto(v_cache, vc, casting="unsafe")
    if q is not None:
        np.copyto(q, qr, casting="unsafe")


__all__ = ["paged", "append"]
