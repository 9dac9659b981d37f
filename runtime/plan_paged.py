"""The serving plans: attention over a paged KV cache (with split-KV and its combine for decode), and append-KV.

    plan = disp.plan(Problem(family="batch_prefill", paged_kv=True, kv_layout="linear", kv_lookup="vllm",
                             page_size=16, mode="group", ...))
    n = plan.workspace_numel(batch, nhead_q, max_seqlen_q, max_seqlen_k)       # fp32 elements (0: none needed)
    plan.run(q, k_cache, v_cache, out, lse, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
             max_seqlen_q=mq, max_seqlen_k=mk, workspace=ws)

A plan is made once per problem class and reused across steps with new tables and lengths: nothing here reads device
memory on the host, and with a caller's ``workspace`` nothing is allocated, so a serving step is CUDA-graph
capturable.  Arguments: :mod:`fmha_dsl.kernels.paged_abi` (its one packer each).
"""

from __future__ import annotations

from fmha_dsl.costmodel import split_limit
from fmha_dsl.kernels import paged_abi
from fmha_dsl.kernels.fwd_abi import COMBINE_BLOCK_M, block_d, grid_of, packs_gqa, workspace_strides

from .match import promised_indices
from .plan import (WORKSPACE_HINT, SplitLaunch, alibi_strides, check_promise, resolve_stream,
                   workspace_buffer)

_NAMES = tuple(n for n, _ in paged_abi.ARGS)


def _ptrs(objects: bool, tensors):
    return list(tensors) if objects else [0 if t is None else t.data_ptr() for t in tensors]


def _shape_strides(*descales) -> tuple:
    return tuple(None if d is None else (tuple(d.shape), d.stride()) for d in descales)


def _descale_strides(k_descale, v_descale) -> tuple:
    """The ABI's descale strides (:func:`fmha_dsl.kernels.paged_abi.descale_strides`) of FP8 descale tensors."""
    return paged_abi.descale_strides(*_shape_strides(k_descale, v_descale))


def pack_call(q, k_cache, v_cache, out, lse, *, lookup: str, seqlens_k, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
              block_table=None, kv_indptr=None, kv_indices=None, alibi_slopes=None, scale=None, softcap=None,
              window=None, bottom_right=True, sink=0, descales=(None, None, None), objects=False) -> list:
    """``fmha_paged``'s arguments for a call's tensors (``lookup``: the table form, ``"vllm"`` or ``"sglang"``;
    ``objects``: tensors in the pointer slots, for the CPU interpreter) -- what the API and :meth:`PagedPlan.args`
    pack, through the ABI's one packer.  ``descales``: FP8's ``(q_descale, k_descale, v_descale)`` tensors."""
    if lookup == "vllm":
        table, indptr, tb_stride, width = block_table, None, block_table.stride(0), block_table.shape[1]
    else:
        table, indptr, tb_stride, width = kv_indices, kv_indptr, 0, 0
    ptrs = _ptrs(objects, (q, k_cache, v_cache, out, lse, alibi_slopes, cu_seqlens_q, seqlens_k, table, indptr,
                           *descales))
    wl, wr = (-1, -1) if window is None else window
    num_pages, _, hk, _, dv, ks, vs = geometry(k_cache, v_cache)
    given = _shape_strides(*descales)
    return paged_abi.pack(ptrs, q.stride()[:2], ks, vs, out.stride(), None if lse is None else lse.stride(),
                          tb_stride, None if alibi_slopes is None else alibi_strides(alibi_slopes), q.shape[1], hk,
                          q.shape[2], dv, max_seqlen_q, max_seqlen_k, num_pages, width, scale, softcap, wl, wr,
                          int(bool(bottom_right)), int(sink), paged_abi.descale_strides(*given[1:]),
                          paged_abi.token_strides(*given))


def layout_of(k_cache) -> str:
    """The KV layout of a cache tensor: 4-D linear ``[P, page, Hk, D]``, 5-D vectorized (:mod:`.paged_abi`)."""
    return "vectorized" if k_cache.dim() == 5 else "linear"


def geometry(k_cache, v_cache) -> tuple:
    """:func:`fmha_dsl.kernels.paged_abi.cache_geometry` of two cache tensors."""
    return paged_abi.cache_geometry(layout_of(k_cache), k_cache.shape, k_cache.stride(), v_cache.shape,
                                    v_cache.stride())


