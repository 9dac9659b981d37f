"""The serving families' run-time ABI: attention over a paged KV cache, and appending to one (plain data, no Triton).

``fmha_paged`` (families ``batch_prefill`` and ``fwd_pagedkv``; :mod:`fmha_dsl.kernels.triton_paged`) computes
group-mode queries ``Q [Tq, Hq, D]`` (``cu_seqlens_q [B + 1]``) against each sequence's first ``seqlens_k[b]``
cached tokens.  Token ``j`` of sequence ``b`` is slot ``j % PAGE_SIZE`` of page ``table(b)[j // PAGE_SIZE]``, where
``table(b)`` is row ``b`` of vLLM's ``block_table [B, table_width]`` (``LOOKUP`` 0) or SGLang's
``kv_indices[kv_indptr[b] : kv_indptr[b + 1]]`` (``LOOKUP`` 1).  Two cache layouts (:func:`cache_geometry`):

* linear (``KV_VEC`` 0): ``[num_pages, page_size, Hk, D]`` with element strides (page, slot, head) as run-time
  arguments, so NHD and HND (``[num_pages, Hk, page_size, D]`` through a permuted view) are both served; the head
  dim has stride 1.
* CK's vectorized layout (``KV_VEC`` = the elements of a 16-byte vector, 8 for fp16/bf16): K
  ``[num_pages, Hk, D / KV_VEC, page_size, KV_VEC]`` and V ``[num_pages, Hk, page_size / KV_VEC, D, KV_VEC]``, the
  last two dims contiguous (so K's slot stride and V's head-dim stride are ``KV_VEC``); the ``stride_ks`` argument
  carries K's stride over ``D / KV_VEC`` and ``stride_vs`` V's over ``page_size / KV_VEC``.  A key block reads
  16-byte vectors of 8 head-dim elements (K) or 8 consecutive tokens (V).

Memory safety without a host round trip: the kernel reads at most ``min(seqlens_k[b], table length x PAGE_SIZE)``
keys of a sequence (it never indexes past its table), and clamps every page id it reads into ``[0, num_pages)``
(CK's branchless clamp): a corrupt table gives wrong numbers, never an illegal address.  The API checks what it can
without synchronising (shapes, dtypes, ``table_width x page_size >= max_seqlen_k``).

FP8 (key dtype ``fp8bf16``, CK's contract): Q and both caches hold FP8 e4m3 values, with fp32 descales read on the
device: ``q_descale`` one element; ``k_descale``/``v_descale`` one element each (``qscale(pertensor)``) or one per
page and K/V head (``qscale(kv_blockscale)``, CK's KV block scales: ``[num_pages, Hk]`` addressed by the strides
``stride_kdp``/``stride_kdh`` and ``stride_vdp``/``stride_vdh``, 0 for per-tensor descales).  Key ``j`` of a
sequence, in page ``p`` and K/V head ``h``, stands for ``k_descale[p, h] x K[j]`` and ``v_descale[p, h] x V[j]``;
the scores are ``scale x q_descale x (q . k)`` and the output ``(P V)`` / l over those values, written in bf16.
``qscale(per_token_head)`` (CK's newest): one descale per cached token and K/V head, ``[num_pages, page_size, Hk]``
(the slot strides ``stride_kds``/``stride_vds`` beside the page and head ones), and ``q_descale`` one element or
one per query token and head, ``[Tq, Hq]`` (strides ``stride_qdm``/``stride_qdh``; 0 otherwise).  Other keys take
null descale pointers.

Split-KV (``fwd_pagedkv``, decode): ``Out``/``Lse`` are the fp32 workspaces ``[B, Hq * splits, max_seqlen_q, Dv]``
/ ``[B, Hq * splits, max_seqlen_q]`` of the forward family's combine kernel (:mod:`fmha_dsl.kernels.triton_combine`),
which then writes ``[Tq, Hq, Dv]`` / ``[Hq, Tq]``.

``fmha_appendkv`` (family ``fwd_appendkv``): writes ``Knew``/``Vnew [Tnew, Hk, D]`` (``cu_seqlens_new [B + 1]``)
to each sequence's tokens ``seqlens_k[b] + t`` of the cache, RoPE applied to the new K (and to ``Q [Tnew, Hq, D]``
in place) from fp32 ``cos``/``sin [max_position, rotary_dim / 2]`` tables; ``LOOKUP`` 2 is a contiguous cache
``[B, capacity, Hk, D]`` (page = the sequence, ``table_width`` = capacity).  Rows that would land outside the
table, the cache or the rotary tables are not written.  FP8 caches (``fp8bf16``, ``qscale(pertensor)``): ``Q``,
``Knew``, ``Vnew`` are bf16 (the contract's compute type, ``*{out}``), the caches e4m3, and each new row is stored as
``e4m3(clamp(x / descale, -448, 448))`` (IEEE division, round to nearest even) with the fp32 descale that attention
reads: the one element of ``k_descale``/``v_descale`` (per-tensor, strides 0), or with ``qscale(kv_blockscale)``
the element of the row's page and head (a contiguous cache: of its sequence and head); other dtypes pass null
descale pointers.
"""

