"""NumPy reference of the serving families (issue 14): attention over a paged KV cache, and appending to one with RoPE.

    out = paged_attention(q, k_cache, v_cache, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq, causal=True)
    k_cache, v_cache, q = append_kv(k_cache, v_cache, k_new, v_new, kv_indptr=ip, kv_indices=ix, seqlens_k=lens,
                                    cu_seqlens_new=cn, rotary_cos=cos, rotary_sin=sin, q=q)

What they compute (docs/semantics.md, "Paged KV cache"): paged attention is :func:`fmha_dsl.reference.attention_fwd`
in group mode over the K/V gathered from the pages (:func:`gather_kv`); append-KV writes each sequence's new rows
after its ``seqlens_k`` cached ones, RoPE applied to the new K (and to ``q``, the same new tokens) at positions
``seqlens_k[b] + t``.

* Caches, linear (NHD as vLLM and FlashInfer): ``k_cache [num_pages, page_size, Hk, D]``, ``v_cache
  [num_pages, page_size, Hk, Dv]``; the page size is the cache's second dim.  Or CK's vectorized layout (5-D, x
  elements = 16 bytes of the kernel's dtype: 8 for fp16/bf16): ``k_cache [num_pages, Hk, D / x, page_size, x]``,
  ``v_cache [num_pages, Hk, page_size / x, Dv, x]`` -- the same values, element ``[p, h, d // x, s, d % x]`` of K and
  ``[p, h, s // x, d, s % x]`` of V being the linear ``[p, s, h, d]`` (:func:`vectorized_caches`,
  :func:`linear_caches`).  ``layout=None`` tells them apart by rank.
* Page tables, exactly one form: vLLM's 2D ``block_table [B, max_pages_per_seq]`` (row ``b`` lists sequence ``b``'s
  pages in order; entries past its last page are ignored), or SGLang's 1D ``kv_indptr [B + 1]`` + ``kv_indices
  [kv_indptr[B]]`` (sequence ``b``'s pages are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``).
* ``seqlens_k [B]``: the cached tokens per sequence (append: before the append); token ``j`` of sequence ``b`` is row
  ``j % page_size`` of page ``table[b][j // page_size]``.

Every inconsistent table is a located :class:`~fmha_dsl.errors.UsageError`: a page id outside the cache, too few
pages for ``seqlens_k`` (plus the new rows when appending), tables of the wrong rank or dtype, both or neither form.
"""

from __future__ import annotations

import numpy as np

from .numeric import INT64_MAX
from .reference import _as_float_array, _usage, as_array, attention_fwd
from .reference_fp8 import descaled, kv_descale

__all__ = ["gather_kv", "paged_attention", "append_kv", "rotary", "vectorized_caches", "linear_caches"]


def _permute(a, axes):
    return a.permute(*axes) if hasattr(a, "permute") else np.transpose(a, axes)


def _dense(a):
    return a.contiguous() if hasattr(a, "contiguous") else np.ascontiguousarray(a)


