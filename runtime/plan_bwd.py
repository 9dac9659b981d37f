"""The backward plan: CK's three stages with the workspace they share, declared up front.

    plan = disp.plan(Problem(family="bwd_dq_dk_dv", ...))
    n = plan.workspace_numel(batch, nhead_q, max_seqlen_q, max_seqlen_k, head_dim_q)   # fp32 elements, upper bounds
    plan.run(q, k, v, out, lse, dout, dq, dk, dv, workspace=ws, ...)                    # torch tensors

Stages (:mod:`fmha_dsl.kernels.bwd_abi`): ``bwd_dot_do_o`` (D = rowsum(dO * O)), ``bwd_dq_dk_dv`` (dK, dV and the
fp32 dQ accumulator), ``bwd_convert_dq`` (dQ in the input dtype); a deterministic plan runs the first two only (its
dQ programs store dQ itself).  The workspace is sized from upper bounds alone (batch, heads, max seqlens, head dim;
never from ``cu_seqlens``), so a caller can allocate it once and reuse it; its accumulator part is zeroed on the
launch stream before the main stage, and nothing here reads device memory on the host: a group-mode backward given
``max_seqlen_q/k`` is CUDA-graph capturable.
"""

from __future__ import annotations

from fmha_dsl.kernels import bwd_abi

from .match import promised_indices
from .plan import check_promise, dims, resolve_stream, workspace_buffer

_NAMES = tuple(n for n, _ in bwd_abi.ARGS)
_DOT_NAMES = tuple(n for n, _ in bwd_abi.DOT_ARGS)
_CONVERT_NAMES = tuple(n for n, _ in bwd_abi.CONVERT_ARGS)