from __future__ import annotations

import math

from .fwd_abi import combine_args

ARGS: tuple[tuple[str, str], ...] = (
    ("Q", "*{dtype}"), ("K", "*{dtype}"), ("V", "*{dtype}"), ("Out", "*{out}"), ("Lse", "*fp32"),
    ("Alibi", "*fp32"), ("cu_seqlens_q", "*i32"), ("seqlens_k", "*i32"), ("Table", "*i32"), ("kv_indptr", "*i32"),
    ("q_descale", "*fp32"), ("k_descale", "*fp32"), ("v_descale", "*fp32"), ("sm_scale", "fp32"), ("softcap", "fp32"),
    ("max_seqlen_q", "i32"), ("max_seqlen_k", "i32"), ("nhead_q", "i32"), ("nhead_k", "i32"),
    ("head_dim_q", "i32"), ("head_dim_v", "i32"), ("num_pages", "i32"), ("table_width", "i32"),
    ("window_left", "i32"), ("window_right", "i32"), ("mask_bottom_right", "i32"), ("sink", "i32"),
    ("stride_qm", "i32"), ("stride_qh", "i32"),
    ("stride_kp", "i32"), ("stride_ks", "i32"), ("stride_kh", "i32"),
    ("stride_vp", "i32"), ("stride_vs", "i32"), ("stride_vh", "i32"),
    ("stride_ob", "i32"), ("stride_oh", "i32"), ("stride_om", "i32"),
    ("stride_lb", "i32"), ("stride_lh", "i32"), ("stride_lm", "i32"),
    ("stride_tb", "i32"), ("stride_ab", "i32"), ("stride_ah", "i32"),
    ("stride_kdp", "i32"), ("stride_kdh", "i32"), ("stride_vdp", "i32"), ("stride_vdh", "i32"),
    ("stride_qdm", "i32"), ("stride_qdh", "i32"), ("stride_kds", "i32"), ("stride_vds", "i32"),
)

# 16-divisible in the usual case: 16-byte aligned tensors and head dims that are multiples of 16
ALIGNED: tuple[str, ...] = (
    "Q", "K", "V", "Out", "stride_qm", "stride_qh", "stride_kp", "stride_ks", "stride_kh",
    "stride_vp", "stride_vs", "stride_vh", "stride_oh", "stride_om",
)

ALIGNED_AT: tuple[int, ...] = tuple(i for i, (n, _) in enumerate(ARGS) if n in ALIGNED)  # their positions

