"""[kernels] Where a key block's rows live in a paged KV cache: the device-side addressing of :mod:`.triton_paged`.

A block of ``BLOCK_N`` keys starting at ``start_n`` (a multiple of ``BLOCK_N``) lies in one page when ``PAGE_SIZE >=
BLOCK_N`` (one page-id load, rows at a fixed stride); with smaller pages each row (or each ``PAGE_SIZE`` rows) has its
own page (:func:`_pages`, then :func:`_rows` per operand).  Every page id read is clamped into ``[0, num_pages)`` (CK's
branchless clamp, :func:`_page`: a corrupt table gives wrong numbers, never an illegal address).  Layouts:
:mod:`.paged_abi` (linear ``[pages, page_size, Hk, D]``, or CK's vectorized one, whose V cache groups ``VEC`` slots
into one 16-byte vector).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["_table", "_page", "_pages", "_rows", "_slots", "_v_vectors"]


@triton.jit
def _table(kv_indptr, off_b, stride_tb, table_width, LOOKUP: tl.constexpr):
    """``(offset, pages)`` of sequence ``off_b``'s page table: vLLM's (``LOOKUP`` 0) is row ``off_b`` of the block
    table (``table_width`` pages, row stride ``stride_tb``); SGLang's (1) ``kv_indices[kv_indptr[b] :
    kv_indptr[b + 1]]``.  The offset is int64, in elements of the table tensor."""
    if LOOKUP == 0:
        tb = off_b.to(tl.int64) * stride_tb
        n_tab = table_width
    else:
        p0 = tl.load(kv_indptr + off_b)
        n_tab = tl.load(kv_indptr + off_b + 1) - p0
        tb = p0.to(tl.int64)
    return tb, n_tab


@triton.jit
def _page(page, num_pages):
    """A page id read from a table, clamped into ``[0, num_pages)`` (uint32): a corrupt table reads wrong rows, never
    outside the cache.  One unsigned minimum, as CK's ``min(page_id, max_page_table_idx)``: a negative id, read as
    unsigned, lies past the cache and reads the last page.  Unsigned, the id widens to 64 bits with no sign to
    extend (sm90, the page-16 b64x64 loop: 440 instructions a key block, 504 with a signed ``max`` then ``min``)."""
    return tl.minimum(page.to(tl.uint32), (num_pages - 1).to(tl.uint32))


@triton.jit
def _slots(slot, stride_s, VEC: tl.constexpr):
    """Element offsets of slots ``slot`` inside a page: ``slot * stride_s``, or with ``VEC`` (the vectorized V cache,
    slots grouped ``VEC`` to a vector) ``(slot // VEC) * stride_s + slot % VEC``."""
    if VEC == 0:
        return slot * stride_s
    else:
        return (slot // VEC) * stride_s + slot % VEC


@triton.jit
def _pages(Table, tb, num_pages, start_n, offs_n, seqlen_k, CHECK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
           BLOCK_N: tl.constexpr):
    """The page (clamped, :func:`_page`) of keys ``start_n + offs_n`` of a sequence whose table starts at ``Table +
    tb``: one scalar when the block lies in one page (``PAGE_SIZE >= BLOCK_N``), else one per row, the table index
    taken from ``offs_n`` alone (``start_n`` is a multiple of ``BLOCK_N``, so of ``PAGE_SIZE``; each thread's rows are
    compile-time constants there -- from ``start_n + offs_n`` the sm90 decode loop had 803 instructions per key block
    instead of 589, the prefill loop spilled).  K and V rows in one layout share these ids (:mod:`.triton_paged`)."""
    if PAGE_SIZE >= BLOCK_N:  # PAGE_SIZE and BLOCK_N are powers of two
        page = tl.load(Table + tb + start_n // PAGE_SIZE)
    else:
        tab = Table + tb + start_n // PAGE_SIZE
        if CHECK_N:
            page = tl.load(tab + offs_n // PAGE_SIZE, mask=(start_n + offs_n) < seqlen_k, other=0)
        else:
            page = tl.load(tab + offs_n // PAGE_SIZE)
    return _page(page, num_pages)


@triton.jit
def _rows(page, start_n, offs_n, stride_p, stride_s, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
          VEC: tl.constexpr):
    """Element offsets (int64) of the cache rows holding keys ``start_n + offs_n`` in ``page`` (:func:`_pages`):
    ``page * stride_p`` + the slot's offset (:func:`_slots`)."""
    if PAGE_SIZE >= BLOCK_N:
        # one scalar base (the block's first slot is a multiple of BLOCK_N, so of VEC) + loop-invariant row offsets
        base = page.to(tl.int64) * stride_p + _slots(start_n % PAGE_SIZE, stride_s, VEC)
        rows = base + _slots(offs_n, stride_s, VEC)
    else:
        rows = page.to(tl.int64) * stride_p + _slots(offs_n % PAGE_SIZE, stride_s, VEC)
    return rows


@triton.jit
def _v_vectors(v_base, Table, tb, num_pages, start_n, seqlen_k, stride_vp, stride_vs, v_cols, dv_ok,
               CHECK_N: tl.constexpr, CHECK_DV: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_DV: tl.constexpr, VEC: tl.constexpr):
    """A V block ``[BLOCK_N, BLOCK_DV]`` of the vectorized layout, read as ``[BLOCK_N / VEC, BLOCK_DV, VEC]``: a group
    of VEC tokens holds its ``BLOCK_DV x VEC`` elements contiguously (``v_cols`` = the head dims' offsets, ``d x
    VEC``), so a warp reads long runs; the tokens are brought back to rows in registers."""
    grp = tl.arange(0, BLOCK_N // VEC) * VEC
    # each group's first token: page * stride_vp + (slot / VEC) * stride_vs, a multiple of VEC (strides checked)
    g_page = _pages(Table, tb, num_pages, start_n, grp, seqlen_k, CHECK_N, PAGE_SIZE, BLOCK_N)
    g_rows = tl.multiple_of(_rows(g_page, start_n, grp, stride_vp, stride_vs, PAGE_SIZE, BLOCK_N, VEC), VEC)
    t = tl.arange(0, VEC)
    ptrs = v_base + g_rows[:, None, None] + v_cols[None, :, None] + t[None, None, :]
    ok = ((start_n + grp[:, None, None] + t[None, None, :]) < seqlen_k) & dv_ok[None, :, None]
    if CHECK_N or CHECK_DV:
        v3 = tl.load(ptrs, mask=ok, other=0.0)
    else:
        v3 = tl.load(ptrs)
    return tl.reshape(tl.permute(v3, (0, 2, 1)), (BLOCK_N, BLOCK_DV))