class BackwardPlan:
    """Runs a backward problem class: ``stages`` as the dispatcher made them (``[dq_dk_dv, dot_do_o, convert_dq]``),
    launched dot -> main -> convert (convert only for atomic dQ: :func:`fmha_dsl.kernels.bwd_abi.converts`)."""

    __slots__ = ("api_family", "problem", "entry", "stages", "block_n", "deterministic", "_group", "_aligned_idx",
                 "_dot_idx", "_conv_idx", "_dot", "_main", "_conv")

    promised_step = 1  # the launch (dot, main, convert) whose arguments _aligned_idx indexes

    def __init__(self, problem, stages):
        main, dot, conv = stages
        self.api_family = "bwd"
        self.problem = problem
        self.entry = main.entry
        self.stages = (dot, main, conv)
        self._dot, self._main, self._conv = dot, main, conv
        build = self.entry.build or {}
        self.block_n = int(build.get("block_n") or self.entry.alg["tile"][1])
        self.deterministic = bool(self.entry.sig.get("deterministic"))
        self._group = self.entry.sig["mode"] == "group"
        self._aligned_idx = promised_indices(build, _NAMES)
        self._dot_idx = promised_indices(dot.entry.build, _DOT_NAMES)  # the 1-d stages' own (an aligned build's)
        self._conv_idx = promised_indices(conv.entry.build, _CONVERT_NAMES)

    @property
    def accumulates(self) -> bool:
        """Whether dQ goes through the zeroed fp32 accumulator and the convert stage (atomic dQ)."""
        return bwd_abi.converts(self.deterministic)

    @property
    def kernel_id(self) -> str:
        return self._main.kernel_id

    def __repr__(self) -> str:
        return f"BackwardPlan({', '.join(s.entry.name for s in self.stages)})"

    def workspace_numel(self, batch: int, nhead_q: int, max_seqlen_q: int, max_seqlen_k: int,
                        head_dim_q: int) -> int:
        """fp32 elements of the workspace a call within these bounds needs (a caller may allocate it once)."""
        return bwd_abi.workspace(batch, nhead_q, max_seqlen_q, max_seqlen_k, head_dim_q, self.block_n,
                                 self.deterministic)["numel"]

    def run(self, q, k, v, out, lse, dout, dq, dk, dv, *, dbias=None, bias=None, alibi_slopes=None,
            cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, scale=None, softcap=None,
            dropout_p=0.0, seed=0, offset=0, window=None, bottom_right=True, sink=0, workspace=None, stream=None):
        """Write ``dq``, ``dk``, ``dv`` (and the full-size ``dbias [B, Hq, Sq, Sk]`` when given) for torch tensors of
        this plan's class.  Layouts as the forward's (batch ``[B, H, S, D]``, group ``[T, H, D]``, head dim
        contiguous); ``lse`` is the forward's (``[B, Hq, Sq]`` / ``[Hq, Tq]`` fp32, rows contiguous).  ``workspace``:
        a float32 tensor of at least :meth:`workspace_numel` elements on q's device (default: allocated here from
        torch's caching allocator).  Returns what it launched, ``([(kernel, grid, arguments)], workspace)`` (no launch
        for an empty problem), for the replay path (:mod:`fmha_dsl.replay`)."""
        import torch

        device = q.get_device()
        stream, explicit = resolve_stream(stream, device)
        steps, acc_part, buf = self.launches(q, k, v, out, lse, dout, dq, dk, dv, dbias=dbias, bias=bias,
                                           alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                                           cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                           max_seqlen_k=max_seqlen_k, scale=scale, softcap=softcap,
                                           dropout_p=dropout_p, seed=seed, offset=offset, window=window,
                                           bottom_right=bottom_right, sink=sink, workspace=workspace)
        if not steps:
            return steps, None
        if acc_part is not None:  # atomic dQ: its accumulator zeroed on the launch stream
            if explicit and device >= 0:
                with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=q.device)):
                    acc_part.zero_()
            else:
                acc_part.zero_()
        for kern, grid, args in steps:
            kern.launch(grid, args, stream)
        return steps, buf

    def launches(self, q, k, v, out, lse, dout, dq, dk, dv, *, dbias=None, bias=None, alibi_slopes=None,
                 cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, scale=None,
                 softcap=None, dropout_p=0.0, seed=0, offset=0, window=None, bottom_right=True, sink=0,
                 workspace=None):
        """``([(kernel, grid, arguments)], the dQ accumulator to zero first or None, the workspace)``: what
        :meth:`run` enqueues after zeroing the accumulator; no launch for an empty problem."""
        group = self._group
        batch, nhq, nhk, dq_, dv_, sq, sk, msq, msk = dims(self.entry, group, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                           max_seqlen_q, max_seqlen_k)
        gd, gm, gc = bwd_abi.grids(batch, nhq, nhk, msq, msk, self.block_n, self.deterministic)
        if not (min(gd) and min(gm)):
            return [], None, None
        device = q.get_device()
        ws = bwd_abi.workspace(batch, nhq, msq, msk, dq_, self.block_n, self.deterministic)
        workspace = workspace_buffer(workspace, ws["numel"], q.device, "plan.workspace_numel(batch, nhead_q, "
                                     "max_seqlen_q, max_seqlen_k, head_dim_q)")
        parts = bwd_abi.workspace_parts(workspace, ws)
        acc_part = parts["acc"] if self.accumulates else None
        objects = self._main.kernel(device).needs_objects
        tensors = {"q": q, "k": k, "v": v, "out": out, "dout": dout, "lse": lse, "dq": dq, "dk": dk, "dv": dv,
                   "dbias": dbias, "bias": bias, "alibi": alibi_slopes, "cu_q": cu_seqlens_q, "cu_k": cu_seqlens_k,
                   "d": parts["d"], "l2": parts["l2"], "acc": acc_part}
        if objects:
            ptrs = tensors
        else:
            ptrs = {key: (0 if t is None else t.data_ptr()) for key, t in tensors.items()}
        ls = (lse.stride(0),) if group else lse.stride()
        bs = None if bias is None else bwd_abi.bias_strides(bias.shape, bias.stride())
        gs = None if dbias is None else dbias.stride()
        if alibi_slopes is None:
            as_ = None
        else:
            st = alibi_slopes.stride()
            as_ = (0, st[0]) if alibi_slopes.dim() == 1 else (st[0], st[1])
        wl, wr = (-1, -1) if window is None else window
        dot, main, conv = bwd_abi.pack(ptrs, group, q.stride(), k.stride(), v.stride(), out.stride(), dout.stride(),
                                       dq.stride(), dk.stride(), dv.stride(), ls, bs, gs, as_, ws, nhq=nhq, nhk=nhk,
                                       dq=dq_, dv=dv_, sq=sq, sk=sk, msq=msq, msk=msk, scale=scale,
                                       softcap=softcap, dropout_p=dropout_p, seed=seed, offset=offset, wl=wl, wr=wr,
                                       br=bottom_right, sink=sink)
        if not objects:
            check_promise(self.entry, self._aligned_idx, _NAMES, main)
            check_promise(self._dot.entry, self._dot_idx, _DOT_NAMES, dot)
            if self.accumulates:
                check_promise(self._conv.entry, self._conv_idx, _CONVERT_NAMES, conv)
        steps = [(self._dot.kernel(device), gd, dot), (self._main.kernel(device), gm, main)]
        if self.accumulates:
            steps.append((self._conv.kernel(device), gc, conv))
        return steps, acc_part, workspace


__all__ = ["BackwardPlan"]