APPEND_ARGS: tuple[tuple[str, str], ...] = (
    ("Q", "*{out}"), ("K", "*{dtype}"), ("V", "*{dtype}"), ("Knew", "*{out}"), ("Vnew", "*{out}"),
    ("Cos", "*fp32"), ("Sin", "*fp32"), ("cu_seqlens_new", "*i32"), ("seqlens_k", "*i32"), ("Table", "*i32"),
    ("kv_indptr", "*i32"), ("k_descale", "*fp32"), ("v_descale", "*fp32"),
    ("max_seqlen_new", "i32"), ("nhead_q", "i32"), ("nhead_k", "i32"), ("head_dim_q", "i32"), ("head_dim_v", "i32"),
    ("rotary_half", "i32"), ("max_position", "i32"), ("num_pages", "i32"), ("table_width", "i32"),
    ("stride_qm", "i32"), ("stride_qh", "i32"),
    ("stride_kp", "i32"), ("stride_ks", "i32"), ("stride_kh", "i32"),
    ("stride_vp", "i32"), ("stride_vs", "i32"), ("stride_vh", "i32"),
    ("stride_knm", "i32"), ("stride_knh", "i32"), ("stride_vnm", "i32"), ("stride_vnh", "i32"),
    ("stride_cos", "i32"), ("stride_tb", "i32"),
    ("stride_kdp", "i32"), ("stride_kdh", "i32"), ("stride_vdp", "i32"), ("stride_vdh", "i32"),
)
APPEND_ALIGNED: tuple[str, ...] = ()
APPEND_BLOCK_M = 16   # new rows per append program; grid (cdiv(max_seqlen_new, 16), Hk [+ Hq], B)
APPEND_WARPS = 4

LOOKUPS = {"vllm": 0, "sglang": 1, "contiguous": 2}
VECTOR_BYTES = 16                   # the vectorized layout's vector
ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8bf16": 1}


def vector_elems(dtype: str) -> int:
    """Elements of one vector of the vectorized KV layout (8 for fp16/bf16, 4 for fp32, 16 for fp8)."""
    return VECTOR_BYTES // ELEMENT_BYTES[dtype]


def cache_geometry(layout: str, k_shape, k_strides, v_shape, v_strides) -> tuple:
    """``(num_pages, page_size, Hk, D, Dv, k_strides, v_strides)`` of caches in ``layout`` (``"linear"`` or
    ``"vectorized"``), the strides being the ABI's (page, slot, head) triples (see the module docstring).  Shapes are
    trusted here: the API checks them (:func:`fmha_dsl.paged_args.cache_pair`)."""
    if layout == "linear":
        return (k_shape[0], k_shape[1], k_shape[2], k_shape[3], v_shape[3],
                (k_strides[0], k_strides[1], k_strides[2]), (v_strides[0], v_strides[1], v_strides[2]))
    x = k_shape[4]
    return (k_shape[0], k_shape[3], k_shape[1], k_shape[2] * x, v_shape[3],
            (k_strides[0], k_strides[2], k_strides[1]), (v_strides[0], v_strides[2], v_strides[1]))
ROPES = {"none": 0, "inter": 1, "half": 2}


DTYPES = ("fp16", "bf16", "fp32")  # what the serving templates take, and the FP8 contracts:
FP8_DTYPES = ("fp8bf16",)          # FP8 e4m3 Q/K/V with fp32 descales (q/k/v_descale), bf16 output
# their descales: one per tensor; K/V's one per page and head; one per token and head (attention only: an append
# does not choose its rows' scales)
FP8_QSCALES = ("pertensor", "kv_blockscale", "per_token_head")
APPEND_QSCALES = ("pertensor", "kv_blockscale")
KV_SCALES = {"kv_blockscale": 1, "per_token_head": 2}   # the paged template's KV_SCALE (0: none or per tensor)


def qscales_of(dtype: str, family: str = "batch_prefill") -> tuple[str, ...]:
    """The ``qscale`` values the serving templates implement for ``dtype`` in ``family``: :data:`FP8_QSCALES` (an
    append: :data:`APPEND_QSCALES`) for the FP8 contracts, else ``no``."""
    if dtype not in FP8_DTYPES:
        return ("no",)
    return APPEND_QSCALES if family == "fwd_appendkv" else FP8_QSCALES


