"""[reference] FP8's descales in the paged reference (:mod:`fmha_dsl.reference_paged`): what CK's ``fp8bf16`` contract
multiplies the e4m3 values by, checked where the kernels would read them.

A K/V descale is one number (per tensor), ``[num_pages, Hk]`` (KV block scales) or ``[num_pages, page_size, Hk]``
(per token and K/V head); q's one number or ``[Tq, Hq]``.  The slots (pages) attention never reads may hold anything
in the descales as in the caches, as a server's do; those it reads must be finite, and the scores' scale -- ``scale x
q_descale x k_descale`` -- must stay finite in the kernels' base-2 float32 (``docs/semantics.md``).
"""

from __future__ import annotations

import numpy as np

from .numeric import SCALAR_MAX
from .reference import _usage, as_array

__all__ = ["descaled", "kv_descale"]


def _descale_array(name: str, d) -> np.ndarray:
    """An FP8 descale as a float64 array: a number or float array, never a bool (False would read as 0.0)."""
    if isinstance(d, (bool, np.bool_, str, bytes)) or (isinstance(d, np.ndarray) and d.dtype.kind not in "fiu"):
        raise _usage("usage.value", f"`{name}` must be a number or a float array, got {d!r}", "1.0 scales by nothing")
    return as_array(name, d, np.float64)


def kv_descale(name: str, d, num_pages: int, hk: int, written=None, page: int | None = None) -> np.ndarray:
    """An FP8 K/V descale as float64 ``[num_pages, 1 | page_size, Hk, 1]`` (broadcasting over a linear cache): one
    number (per tensor; a one-element array of any shape too), ``[num_pages, Hk]`` (KV block scales: one per page and
    K/V head) or, where ``page`` (the page size) is given, ``[num_pages, page_size, Hk]`` (per token and K/V head).
    ``written`` (an append's: the page ids it writes): their descales finite and nonzero, as the new rows are divided
    by them (the other pages' may hold anything, as a server's do)."""
    a = _descale_array(name, d)
    per_token = page is not None and a.shape == (num_pages, page, hk)
    if a.size != 1 and a.shape != (num_pages, hk) and not per_token:
        tokens = f", [num_pages, page_size, Hk] = [{num_pages}, {page}, {hk}] (one per token)" if page else ""
        raise _usage("usage.shape", f"`{name}` must be [num_pages, Hk] = [{num_pages}, {hk}] (one per page and K/V "
                     f"head of the cache){tokens} or one number (per tensor), got shape {a.shape}",
                     "num_pages, page_size and Hk are the cache's")
    # an attention's per-page (per-token) descales of pages it never reads may hold anything, as a server's do
    divides = written is not None
    bad = None
    if a.size == 1:
        bad = ~(np.isfinite(a) & (a != 0)) if divides else ~np.isfinite(a)
    elif divides:
        bad = np.zeros(a.shape, bool)
        w = np.unique(np.asarray(written, np.int64))
        bad[w] = ~(np.isfinite(a[w]) & (a[w] != 0))
    if bad is not None and bad.any():
        at = ""
        if a.size != 1:  # the first bad [page, head]
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            at, a = f"[{', '.join(map(str, idx))}]", a[idx]
        what = "divides the new rows into the FP8 cache: it must be finite and nonzero" if divides else \
            "scales the FP8 cache's values: it must be finite"
        raise _usage("usage.value", f"`{name}{at}` {what}, got {float(a.reshape(-1)[0])}",
                     "the scale the cache's values are multiplied by when read")
    if per_token:
        return a[:, :, :, None]
    return np.full((num_pages, 1, hk, 1), a.reshape(-1)[0]) if a.size == 1 else a[:, None, :, None]


def _on_e4m3_grid(name: str, x) -> None:
    """FP8 inputs are e4m3 values (docs/semantics.md): NumPy has no such dtype, so the float array must hold values
    that e4m3 represents (NaN is one; infinities are not)."""
    from .fp8 import round_e4m3

    x = np.asarray(x)
    off = ~((round_e4m3(x) == x) | np.isnan(x))
    if off.any():
        at = tuple(int(i) for i in np.argwhere(off)[0])
        raise _usage("usage.value", f"`{name}` holds {float(x[at])!r} at {list(at)}, which is not an e4m3 value: FP8 "
                     "inputs (given with descales) hold e4m3 values", "round them with fmha_dsl.fp8.round_e4m3 (or "
                     "give no descales for plain float caches)")


def descaled(q, k_cache, v_cache, k_read, v_read, read_slots, descales, scale):
    """``(q, k_cache, v_cache)`` in float64, multiplied by FP8's ``descales = (q_descale, k_descale, v_descale)``,
    after checking them: shapes, the e4m3 grid of what attention reads (``k_read``/``v_read``: the gathered slots,
    ``read_slots``: their flat ``page * page_size + slot`` ids), finite descales there, and a finite score scale."""
    p, page, hk, _ = k_cache.shape
    qd = _descale_array("q_descale", descales[0])
    if qd.size != 1 and qd.shape != q.shape[:2]:
        raise _usage("usage.shape", f"`q_descale` must be one number or [Tq, Hq] = {list(q.shape[:2])} (one per "
                     f"query token and head), got shape {qd.shape}", "Tq and Hq are q's")
    if not np.isfinite(qd).all():
        bad = qd.reshape(-1)[~np.isfinite(qd.reshape(-1))][0]
        raise _usage("usage.value", f"`q_descale` must be finite, got {bad}",
                     "the scale q's values are multiplied by")
    kd, vd = (kv_descale(n, d, p, hk, page=page) for n, d in (("k_descale", descales[1]), ("v_descale", descales[2])))
    for name, x in (("q", q), ("k_cache", k_read), ("v_cache", v_read)):   # (the slots attention reads)
        _on_e4m3_grid(name, x)
    top = {}
    for name, d, given in (("k_descale", kd, descales[1]), ("v_descale", vd, descales[2])):
        at_read = np.broadcast_to(d, (p, page, hk, 1)).reshape(p * page, hk)[read_slots]
        if not np.isfinite(at_read).all():
            i, h = (int(x) for x in np.argwhere(~np.isfinite(at_read))[0])
            pg, sl = divmod(int(read_slots[i]), page)
            where = f"[{pg}, {sl}, {h}]" if np.ndim(given) == 3 else f"[{pg}, {h}]"
            raise _usage("usage.value", f"`{name}{where}` scales a page attention reads: it must be finite, got "
                         f"{float(at_read[i, h])}", "the scale the cache's values are multiplied by when read")
        top[name] = float(np.abs(at_read).max(initial=0.0))
    try:   # (a scale or head dim that is wrong is the forward's own error, after this)
        scale = (1.0 / np.sqrt(q.shape[-1]) if q.shape[-1] else 0.0) if scale is None else abs(float(scale))
    except (TypeError, ValueError, OverflowError):
        scale = 0.0
    scores = scale * float(np.abs(qd).max(initial=0.0)) * top["k_descale"]
    if np.isfinite(scale) and scores > SCALAR_MAX:
        raise _usage("usage.value", f"scale x q_descale x k_descale reaches {scores:.3g}: the scores' scale must stay "
                     f"at most {SCALAR_MAX:.3g} (float32 in base 2)", "descales near 1 / the values' range keep it "
                     "small: they undo the quantisation's scaling")
    q = q.astype(np.float64) * (qd.reshape(-1)[0] if qd.size == 1 else qd[:, :, None])
    return q, np.asarray(k_cache, np.float64) * kd, np.asarray(v_cache, np.float64) * vd