def vectorized_caches(k_cache, v_cache, vec: int | None = None):
    """Linear caches ``[P, page, Hk, D]`` / ``[P, page, Hk, Dv]`` (NumPy arrays or torch tensors) in CK's vectorized
    layout: ``(K [P, Hk, D / vec, page, vec], V [P, Hk, page / vec, Dv, vec])``, contiguous copies; ``vec`` defaults
    to 16 bytes of the arrays' element type (8 for fp16/bf16)."""
    if vec is None:
        size = k_cache.element_size() if hasattr(k_cache, "element_size") else k_cache.itemsize
        vec = 16 // size
    p, page, hk, d = k_cache.shape
    dv = v_cache.shape[3]
    if d % vec or dv % vec or page % vec:
        raise _usage("usage.shape", f"the vectorized layout needs page_size ({page}) and head dims ({d}, {dv}) that "
                     f"are multiples of the vector ({vec} elements)", "keep such caches linear")
    k5 = _permute(k_cache.reshape(p, page, hk, d // vec, vec), (0, 2, 3, 1, 4))
    v5 = _permute(v_cache.reshape(p, page // vec, vec, hk, dv), (0, 3, 1, 4, 2))
    return _dense(k5), _dense(v5)


def linear_caches(k_cache, v_cache):
    """The inverse of :func:`vectorized_caches`: ``(K [P, page, Hk, D], V [P, page, Hk, Dv])`` (copies)."""
    p, hk, dx, page, vec = k_cache.shape
    dv = v_cache.shape[3]
    k = _permute(k_cache, (0, 3, 1, 2, 4)).reshape(p, page, hk, dx * vec)
    v = _permute(v_cache, (0, 2, 4, 1, 3)).reshape(p, page, hk, dv)
    return _dense(k), _dense(v)


def _ints(name: str, x, ndim: int, convert: bool = True) -> np.ndarray:
    """An integer array of ``ndim`` dims as int64 (``convert`` False: as given, for a table whose used entries alone
    are converted, :func:`_int64`)."""
    a = as_array(name, x)
    if a.size == 0 and a.dtype.kind == "f":   # an empty list ([] reads as float64): no value to be wrong
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise _usage("usage.dtype", f"`{name}` must be an integer array (int32), got dtype {a.dtype}",
                     f"pass {name} as int32")
    if a.ndim != ndim:
        raise _usage("usage.shape", f"`{name}` must be {ndim}-D, got shape {a.shape}",
                     f"{name} is {ndim}-D: see the argument's description in docs/semantics.md")
    return _int64(name, a) if convert else a


def _int64(name: str, a: np.ndarray) -> np.ndarray:
    """``a`` as int64, refusing unsigned values past int64's range (which a cast would wrap to negatives)."""
    if a.dtype.kind == "u" and a.size and int(a.max()) > INT64_MAX:
        raise _usage("usage.value", f"`{name}` holds {int(a.max())}, beyond int64", f"pass {name} as int32")
    return a.astype(np.int64)


def _pages_of(block_table, kv_indptr, kv_indices, batch: int, num_pages: int, tokens, page: int,
              what=None) -> list[np.ndarray]:
    """Each sequence's page ids, in order: the ``ceil(tokens[b] / page)`` it uses checked to exist and to lie in the
    cache (entries past them are never read: vLLM pads its block table with anything)."""
    if (block_table is None) == (kv_indptr is None and kv_indices is None):
        raise _usage("usage.value", "give exactly one page table: block_table (vLLM, 2-D) or kv_indptr + kv_indices "
                     "(SGLang, 1-D)", "block_table[b] lists sequence b's pages; kv_indices[kv_indptr[b]:"
                     "kv_indptr[b + 1]] does the same in one flat array")
    if block_table is not None:
        bt = _ints("block_table", block_table, 2, convert=False)
        if bt.shape[0] != batch:
            raise _usage("usage.shape", f"`block_table` must have one row per sequence ({batch}), got shape "
                         f"{bt.shape}", "rows follow seqlens_k")
        rows = [bt[b] for b in range(batch)]
    else:
        if kv_indptr is None or kv_indices is None:
            raise _usage("usage.value", "the SGLang table needs both kv_indptr and kv_indices",
                         "kv_indices lists every sequence's pages; kv_indptr[b]:kv_indptr[b + 1] are sequence b's")
        ip = _ints("kv_indptr", kv_indptr, 1)
        ix = _ints("kv_indices", kv_indices, 1, convert=False)
        if ip.shape[0] != batch + 1 or ip[0] != 0 or np.any(np.diff(ip) < 0) or ip[-1] > ix.shape[0]:
            raise _usage("usage.value", f"`kv_indptr` must be [B + 1] = [{batch + 1}], start at 0, never decrease and "
                         f"end at most at len(kv_indices) = {ix.shape[0]}; got {ip.tolist()}",
                         "kv_indptr[b + 1] - kv_indptr[b] is sequence b's page count")
        rows = [ix[ip[b]:ip[b + 1]] for b in range(batch)]
    if page < 1:
        raise _usage("usage.shape", "the caches' page size (their second dim) must be >= 1, got 0",
                     "linear caches are [num_pages, page_size, Hk, D]")
    for b, r in enumerate(rows):
        need = -(-int(tokens[b]) // page)
        if need > r.shape[0]:
            raise _usage("usage.value", f"sequence {b}: {what(b) if what else f'{int(tokens[b])} cached'} tokens need "
                         f"{need} pages of {page}, its table has {r.shape[0]}",
                         "give each sequence the pages its tokens need (seqlens_k)")
        r = rows[b] = _int64("block_table" if block_table is not None else "kv_indices", r[:need])
        bad = np.flatnonzero((r < 0) | (r >= num_pages))
        if bad.size:
            raise _usage("usage.value", f"sequence {b}: page id {int(r[bad[0]])} (table position {int(bad[0])}) is "
                         f"outside the cache's {num_pages} pages", "page ids index the cache's first dim")
    return rows


def _check_cache(k_cache, v_cache, layout: str | None):
    """``(k, v, vec)``: the caches as linear float arrays (``vec``: the vectorized layout's vector, 0 for linear)."""
    k_cache = _as_float_array("k_cache", k_cache)
    v_cache = _as_float_array("v_cache", v_cache)
    if v_cache.dtype != k_cache.dtype:
        raise _usage("usage.dtype", f"`v_cache` must have k_cache's dtype {k_cache.dtype}, got {v_cache.dtype}",
                     "both caches hold one dtype")
    if layout is None:
        layout = "vectorized" if k_cache.ndim == 5 else "linear"
    if layout not in ("linear", "vectorized"):
        raise _usage("usage.value", f"unknown kv layout {layout!r}", "use 'linear' or 'vectorized' (or None: by rank)")
    if layout == "vectorized":
        ok = (k_cache.ndim == 5 and v_cache.ndim == 5 and k_cache.shape[4] == v_cache.shape[4]
              and (v_cache.shape[0], v_cache.shape[1], v_cache.shape[2] * v_cache.shape[4])
              == (k_cache.shape[0], k_cache.shape[1], k_cache.shape[3]))
        if not ok:
            raise _usage("usage.shape", f"vectorized caches must be K [num_pages, Hk, D / x, page_size, x] and V "
                         f"[num_pages, Hk, page_size / x, Dv, x], got {k_cache.shape} and {v_cache.shape}",
                         "vectorized_caches() converts linear caches")
        k, v = linear_caches(k_cache, v_cache)
        return k, v, k_cache.shape[4]
    if k_cache.ndim != 4 or v_cache.ndim != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        raise _usage("usage.shape", f"`k_cache`/`v_cache` must be [num_pages, page_size, Hk, D] and "
                     f"[num_pages, page_size, Hk, Dv] with the same first three dims, got {k_cache.shape} and "
                     f"{v_cache.shape}",
                     "linear caches are [num_pages, page_size, Hk, D]; vectorized_caches() makes the 5-D layout")
    return k_cache, v_cache, 0


def _lengths(seqlens_k, batch=None) -> np.ndarray:
    lens = _ints("seqlens_k", seqlens_k, 1)
    if np.any(lens < 0):
        raise _usage("usage.value", f"`seqlens_k` must be >= 0, got {lens.tolist()}",
                     "seqlens_k[b] is the number of cached tokens of sequence b")
    if batch is not None and lens.shape[0] != batch:
        raise _usage("usage.shape", f"`seqlens_k` must have one length per sequence ({batch}), got {lens.shape[0]}",
                     "one entry per sequence (len(cu_seqlens_q) - 1)")
    return lens


def gather_kv(k_cache, v_cache, *, block_table=None, kv_indptr=None, kv_indices=None, seqlens_k, layout=None):
    """``(k [Tk, Hk, D], v [Tk, Hk, Dv], cu_seqlens_k [B + 1])``: each sequence's first ``seqlens_k[b]`` cached
    tokens, contiguous, in group-mode (varlen) layout."""
    k_cache, v_cache, _ = _check_cache(k_cache, v_cache, layout)
    lens = _lengths(seqlens_k)
    page = k_cache.shape[1]
    rows = _pages_of(block_table, kv_indptr, kv_indices, lens.shape[0], k_cache.shape[0], lens, page)
    ks, vs = [], []
    for n, r in zip(lens, rows):
        tok = np.arange(int(n))
        pid, off = r[tok // page], tok % page
        ks.append(k_cache[pid, off])
        vs.append(v_cache[pid, off])
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    empty_k = np.zeros((0,) + k_cache.shape[2:], k_cache.dtype)
    empty_v = np.zeros((0,) + v_cache.shape[2:], v_cache.dtype)
    return (np.concatenate(ks) if ks else empty_k), (np.concatenate(vs) if vs else empty_v), cu


def paged_attention(q, k_cache, v_cache, *, block_table=None, kv_indptr=None, kv_indices=None, seqlens_k,
                    cu_seqlens_q, layout=None, return_lse=False, descales=None, **forward):
    """Attention of group-mode queries ``q [Tq, Hq, D]`` over the paged cache: exactly
    :func:`fmha_dsl.reference.attention_fwd` over :func:`gather_kv`'s K/V (``forward``: its keywords -- causal,
    window, sink, softcap, alibi_slopes, scale, ...).  Returns ``out`` (or ``(out, lse)``).  ``descales``: FP8's
    ``(q_descale, k_descale, v_descale)``, the inputs being the values of the e4m3 bytes (:mod:`fmha_dsl.fp8`): the
    attention of ``q x q_descale`` over ``K x k_descale`` and ``V x v_descale``, K's and V's descales one number,
    ``[num_pages, Hk]`` (KV block scales: a page's keys and values of head ``h`` scaled by its ``[p, h]``) or
    ``[num_pages, page_size, Hk]`` (per token and head: slot ``s`` of page ``p`` by its ``[p, s, h]``; q's then one
    number or ``[Tq, Hq]``, one per query token and head)."""
    if descales is not None:
        k_cache, v_cache, _ = _check_cache(k_cache, v_cache, layout)
        layout = "linear"
        p, page = k_cache.shape[:2]
        slot = np.arange(p * page, dtype=np.float64).reshape(p, page, 1, 1)   # which slots attention reads
        read = gather_kv(slot, slot, block_table=block_table, kv_indptr=kv_indptr, kv_indices=kv_indices,
                         seqlens_k=seqlens_k, layout=layout)[0].astype(np.int64).reshape(-1)
        k_read, v_read = (c.reshape((p * page,) + c.shape[2:])[read] for c in (k_cache, v_cache))
        q, k_cache, v_cache = descaled(_as_float_array("q", q), k_cache, v_cache, k_read, v_read, read, descales,
                                       forward.get("scale"))
    cq = _ints("cu_seqlens_q", cu_seqlens_q, 1)
    if cq.shape[0] < 1:
        raise _usage("usage.shape", "`cu_seqlens_q` must have B + 1 >= 1 entries, got none",
                     "cu_seqlens_q[b] is sequence b's first query row; [0] for an empty batch")
    _lengths(seqlens_k, cq.shape[0] - 1)   # (B from cu_seqlens_q, as the kernels' path reads it)
    k, v, cu_k = gather_kv(k_cache, v_cache, block_table=block_table, kv_indptr=kv_indptr, kv_indices=kv_indices,
                           seqlens_k=seqlens_k, layout=layout)
    q = _as_float_array("q", q)
    hk, d = k.shape[1], k.shape[2]
    if q.ndim != 3 or q.shape[2] != d or q.shape[1] % max(hk, 1):
        raise _usage("usage.shape", f"`q` must be [Tq, Hq, D = {d}] (the caches' head dim) with Hq a multiple of "
                     f"the caches' Hk = {hk}, got shape {q.shape}", "k_cache is [num_pages, page_size, Hk, D]")
    if descales is None and q.dtype != k.dtype:
        raise _usage("usage.dtype", f"`q` must have the caches' dtype {k.dtype}, got {q.dtype}",
                     "pass q.astype(k_cache.dtype)")
    out, lse = attention_fwd(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=cu_k, **forward)
    return (out, lse) if return_lse else out


def rotary(x, positions, cos, sin, interleaved: bool = False):
    """``x [T, H, D]`` with RoPE applied to its first ``rotary_dim = 2 * cos.shape[1]`` dims at ``positions [T]``:
    pairs ``(2i, 2i + 1)`` when ``interleaved`` (GPT-J), else ``(i, i + rotary_dim / 2)`` (GPT-NeoX, half-rotated);
    ``cos``/``sin`` are ``[max_position, rotary_dim / 2]``."""
    x = np.array(x, copy=True)
    if not isinstance(interleaved, (bool, np.bool_)):
        raise _usage("usage.type", f"rotary_interleaved must be True or False, got {interleaved!r}",
                     "True: pairs (2i, 2i + 1) (GPT-J); False: (i, i + rotary_dim / 2) (GPT-NeoX)")
    cos, sin = (_as_float_array(n, t).astype(np.float64) for n, t in (("rotary_cos", cos), ("rotary_sin", sin)))
    if cos.ndim != 2 or cos.shape != sin.shape or cos.shape[1] < 1:
        raise _usage("usage.shape", f"`rotary_cos`/`rotary_sin` must be [max_position, rotary_dim / 2] alike, "
                     f"rotary_dim >= 2, got {cos.shape} and {sin.shape}",
                     "one row per position, one column per rotated pair")
    half = cos.shape[1]
    if 2 * half > x.shape[-1]:
        raise _usage("usage.shape", f"rotary_dim = 2 x {half} exceeds the head dim {x.shape[-1]}",
                     "rotary tables are [max_position, rotary_dim / 2] with rotary_dim at most the head dim")
    pos = np.asarray(positions, np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= cos.shape[0]):
        raise _usage("usage.value", f"positions up to {int(pos.max())} need rotary tables of at least "
                     f"{int(pos.max()) + 1} rows, they have {cos.shape[0]}", "extend rotary_cos/rotary_sin")
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    xf = x.astype(np.float64)
    if interleaved:
        a, b = xf[..., 0:2 * half:2], xf[..., 1:2 * half:2]
        x[..., 0:2 * half:2] = a * c - b * s
        x[..., 1:2 * half:2] = a * s + b * c
    else:
        a, b = xf[..., :half], xf[..., half:2 * half]
        x[..., :half] = a * c - b * s
        x[..., half:2 * half] = a * s + b * c
    return x


def check_distinct_slots(rows, lens, new, page: int) -> None:
    """Every new row of an append goes to a slot of its own: two sequences (or one whose table names a page twice)
    whose new tokens land in one cache slot would leave whichever write came last -- on the GPU, either.  ``rows``:
    each sequence's page ids (:func:`_pages_of`), ``lens``/``new``: its cached and new token counts."""
    slots, owner = [], []
    for b in range(len(lens)):
        tok = int(lens[b]) + np.arange(int(new[b]))
        slots.append(np.asarray(rows[b], np.int64)[tok // page] * page + tok % page)
        owner.append(np.stack([np.full(tok.shape, b), tok], 1))
    if not slots:
        return
    slots, owner = np.concatenate(slots), np.concatenate(owner)
    order = np.argsort(slots, kind="stable")
    dup = np.flatnonzero(slots[order][1:] == slots[order][:-1])
    if dup.size:
        (b1, t1), (b2, t2) = owner[order[dup[0]]], owner[order[dup[0] + 1]]
        s = int(slots[order[dup[0]]])
        raise _usage("usage.value", f"sequence {b1}'s token {t1} and sequence {b2}'s token {t2} are both appended to "
                     f"page {s // page}, slot {s % page}", "each sequence appends into pages of its own (a page "
                     "shared for its prefix is read, never written)")


def append_kv(k_cache, v_cache, k_new, v_new, *, block_table=None, kv_indptr=None, kv_indices=None, seqlens_k,
              cu_seqlens_new, rotary_cos=None, rotary_sin=None, rotary_interleaved=False, q=None, layout=None,
              descales=None):
    """``(k_cache, v_cache, q)`` after appending: sequence ``b``'s new rows ``k_new[cu[b]:cu[b + 1]]`` (``[Tnew, Hk,
    D]``) go to its tokens ``seqlens_k[b] ...``, RoPE applied to them (and to ``q [Tnew, Hq, D]``, the same new tokens)
    at those positions when tables are given.  Copies in the caches' layout: the arguments are not modified.
    ``descales = (k_descale, v_descale)``: FP8 caches (values on the e4m3 grid); each new row is stored as
    ``e4m3(clamp(x / descale, -448, 448))`` in float32 (round to nearest even), RoPE applied first; a descale is one
    number or ``[num_pages, Hk]`` (KV block scales: the row's page's and head's)."""
    k_cache, v_cache, vec = _check_cache(k_cache, v_cache, layout)
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    lens = _lengths(seqlens_k)
    cn = _ints("cu_seqlens_new", cu_seqlens_new, 1)
    k_new = _as_float_array("k_new", k_new)
    v_new = _as_float_array("v_new", v_new)
    if k_new.ndim != 3 or v_new.ndim != 3:
        raise _usage("usage.shape", f"`k_new`/`v_new` must be 3-D [Tnew, Hk, D] / [Tnew, Hk, Dv], got {k_new.shape} "
                     f"and {v_new.shape}", "the new tokens of every sequence, one after another (cu_seqlens_new)")
    if cn.shape[0] != lens.shape[0] + 1 or cn[0] != 0 or np.any(np.diff(cn) < 0) or cn[-1] != k_new.shape[0]:
        raise _usage("usage.value", f"`cu_seqlens_new` must be [B + 1] = [{lens.shape[0] + 1}], start at 0, never "
                     f"decrease and end at len(k_new) = {k_new.shape[0]}; got {cn.tolist()}",
                     "cu_seqlens_new[b]:cu_seqlens_new[b + 1] are sequence b's rows of k_new")
    if k_new.shape[1:] != k_cache.shape[2:] or v_new.shape[1:] != v_cache.shape[2:] or v_new.shape[0] != k_new.shape[0]:
        raise _usage("usage.shape", f"`k_new`/`v_new` must be [Tnew, Hk, D] / [Tnew, Hk, Dv] matching the caches "
                     f"({k_cache.shape[2:]}, {v_cache.shape[2:]}), got {k_new.shape} and {v_new.shape}",
                     "the new rows have the caches' heads and head dims")
    page = k_cache.shape[1]
    total = [int(n) + int(m) for n, m in zip(lens, np.diff(cn))]   # Python ints: no int64 wrap past the cache
    rows = _pages_of(block_table, kv_indptr, kv_indices, lens.shape[0], k_cache.shape[0], total, page,
                     lambda b: f"{int(lens[b])} cached + {int(cn[b + 1] - cn[b])} new")
    check_distinct_slots(rows, lens, np.diff(cn), page)
    pos = np.concatenate([lens[b] + np.arange(cn[b + 1] - cn[b]) for b in range(lens.shape[0])]) \
        if lens.shape[0] else np.zeros(0, np.int64)
    rope = rotary_cos is not None or rotary_sin is not None
    if rope and (rotary_cos is None or rotary_sin is None):
        raise _usage("usage.value", "RoPE needs both rotary_cos and rotary_sin",
                     "pass both tables ([max_position, rotary_dim / 2] each), or neither")
    kr = rotary(k_new, pos, rotary_cos, rotary_sin, rotary_interleaved) if rope else k_new
    qr = None
    if q is not None:
        q = _as_float_array("q", q)
        hk, d = k_new.shape[1], k_new.shape[2]
        if q.ndim != 3 or q.shape[0] != k_new.shape[0] or q.shape[2] != d or q.shape[1] % hk:
            raise _usage("usage.shape", f"`q` must be the new tokens' queries [Tnew = {k_new.shape[0]}, Hq, D = {d}] "
                         f"with Hq a multiple of Hk = {hk}, got {q.shape}", "q rows are the same new tokens as k_new")
        qr = rotary(q, pos, rotary_cos, rotary_sin, rotary_interleaved) if rope else q.copy()
    if descales is not None:
        from .fp8 import E4M3_MAX, round_e4m3

        written = [rows[b][pos[cn[b]:cn[b + 1]] // page] for b in range(lens.shape[0])]
        written = np.concatenate(written) if written else np.zeros(0, np.int64)
        scales = [kv_descale(n, d, k_cache.shape[0], k_cache.shape[2], written)[:, 0].astype(np.float32)
                  for n, d in zip(("k_descale", "v_descale"), descales)]   # [num_pages, Hk, 1]
    for b in range(lens.shape[0]):
        t = np.arange(cn[b], cn[b + 1])
        tok = pos[t]
        pid, off = rows[b][tok // page], tok % page
        kb, vb = kr[t], v_new[t]
        if descales is not None:  # each row divided by its page's (and head's) descale, rounded to e4m3
            kb, vb = (round_e4m3(np.clip(np.asarray(x, np.float32) / sc[pid], -E4M3_MAX, E4M3_MAX))
                      for x, sc in ((kb, scales[0]), (vb, scales[1])))
        k_cache[pid, off] = kb
        v_cache[pid, off] = vb
    if vec:
        k_cache, v_cache = vectorized_caches(k_cache, v_cache, vec)
    return k_cache, v_cache, qr