def descale_kind(q_shape, k_shape, v_shape) -> str:
    """The ``qscale`` of FP8 descales by their shapes: K's and V's ``pertensor`` (one element each),
    ``kv_blockscale`` (``[num_pages, Hk]``) or ``per_token_head`` (``[num_pages, page_size, Hk]``); a q descale of
    more than one element (``[Tq, Hq]``) is per token, with per-token or one-element K/V descales (``q_shape`` None:
    an append's, none).  ValueError when K's and V's differ in kind, or a per-token q meets block scales."""
    kinds = ["pertensor" if math.prod(s) == 1 else "per_token_head" if len(s) == 3 else "kv_blockscale"
             for s in (k_shape, v_shape)]
    if kinds[0] != kinds[1]:
        raise ValueError(f"`k_descale` and `v_descale` must be of one kind, got {kinds[0]} {tuple(k_shape)} and "
                         f"{kinds[1]} {tuple(v_shape)}")
    if q_shape is not None and math.prod(q_shape) != 1:
        if kinds[0] == "kv_blockscale":
            raise ValueError(f"a per-token `q_descale` {tuple(q_shape)} goes with per-token-head (or one-element) "
                             "K/V descales, not KV block scales [num_pages, Hk]")
        return "per_token_head"
    return kinds[0]


def descale_strides(k=None, v=None) -> tuple[int, int, int, int]:
    """``(stride_kdp, stride_kdh, stride_vdp, stride_vdh)`` of K's and V's FP8 descales, each given as ``(shape,
    element strides)`` (or None): the page and head strides of a ``[num_pages, Hk]`` (``kv_blockscale``) or
    ``[num_pages, page_size, Hk]`` (``per_token_head``) tensor, 0 for a descale of one element, whatever its shape,
    or none."""
    out = []
    for d in (k, v):
        one = d is None or math.prod(d[0]) == 1
        out += (0, 0) if one else (int(d[1][0]), int(d[1][-1]))
    return tuple(out)


def token_strides(q=None, k=None, v=None) -> tuple[int, int, int, int]:
    """``(stride_qdm, stride_qdh, stride_kds, stride_vds)``: a ``[Tq, Hq]`` q descale's token and head strides and
    the slot strides of ``[num_pages, page_size, Hk]`` K/V descales (``per_token_head``), each given as ``(shape,
    element strides)``; 0 for descales of one element, of one per page, or none."""
    qs = (0, 0) if q is None or math.prod(q[0]) == 1 else (int(q[1][0]), int(q[1][1]))
    return qs + tuple(int(d[1][1]) if d is not None and len(d[0]) == 3 and math.prod(d[0]) != 1 else 0
                      for d in (k, v))


def page_size(sig: dict) -> int:
    """The page size of a serving key's ``kv_cache(page_size=...)`` (a positive power of two; 1 when absent)."""
    ps = int(sig.get("page_size", 1))
    if ps < 1 or ps & (ps - 1):
        raise ValueError(f"page_size must be a positive power of two, got {ps}")
    return ps


def kv_vec(sig: dict) -> int:
    """``KV_VEC`` of a key: 0 for the linear KV layout; for CK's vectorized layout the elements of one 16-byte vector
    (:data:`VECTOR_BYTES`), which the page size and the head dims must be multiples of."""
    layout = sig.get("kv_layout", "linear")
    if layout == "linear":
        return 0
    if layout != "vectorized":
        raise ValueError(f"unknown kv_layout {layout!r} (linear, vectorized)")
    vec = vector_elems(sig.get("dtype", "fp16"))
    paged = sig.get("paged_kv", True)
    if paged and page_size(sig) % vec:
        raise ValueError(f"the vectorized layout groups {vec} slots of a page into one vector: page_size "
                         f"{page_size(sig)} must be a multiple of {vec}")
    for name in ("hdim_q", "hdim_v"):
        if int(sig[name]) % vec:
            raise ValueError(f"the vectorized layout splits the head dim into vectors of {vec}: {name} "
                             f"{sig[name]} is not a multiple")
    return vec


