"""[kernels] FP8 KV block and per-token-head scales in the paged template (:mod:`.triton_paged`, ``KV_SCALE``).

CK's ``kv_blockscale``: ``k_descale``/``v_descale`` are ``[num_pages, Hk]`` (:mod:`.paged_abi`), so key ``j`` in page
``p`` of K/V head ``h`` stands for ``k_descale[p, h] x K[j]`` and ``v_descale[p, h] x V[j]``.  A key block reads its
page's descales (one scalar when ``PAGE_SIZE >= BLOCK_N``, one per key when the block spans pages), multiplies its
scores by K's (:func:`_descaled_scores`) and accumulates P.V in units of ``v_ref``, the largest ``|v_descale|`` met
so far (:func:`_v_units`: CK's fold of the V scale into the softmax's rescale factor), so that each probability is
scaled by ``v_descale / v_ref`` -- at most 1 in magnitude, exactly 1 where the pages share a scale -- before its fp16
rounding; the epilogue multiplies by ``v_ref``.

CK's ``per_token_head`` (``KV_SCALE`` 2): ``k_descale``/``v_descale`` are ``[num_pages, page_size, Hk]``, read per
key from its page and slot (the offsets of :func:`.triton_paged_rows._rows`, as the cache rows'), and the q descale
is one per query row (``[Tq, Hq]``: the row's token and head), which multiplies that row's scores here (its sign
already folded into q); V's take the same path as block scales read per key.

``V_ROWS`` (set by the build where a V descale is per key and a program has at least 64 query rows, and no fewer
rows than keys: :func:`.paged_host.constexprs`): the V descales multiply V's rows instead, as the tile is widened
for P.V -- ``e4m3 x descale`` rounded to bf16, the values themselves, so there is no reference scale to keep, and
P.V runs in bf16.  That needs the descales in V's row layout only (two per thread in the 128 x 64 tile, not 16 in
P's), and no reduction over the keys; the multiplies are as many as P's at d128 there, twice as many in a 64 x 64
tile, which still comes out ahead (sm90, Triton 3.6, per-token-head scales at page 16, with the ``_rows``
offsets: 128 x 64 892 -> 656 instructions a key block, 304 -> 32 spilled bytes; 64 x 64 937 -> 785; 64 x 128 1,036
-> 1,106, so it keeps the units; ``bench/probe_sass_paged.py``).  Decode's 16-row tiles keep the units too: their
V tile is 8x P, and they are bound by memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_paged_rows import _rows

__all__ = ["_descaled_scores", "_v_units"]


@triton.jit
def _descaled_scores(qk, kd_base, vd_base, page, start_n, offs_n, n_ok, q_row, stride_kdp, stride_vdp, stride_kds,
                     stride_vds, CHECK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                     KV_SCALE: tl.constexpr, V_ROWS: tl.constexpr):
    """``(qk, vd, v_top)``: a key block's raw scores ``qk [BLOCK_M, BLOCK_N]`` times each key's K descale (and,
    ``KV_SCALE`` 2, each row's q descale ``q_row``), its V descales and their largest magnitude -- the descales of the
    block's ``page`` (clamped ids, :mod:`.triton_paged_rows`; a scalar, or one per key), and with ``KV_SCALE`` 2 of
    each key's slot in it.  Keys past the sequence in a block read some page's descales (a server's null page, or
    slots never written: anything, NaN included): the mask drops their scores, and their V descale is zeroed here,
    out of ``v_top`` and P (``V_ROWS``: out of V's rows; ``v_top`` is then 1, unused)."""
    if KV_SCALE == 2:
        kd = tl.load(kd_base + _rows(page, start_n, offs_n, stride_kdp, stride_kds, PAGE_SIZE, BLOCK_N, 0))
        vd = tl.load(vd_base + _rows(page, start_n, offs_n, stride_vdp, stride_vds, PAGE_SIZE, BLOCK_N, 0))
        qk = qk * q_row[:, None] * kd[None, :]
    else:
        kd = tl.load(kd_base + page.to(tl.int64) * stride_kdp)
        vd = tl.load(vd_base + page.to(tl.int64) * stride_vdp)
        if PAGE_SIZE >= BLOCK_N:
            qk = qk * kd
        else:
            qk = qk * kd[None, :]
    if KV_SCALE == 2 or PAGE_SIZE < BLOCK_N:  # a V descale per key
        if CHECK_N:
            vd = tl.where(n_ok, vd, 0.0)
        v_top = 1.0
        if not V_ROWS:
            v_top = tl.max(tl.abs(vd), 0)
    else:
        v_top = tl.abs(vd)
    return qk, vd, v_top


@triton.jit
def _v_units(p, alpha, v_ref, vd, v_top, PER_KEY: tl.constexpr):
    """``(p, alpha, v_ref)`` of a key block for an accumulator in units of ``v_ref``: the new reference ``max(v_ref,
    v_top)``, ``alpha`` also rescaling the old units into it, each probability times ``vd / v_ref``.  Ratios of equal
    scales are exactly 1 (``x * fl(1 / x)`` is ``1 - 2^-24`` for some ``x``: a drift per block otherwise); while the
    reference is 0 (zero descales so far) what is accumulated is multiplied away when it grows."""
    ref = tl.maximum(v_ref, v_top)
    live = ref > 0.0
    inv = tl.where(live, 1.0 / tl.where(live, ref, 1.0), 0.0)
    alpha = alpha * tl.where(live & (v_ref != ref), v_ref * inv, 1.0)
    scale = tl.where(vd == ref, 1.0, vd * inv)
    if PER_KEY:  # (a V descale per key: the block spans pages, or one per token)
        p = p * scale[None, :]
    else:
        p = p * scale
    return p, alpha, ref
