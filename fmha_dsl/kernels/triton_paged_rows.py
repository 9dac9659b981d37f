"""[kernels] Where a key block's rows live in a paged KV cache: the device-side addressing of :mod:`.triton_paged`.

A block of ``BLOCK_N`` keys starting at ``start_n`` (a multiple of ``BLOCK_N``) lies in one page when ``PAGE_SIZE >=
BLOCK_N`` (one page-id load, rows at a fixed stride); with smaller pages each row (or each ``PAGE_SIZE`` rows) has its
own page (:func:`_pages`, then :func:`_rows` per operand).  Every page id read is clamped into ``[0, num_pages)`` (CK's
branchless clamp, :func:`_page`: a corrupt table gives wrong numbers, never an illegal address).  Layouts:
:mod:`.paged_abi` (linear ``[pages, page_size, Hk, D]``, or CK's vectorized one, whose V cache groups ``VEC`` slots
into one 16-byte vector).  The vectorized layout is read in the order it lies in memory (:func:`_k_vectors`,
:func:`_v_vectors`: a page's run of K vectors, a token group's V vectors: 256-512 contiguous bytes a warp) and put back
into the dot's ``[D, N]`` / ``[N, D]`` tiles in registers.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["_table", "_page", "_pages", "_rows", "_slots", "_k_vectors", "_v_vectors"]


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
def _k_vectors(k_base, Table, tb, num_pages, start_n, seqlen_k, stride_kp, stride_kg, d_ok, CHECK_N: tl.constexpr,
               CHECK_D: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               VEC: tl.constexpr):
    """A K block, transposed (``[BLOCK_D, BLOCK_N]``), of the vectorized layout: a page holds, for each of the head
    dim's ``BLOCK_D / VEC`` vectors, its tokens' vectors one after another, so the block is read as ``[BLOCK_D / VEC,
    P, S * VEC]`` -- ``P`` runs of ``S = min(PAGE_SIZE, BLOCK_N)`` tokens, one page each (a run: ``S x 16``
    contiguous bytes, 256 at page 16) -- and the head dim's elements brought back together in registers.  A run is
    read whole where its first token is in the sequence (its page); the scores of the keys past the sequence are
    masked later."""
    S: tl.constexpr = PAGE_SIZE if PAGE_SIZE < BLOCK_N else BLOCK_N
    P: tl.constexpr = BLOCK_N // S
    runs = tl.arange(0, P) * S
    page = _pages(Table, tb, num_pages, start_n, runs, seqlen_k, CHECK_N, PAGE_SIZE, BLOCK_N)
    r_base = tl.multiple_of(_rows(page, start_n, runs, stride_kp, VEC, PAGE_SIZE, BLOCK_N, 0), VEC)
    g = tl.arange(0, BLOCK_D // VEC)
    c = tl.arange(0, S * VEC)  # token s of the run, element e of its vector: s * VEC + e
    g_off = tl.multiple_of(g.to(tl.int64) * stride_kg, VEC)
    ptrs = k_base + g_off[:, None, None] + r_base[None, :, None] + c[None, None, :]
    if CHECK_D:  # head dims are multiples of VEC here: one flag per vector
        g_ok = tl.max(tl.reshape(d_ok.to(tl.int32), (BLOCK_D // VEC, VEC)), 1) > 0
        if CHECK_N:
            k3 = tl.load(ptrs, mask=g_ok[:, None, None] & ((start_n + runs) < seqlen_k)[None, :, None], other=0.0)
        else:
            k3 = tl.load(ptrs, mask=g_ok[:, None, None], other=0.0)
    elif CHECK_N:
        k3 = tl.load(ptrs, mask=((start_n + runs) < seqlen_k)[None, :, None], other=0.0)
    else:
        k3 = tl.load(ptrs)
    k4 = tl.permute(tl.reshape(k3, (BLOCK_D // VEC, P, S, VEC)), (0, 3, 1, 2))
    return tl.reshape(k4, (BLOCK_D, BLOCK_N))


@triton.jit
def _v_vectors(v_base, Table, tb, num_pages, start_n, seqlen_k, stride_vp, stride_vs, dv_ok,
               CHECK_N: tl.constexpr, CHECK_DV: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_DV: tl.constexpr, VEC: tl.constexpr):
    """A V block ``[BLOCK_N, BLOCK_DV]`` of the vectorized layout, read as ``[BLOCK_N / VEC, BLOCK_DV * VEC]``: a group
    of VEC tokens holds its ``BLOCK_DV x VEC`` elements contiguously, so each row of that read is one run of
    ``BLOCK_DV x VEC`` elements (a warp reads up to 512 contiguous bytes); the tokens are brought back to rows in
    registers.  A group is read whole where its first token is in the sequence (it lies in that token's page); its
    tokens past the sequence are zeroed after the read."""
    grp = tl.arange(0, BLOCK_N // VEC) * VEC
    # each group's first token: page * stride_vp + (slot / VEC) * stride_vs, a multiple of VEC (strides checked)
    g_page = _pages(Table, tb, num_pages, start_n, grp, seqlen_k, CHECK_N, PAGE_SIZE, BLOCK_N)
    g_rows = tl.multiple_of(_rows(g_page, start_n, grp, stride_vp, stride_vs, PAGE_SIZE, BLOCK_N, VEC), VEC)
    c = tl.arange(0, BLOCK_DV * VEC)   # head dim d, token t of the group: d * VEC + t
    ptrs = v_base + g_rows[:, None] + c[None, :]
    if CHECK_DV:
        c_ok = tl.reshape(tl.broadcast_to(dv_ok[:, None], (BLOCK_DV, VEC)), (BLOCK_DV * VEC,))
        if CHECK_N:
            v2 = tl.load(ptrs, mask=((start_n + grp) < seqlen_k)[:, None] & c_ok[None, :], other=0.0)
        else:
            v2 = tl.load(ptrs, mask=c_ok[None, :], other=0.0)
    elif CHECK_N:
        v2 = tl.load(ptrs, mask=((start_n + grp) < seqlen_k)[:, None], other=0.0)
    else:
        v2 = tl.load(ptrs)
    v = tl.reshape(tl.permute(tl.reshape(v2, (BLOCK_N // VEC, BLOCK_DV, VEC)), (0, 2, 1)), (BLOCK_N, BLOCK_DV))
    if CHECK_N:  # the last group's tokens past the sequence hold whatever the page holds there
        v = tl.where(((start_n + tl.arange(0, BLOCK_N)) < seqlen_k)[:, None], v, 0.0)
    return v