def pack(ptrs, qs, ks, vs, os_, ls, tb_stride, as_, nhq, nhk, dq, dv, msq, msk, num_pages, table_width, scale,
         softcap, wl, wr, br, sink, ds=(0, 0, 0, 0), ts=(0, 0, 0, 0)) -> list:
    """``fmha_paged``'s run-time arguments in :data:`ARGS` order -- the one packer of this ABI.

    ``ptrs``: the 13 pointer values (Q, K, V, Out, Lse, Alibi, cu_seqlens_q, seqlens_k, Table, kv_indptr, q_descale,
    k_descale, v_descale; the descales 0 unless the key is an FP8 contract).
    ``qs``: q's strides ``[Tq, Hq, D]``; ``ks``/``vs``: the caches' ABI strides (:func:`cache_geometry`); ``os_``: out's
    ``[Tq, Hq, Dv]``; ``ls``: the LSE's ``[Hq, Tq]`` (or None); ``tb_stride``: the block table's row stride (0 for
    SGLang's table); ``as_``: ALiBi strides over ``[B, Hq]`` (or None); ``ds``: :func:`descale_strides`; ``ts``:
    :func:`token_strides`.  ``scale`` None = ``1/sqrt(dq)``.
    """
    ls = (0, 0, 1) if ls is None else (0, ls[0], ls[1])
    return [*ptrs, 1.0 / math.sqrt(dq) if scale is None else float(scale), 0.0 if softcap is None else float(softcap),
            int(msq), int(msk), int(nhq), int(nhk), int(dq), int(dv), int(num_pages), int(table_width),
            int(wl), int(wr), int(br), int(sink), qs[0], qs[1], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
            0, os_[1], os_[0], *ls, int(tb_stride), *((0, 1) if as_ is None else as_), *ds, *ts]


_AT = {name: i for i, (name, _) in enumerate(ARGS)}
NHK = _AT["nhead_k"]
MAX_SK = _AT["max_seqlen_k"]


def split_args(args, ws, lws, ws_strides, lws_strides, nhead_q: int, num_splits: int) -> tuple[list, list]:
    """``(split kernel args, combine kernel args)``: the paged kernel writes the fp32 workspaces ``ws``/``lws``
    (strides from :func:`fmha_dsl.kernels.fwd_abi.workspace_strides`); the forward family's combine kernel reduces
    them into the ``Out``/``Lse`` that ``args`` carries (group mode)."""
    a = list(args)
    a[_AT["Out"]], a[_AT["Lse"]] = ws, lws
    o, lo = _AT["stride_ob"], _AT["stride_lb"]
    a[o:o + 3] = ws_strides[:3]
    a[lo:lo + 3] = lws_strides
    comb = combine_args(ws, lws, args[_AT["Out"]], args[_AT["Lse"]], args[_AT["cu_seqlens_q"]], seqlen_q=0,
                        nhead_q=nhead_q, num_splits=num_splits, head_dim_v=args[_AT["head_dim_v"]],
                        ws_strides=ws_strides, lws_strides=lws_strides, out_strides=args[o:o + 3],
                        lse_strides=args[lo:lo + 3])
    return a, comb