class PagedPlan:
    """Runs a paged-attention class: ``fmha_paged`` (``batch_prefill``), or its split-KV form (``fwd_pagedkv``) into
    fp32 workspaces followed by the combine kernel."""

    __slots__ = ("api_family", "problem", "entry", "stages", "block_m", "packed", "splits", "_split", "_stage",
                 "_aligned_idx", "lookup")

    def __init__(self, problem, stages):
        self.api_family = "batch_prefill"
        self.problem = problem
        self.stages = tuple(stages)
        self._stage = self.stages[0]
        self.entry = self._stage.entry
        build = self.entry.build or {}
        self.block_m = int(build.get("block_m") or self.entry.alg["tile"][0])
        self.packed = packs_gqa(self.entry.alg.get("pipeline", ""))
        self.lookup = self.entry.sig["kv_lookup"]
        self._aligned_idx = promised_indices(build, _NAMES)
        self.splits = split_limit(self.entry)
        self._split = None
        if self.splits:
            self._split = SplitLaunch.of(self._stage, self.stages[1], self.block_m, block_d(self.entry.sig["hdim_v"]))

    @property
    def kernel_id(self) -> str:
        return self._stage.kernel_id

    def __repr__(self) -> str:
        return f"PagedPlan({', '.join(s.entry.name for s in self.stages)})"

    def _count(self, batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int, max_seqlen_k: int) -> int:
        gx, heads, _ = grid_of(self.packed, batch, nhead_q, nhead_k, max_seqlen_q, self.block_m)
        return self._split.count(self.splits, batch, nhead_q, max_seqlen_q, max_seqlen_k, gx * heads * batch)

    def workspace_numel(self, batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int, max_seqlen_k: int) -> int:
        """fp32 elements of the split-KV workspace a call within these bounds needs (0 without split-KV)."""
        if not self.splits:
            return 0
        s = self._count(batch, nhead_q, nhead_k, max_seqlen_q, max_seqlen_k)
        wst, lst = workspace_strides(batch, nhead_q, s, max_seqlen_q, self._split.block_dv)
        return batch * (wst[0] + lst[0])

    def args(self, q, k_cache, v_cache, out, lse=None, *, seqlens_k, cu_seqlens_q, max_seqlen_q, max_seqlen_k,
             block_table=None, kv_indptr=None, kv_indices=None, alibi_slopes=None, scale=None, softcap=None,
             window=None, bottom_right=True, sink=0, descales=(None, None, None), objects=False):
        """``(batch, nhead_q, max_seqlen_q, args)`` for :meth:`launch` (``objects``: tensors in the pointer slots, for
        the CPU interpreter; ``descales``: FP8's three descale tensors)."""
        args = pack_call(q, k_cache, v_cache, out, lse, lookup=self.lookup, seqlens_k=seqlens_k,
                         cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                         block_table=block_table, kv_indptr=kv_indptr, kv_indices=kv_indices,
                         alibi_slopes=alibi_slopes, scale=scale, softcap=softcap, window=window,
                         bottom_right=bottom_right, sink=sink, descales=descales, objects=objects)
        return cu_seqlens_q.shape[0] - 1, q.shape[1], int(max_seqlen_q), args

    def launch(self, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args, stream=None,
               workspace=None) -> None:
        """Launch on ``device`` (torch's current stream there, or ``stream``).  Split-KV plans need ``workspace``
        (:meth:`workspace_numel` elements; default: from torch's caching allocator).  Returns what it launched,
        ``([(kernel, grid, arguments)], workspace buffer | None)``, for the replay path (:mod:`fmha_dsl.replay`)."""
        return launch_steps(self.launches, device, batch, nhead_q, max_seqlen_q, args, stream, workspace)

    def launches(self, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args, workspace=None):
        """``([(kernel, grid, arguments)], workspace buffer | None)``: what :meth:`launch` enqueues, in order."""
        nhk = args[paged_abi.NHK]
        gx, heads, _ = grid_of(self.packed, batch, nhead_q, nhk, max_seqlen_q, self.block_m)
        if not (gx and heads and batch):
            return [], None
        kern = self._stage.kernel(device)
        if self._aligned_idx and not kern.needs_objects:
            check_promise(self.entry, self._aligned_idx, _NAMES, args)
        if self._split is None:
            return [(kern, (gx, heads, batch), args)], None
        import torch

        s = self._count(batch, nhead_q, nhk, max_seqlen_q, args[paged_abi.MAX_SK])
        wst, lst = workspace_strides(batch, nhead_q, s, max_seqlen_q, self._split.block_dv)
        n_o = batch * wst[0]
        dev = torch.device(f"cuda:{device}" if device >= 0 else "cpu")
        buf = workspace_buffer(workspace, n_o + batch * lst[0], dev, WORKSPACE_HINT)
        if kern.needs_objects:
            wp, lp = buf[:n_o], buf[n_o:]
        else:
            wp = buf.data_ptr()
            lp = wp + 4 * n_o
        a, cargs = paged_abi.split_args(args, wp, lp, wst, lst, nhead_q, s)
        comb = self._split.combine.kernel(device)
        return [(kern, (gx, heads * s, batch), a),
                (comb, ((max_seqlen_q + COMBINE_BLOCK_M - 1) // COMBINE_BLOCK_M, nhead_q, batch), cargs)], buf

    def run(self, q, k_cache, v_cache, out, lse=None, *, stream=None, workspace=None, **kw):
        """Compute ``out [Tq, Hq, Dv]`` (and ``lse [Hq, Tq]``).  Keywords as :meth:`args`."""
        device = q.get_device()
        objects = self._stage.kernel(device).needs_objects
        batch, nhq, msq, args = self.args(q, k_cache, v_cache, out, lse, objects=objects, **kw)
        self.launch(device, batch, nhq, msq, args, stream, workspace)
        return out


def launch_steps(launches, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args, stream, workspace):
    """Enqueue what ``launches(device, batch, nhead_q, max_seqlen_q, args, workspace)`` returns (``([(kernel, grid,
    arguments)], workspace buffer | None)``) on ``stream`` (default: torch's current one); returns it.  A workspace
    taken from torch's allocator is recorded on a caller's own stream."""
    stream, explicit = resolve_stream(stream, device)
    steps, buf = launches(device, batch, nhead_q, max_seqlen_q, args, workspace)
    if buf is not None and workspace is None and explicit and device >= 0:
        import torch

        buf.record_stream(torch.cuda.ExternalStream(stream, device=buf.device))
    for kern, grid, a in steps:
        kern.launch(grid, a, stream)
    return steps, buf


class AppendPlan:
    """Runs an append-KV class: ``fmha_appendkv`` (new K/V rows into the cache, RoPE on K and, in place, on q)."""

    __slots__ = ("api_family", "problem", "entry", "stages", "_stage", "lookup")

    def __init__(self, problem, stages):
        self.api_family = "fwd_appendkv"
        self.problem = problem
        self.stages = tuple(stages)
        self._stage = self.stages[0]
        self.entry = self._stage.entry
        self.lookup = self.entry.sig["kv_lookup"] if self.entry.sig["paged_kv"] else "contiguous"

    @property
    def kernel_id(self) -> str:
        return self._stage.kernel_id

    def __repr__(self) -> str:
        return f"AppendPlan({self.entry.name})"

    def run(self, k_cache, v_cache, k_new, v_new, *, stream=None, **kw) -> list:
        """Write the new rows (and rotate ``q`` in place when given).  Paged caches ``[P, page_size, Hk, D]`` (or the
        vectorized layout's 5-D pair); a contiguous one is ``[B, capacity, Hk, D]``.  Keywords as :meth:`launches`.
        Returns what it launched, ``[(kernel, grid, arguments)]``, for the replay path (:mod:`fmha_dsl.replay`)."""
        device = k_new.get_device()
        stream = resolve_stream(stream, device)[0]
        steps = self.launches(k_cache, v_cache, k_new, v_new, **kw)
        for kern, grid, args in steps:
            kern.launch(grid, args, stream)
        return steps

    def launches(self, k_cache, v_cache, k_new, v_new, *, seqlens_k, cu_seqlens_new, max_seqlen_new,
                 block_table=None, kv_indptr=None, kv_indices=None, rotary_cos=None, rotary_sin=None, q=None,
                 k_descale=None, v_descale=None):
        """``[(kernel, grid, arguments)]``: what :meth:`run` enqueues (``k_descale``/``v_descale``: an FP8 cache's
        fp32 descales, one element each or ``[num_pages, Hk]``)."""
        device = k_new.get_device()
        kern = self._stage.kernel(device)
        if self.lookup == "vllm":
            table, indptr, tb_stride, width = block_table, None, block_table.stride(0), block_table.shape[1]
        elif self.lookup == "sglang":
            table, indptr, tb_stride, width = kv_indices, kv_indptr, 0, 0
        else:
            table, indptr, tb_stride, width = None, None, 0, k_cache.shape[1]
        ptrs = _ptrs(kern.needs_objects, (q, k_cache, v_cache, k_new, v_new, rotary_cos, rotary_sin, cu_seqlens_new,
                                          seqlens_k, table, indptr, k_descale, v_descale))
        half = 0 if rotary_cos is None else rotary_cos.shape[1]
        num_pages, _, _, _, _, ks, vs = geometry(k_cache, v_cache)
        args = paged_abi.pack_append(ptrs, (0, 0) if q is None else q.stride()[:2], ks, vs, k_new.stride()[:2],
                                     v_new.stride()[:2], 0 if rotary_cos is None else rotary_cos.stride(0), tb_stride,
                                     0 if q is None else q.shape[1], k_new.shape[1], k_new.shape[2],
                                     v_new.shape[2], max_seqlen_new, half,
                                     0 if rotary_cos is None else rotary_cos.shape[0], num_pages, width,
                                     _descale_strides(k_descale, v_descale))
        g = paged_abi.append_grid(cu_seqlens_new.shape[0] - 1, 0 if q is None else q.shape[1], k_new.shape[1],
                                  max_seqlen_new, q is not None)
        return [(kern, g, args)] if min(g) else []


__all__ = ["PagedPlan", "AppendPlan", "pack_call", "layout_of", "geometry", "launch_steps"]