def workspace_bound(batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int, max_seqlen_k: int, head_dim_v: int,
                    compute_units: int) -> int:
    """fp32 elements that suffice for the split-KV workspaces of any ``fwd_pagedkv`` kernel on calls within these
    bounds: splits are at most 128 (``max_splits_log2`` <= 7), the key blocks of 16 keys, and twice what fills
    :data:`fmha_dsl.costmodel.SPLIT_WAVES` waves of at least ``batch x nhead_k`` programs
    (:func:`fmha_dsl.costmodel.splits_at` takes at most that many)."""
    from ..costmodel import SPLIT_WAVES
    from .fwd_abi import block_d

    progs = max(1, int(batch) * int(nhead_k))
    waves = 2 * -(-SPLIT_WAVES * max(int(compute_units), 1) // progs)
    s = max(1, min(128, -(-max(int(max_seqlen_k), 1) // 16), waves))
    rows = int(batch) * int(nhead_q) * s * max(1, int(max_seqlen_q))
    return rows * (block_d(head_dim_v) + 1)


# ---- the gathered route (batch_prefill through the forward family) ---------------------------------------------
# ``fmha_kv_gather`` (family ``kv_gather``; :mod:`fmha_dsl.kernels.triton_gather`) copies each sequence's first
# ``min(seqlens_k[b], table length x PAGE_SIZE)`` cached tokens (the rows the paged kernel reads) into contiguous
# ``Kout [rows, Hk, D]`` / ``Vout [rows, Hk, Dv]``, sequence after sequence, and writes their offsets
# ``cu_seqlens_k [B + 1]``: what the forward family's group-mode kernels take.  Grid ``(cdiv(max_seqlen_k,
# GATHER_BLOCK_M), Hk, B)``.  The three live in one fp32 workspace (:func:`gather_layout`), sized for ``B x
# max_seqlen_k`` rows (the host does not know the lengths' sum).
GATHER_ARGS: tuple[tuple[str, str], ...] = (
    ("K", "*{dtype}"), ("V", "*{dtype}"), ("Kout", "*{dtype}"), ("Vout", "*{dtype}"), ("seqlens_k", "*i32"),
    ("Table", "*i32"), ("kv_indptr", "*i32"), ("cu_seqlens_k", "*i32"),
    ("batch", "i32"), ("nhead_k", "i32"), ("num_pages", "i32"), ("table_width", "i32"),
    ("stride_kp", "i32"), ("stride_ks", "i32"), ("stride_kh", "i32"),
    ("stride_vp", "i32"), ("stride_vs", "i32"), ("stride_vh", "i32"), ("stride_tb", "i32"),
)
GATHER_BLOCK_M = 64        # cached rows per gather program
GATHER_MIN_ROWS = 128      # query rows per K/V head (max_seqlen_q x group) from which the gathered route is timed
# 16-divisible in the usual case (the call's paged kernel keeps the same promise); the workspace's parts are aligned
GATHER_ALIGNED: tuple[str, ...] = ("K", "V", "Kout", "Vout", "stride_kp", "stride_ks", "stride_kh", "stride_vp",
                                   "stride_vs", "stride_vh")
GATHER_FIELDS = ("dtype", "hdim_q", "hdim_v", "kv_layout", "kv_lookup", "page_size")  # what its binary depends on


def gather_layout(batch: int, nhead_k: int, max_seqlen_k: int, dq: int, dv: int, dtype: str) -> tuple[int, ...]:
    """``(K offset, V offset, cu_seqlens_k offset, total)`` in bytes of the gathered route's workspace: ``Kout``,
    ``Vout`` (``batch x max_seqlen_k`` rows each) and ``cu_seqlens_k [B + 1]``, each starting on 256 bytes."""
    def up(n):
        return -(-int(n) // 256) * 256

    rows = int(batch) * max(int(max_seqlen_k), 1) * int(nhead_k)
    kb = up(rows * int(dq) * ELEMENT_BYTES[dtype])
    vb = up(rows * int(dv) * ELEMENT_BYTES[dtype])
    return 0, kb, kb + vb, kb + vb + up(4 * (int(batch) + 1))


def gather_numel(batch: int, nhead_k: int, max_seqlen_k: int, dq: int, dv: int, dtype: str) -> int:
    """fp32 elements of the gathered route's workspace (:func:`gather_layout`)."""
    return gather_layout(batch, nhead_k, max_seqlen_k, dq, dv, dtype)[3] // 4


def gather_fits(batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int, max_seqlen_k: int, dq: int, dv: int,
                dtype: str, limit_bytes: int) -> bool:
    """Whether a call within these bounds may take the gathered route: a prefill (at least :data:`GATHER_MIN_ROWS`
    query rows per K/V head: the copy is then a small part of the attention's time), a workspace of at most
    ``limit_bytes``, and gathered tensors the forward kernel's int32 element offsets address."""
    rows = max(int(max_seqlen_q), 0) * (int(nhead_q) // max(int(nhead_k), 1))
    return rows >= GATHER_MIN_ROWS and bounded_layout(batch, nhead_k, max_seqlen_k, dq, dv, dtype,
                                                      limit_bytes) is not None


def bounded_layout(batch: int, nhead_k: int, max_seqlen_k: int, dq: int, dv: int, dtype: str,
                   limit_bytes: int) -> tuple[int, ...] | None:
    """:func:`gather_layout` of these bounds when the workspace is at most ``limit_bytes`` and its tensors are
    addressed by int32 element offsets, else None."""
    elems = int(batch) * max(int(max_seqlen_k), 1) * int(nhead_k) * max(int(dq), int(dv))
    lay = gather_layout(batch, nhead_k, max_seqlen_k, dq, dv, dtype)
    return lay if 1 <= int(max_seqlen_k) and lay[3] <= int(limit_bytes) and elems < (1 << 31) else None


def pack_gather(ptrs, ks, vs, tb_stride, batch, nhk, num_pages, table_width) -> list:
    """``fmha_kv_gather``'s run-time arguments in :data:`GATHER_ARGS` order.  ``ptrs``: the 8 pointer values (K, V,
    Kout, Vout, seqlens_k, Table, kv_indptr, cu_seqlens_k); ``ks``/``vs``: the caches' ABI strides
    (:func:`cache_geometry`); ``tb_stride``: the block table's row stride (0 for SGLang's table)."""
    return [*ptrs, int(batch), int(nhk), int(num_pages), int(table_width), *ks, *vs, int(tb_stride)]


def gather_grid(batch: int, nhead_k: int, max_seqlen_k: int) -> tuple[int, int, int]:
    """``(cdiv(max_seqlen_k, GATHER_BLOCK_M), Hk, B)``; any zero: nothing to launch."""
    return (-(-int(max_seqlen_k) // GATHER_BLOCK_M), int(nhead_k), int(batch))


def pack_append(ptrs, qs, ks, vs, kns, vns, cos_stride, tb_stride, nhq, nhk, dq, dv, max_new, rotary_half,
                max_position, num_pages, table_width, ds=(0, 0, 0, 0)) -> list:
    """``fmha_appendkv``'s run-time arguments in :data:`APPEND_ARGS` order.  ``ptrs``: the 13 pointer values (Q,
    K, V, Knew, Vnew, Cos, Sin, cu_seqlens_new, seqlens_k, Table, kv_indptr, k_descale, v_descale);
    ``qs``/``kns``/``vns``: ``[T, H, D]`` strides (token, head); ``ks``/``vs``: the caches' ABI strides
    (:func:`cache_geometry`); ``ds``: :func:`descale_strides`."""
    return [*ptrs, int(max_new), int(nhq), int(nhk), int(dq), int(dv), int(rotary_half), int(max_position),
            int(num_pages), int(table_width), qs[0], qs[1], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
            kns[0], kns[1], vns[0], vns[1], int(cos_stride), int(tb_stride), *ds]


def append_grid(batch: int, nhead_q: int, nhead_k: int, max_new: int, with_q: bool) -> tuple[int, int, int]:
    """``(cdiv(max_seqlen_new, APPEND_BLOCK_M), Hk + (Hq if q is rotated), B)``; any zero: nothing to launch."""
    return (-(-int(max_new) // APPEND_BLOCK_M), int(nhead_k) + (int(nhead_q) if with_q else 0), int(batch))


__all__ = ["ARGS", "ALIGNED", "ALIGNED_AT", "APPEND_ARGS", "APPEND_ALIGNED", "APPEND_BLOCK_M", "APPEND_WARPS",
           "LOOKUPS", "ROPES", "DTYPES", "FP8_DTYPES", "FP8_QSCALES", "APPEND_QSCALES", "KV_SCALES", "qscales_of",
           "descale_kind", "descale_strides", "token_strides",
           "page_size", "kv_vec", "VECTOR_BYTES",
           "ELEMENT_BYTES", "vector_elems", "cache_geometry", "pack", "split_args", "workspace_bound", "pack_append",
           "append_grid", "GATHER_ARGS", "GATHER_BLOCK_M", "GATHER_MIN_ROWS", "GATHER_ALIGNED", "GATHER_FIELDS",
           "gather_layout", "gather_numel", "gather_fits", "bounded_layout", "pack_gather", "gather_grid"]
