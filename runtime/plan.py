"""Execution plans: the stages of a problem class, their launch arguments, and the launch itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fmha_dsl.errors import UsageError, error
from fmha_dsl.costmodel import occupancy, split_limit, splits_at

from . import abi
from fmha_dsl.kernels.fwd_abi import (COMBINE_BLOCK_M, aligned_names, block_d, grid_of, packs_gqa, replay_patches,
                                      split_args, workspace_strides)
from fmha_dsl.kernels.fwd_abi import pack as fwd_args

from .match import promised_indices

if TYPE_CHECKING:
    from fmha_dsl.registry import Entry


class KernelLoader(Protocol):
    """What a plan needs of its dispatcher (:class:`fmha_dsl.runtime.dispatch.Dispatcher` is one; this module sits
    below ``dispatch`` and does not import it)."""

    compute_units: int
    arch: str

    def load(self, entry: Entry, device: int): ...

# ---------------------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------------------
class Stage:
    """One kernel launch of a plan: the registry entry and its loaded binary per device."""

    __slots__ = ("family", "entry", "kernel_id", "_dispatcher", "_kernels")

    def __init__(self, entry: Entry, dispatcher: KernelLoader):
        self.family = entry.sig["family"]
        self.entry = entry
        self.kernel_id = entry.identifier
        self._dispatcher = dispatcher
        self._kernels: dict[int, object] = {}

    def kernel(self, device: int):
        k = self._kernels.get(device)
        if k is None:
            k = self._dispatcher.load(self.entry, device)
            self._kernels[device] = k
        return k

    def __repr__(self) -> str:
        return f"Stage({self.family}, {self.entry.name})"


def bias_strides(bias) -> tuple:
    sh, st = bias.shape, bias.stride()
    return tuple(0 if sh[i] == 1 else st[i] for i in range(4))


def alibi_strides(slopes) -> tuple:
    st = slopes.stride()
    return (0, st[0]) if len(st) == 1 else (st[0], st[1])


class Plan:
    """An execution plan: the stages that compute a problem class (forward: one stage).

    :meth:`run` launches it on torch tensors (any strides; the head dim, and for V the head dim or the key
    axis, must have stride 1).  Arguments must describe a problem of the class the plan was made for; the
    dispatcher (or :func:`fmha_dsl.attention`) checks that, this method does not.
    """

    __slots__ = ("api_family", "stages", "problem", "entry", "_stage", "_kernels", "block_m", "_group", "_lse",
                 "_aligned_idx", "_extra_aligned_idx", "splits", "_split", "packed")

    def __init__(self, problem, stages):
        self.api_family = problem.family
        self.problem = problem
        self.stages = tuple(stages)
        self._stage = self.stages[0]
        self._kernels = self._stage._kernels
        self.entry = self._stage.entry
        build = self.entry.build or {}
        self.block_m = int(build.get("block_m") or self.entry.alg["tile"][0])
        self._group = self.entry.sig["mode"] == "group"
        self._lse = bool(self.entry.sig["lse"])
        names = abi.FWD_NAMES
        self._aligned_idx = promised_indices(build, names)
        # what fmha_dsl.attention's `aligned` class key does not already guarantee (it checks aligned_names)
        usual = set(aligned_names(self.entry.sig.get("vlayout", "r")))
        self._extra_aligned_idx = tuple(i for i in self._aligned_idx if names[i] not in usual)
        # split-KV: at most this many splits per launch (0: not a split plan); see SplitLaunch
        self.splits = split_limit(self.entry)
        self._split = None
        # the query heads of a GQA group packed into one program's rows (grid: fwd_abi.grid_of)
        self.packed = packs_gqa(self.entry.alg.get("pipeline", ""))
        if self.splits:
            if problem.family == "fwd_splitkv" and problem.num_splits > 1:
                self.splits = int(problem.num_splits)
            self._split = SplitLaunch.of(self._stage, self.stages[1], self.block_m,
                                         int(build.get("block_dv") or block_d(self.entry.sig["hdim_v"])))

    @property
    def kernel_id(self) -> str:
        return self._stage.kernel_id

    def is_valid(self) -> bool:
        return bool(self.stages)

    def __repr__(self) -> str:
        return f"Plan({self.api_family}: {', '.join(s.entry.name for s in self.stages)})"

    def args(self, q, k, v, out, lse=None, *, bias=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=None, max_seqlen_k=None, scale=None, softcap=None, dropout_p=0.0, seed=0, offset=0,
             window=None, bottom_right=True, sink=0, ptr=None):
        """``(batch, nhead_q, max_seqlen_q, args)``: what :meth:`launch` takes, from tensors.

        ``ptr(x)`` turns a tensor (or None) into a pointer value (default ``x.data_ptr()``, None -> 0).
        """
        group = self._group
        batch, nhq, nhk, dq, dv, sq, sk, msq, msk = dims(self.entry, group, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                         max_seqlen_q, max_seqlen_k)
        tensors = (q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k)
        if ptr is None:
            ptrs = [0 if x is None else x.data_ptr() for x in tensors]
        else:
            ptrs = [ptr(x) for x in tensors]
        wl, wr = (-1, -1) if window is None else window
        args = fwd_args(ptrs, group, q.stride(), k.stride(), v.stride(), out.stride(),
                        None if lse is None else lse.stride(), None if bias is None else bias_strides(bias),
                        None if alibi_slopes is None else alibi_strides(alibi_slopes), nhq, nhk, dq, dv, sq, sk, msq,
                        msk, scale, softcap, dropout_p, seed, offset, wl, wr, int(bool(bottom_right)), int(sink))
        return batch, nhq, msq, args

    def launch(self, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args, stream=None) -> None:
        """Launch on ``device`` (torch's current stream there, or ``stream``: int handle or torch stream)."""
        gx, heads, _ = grid_of(self.packed, batch, nhead_q, args[_NHK], max_seqlen_q, self.block_m)
        if not (gx and nhead_q and batch):
            return
        kern = self._kernels.get(device)
        if kern is None:
            kern = self._stage.kernel(device)
        if self._aligned_idx and not kern.needs_objects:
            check_promise(self.entry, self._aligned_idx, abi.FWD_NAMES, args)
        stream, explicit = resolve_stream(stream, device)
        if self._split is not None:
            self._split.launch(kern, self.splits, device, gx, heads, batch, nhead_q, max_seqlen_q, args, stream,
                               explicit)
        else:
            kern.launch((gx, heads, batch), args, stream)

    def replay(self, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args):
        """What the torch fast path (runtime/torch_fast.cpp) needs to replay this plan's launches for a batch-mode
        call like the one ``args`` describes: ``(steps, split)`` -- per launch ``(kernel, fast_spec, grid, args,
        patches, grid_y_splits)`` (:func:`fmha_dsl.kernels.fwd_abi.replay_patches`) and, for a split plan, ``(limit,
        n0, programs, compute units, occupancy, BLOCK_DV, nhead_q, batch, max_seqlen_q)`` from which it derives the
        split count and the workspaces as :class:`SplitLaunch` does -- or None when a kernel is not launched natively
        (no ``fast_spec``)."""
        gx, heads, _ = grid_of(self.packed, batch, nhead_q, args[_NHK], max_seqlen_q, self.block_m)
        kern = self._stage.kernel(device)
        main, comb = replay_patches(self._split is not None)
        if self._split is None:
            spec = getattr(kern, "fast_spec", None)
            return None if spec is None else (((kern, spec, (gx, heads, batch), list(args), main, False),), None)
        sp = self._split
        ckern = sp.combine.kernel(device)
        specs = getattr(kern, "fast_spec", None), getattr(ckern, "fast_spec", None)
        if None in specs:
            return None
        s = sp.count(self.splits, batch, nhead_q, max_seqlen_q, args[_MAX_SK], gx * heads * batch)
        wst, lst = workspace_strides(batch, nhead_q, s, max_seqlen_q, sp.block_dv)
        a, cargs = split_args(args, 0, 0, wst, lst, nhead_q, s)  # the workspaces' addresses: patched per call
        cgrid = ((max_seqlen_q + COMBINE_BLOCK_M - 1) // COMBINE_BLOCK_M, nhead_q, batch)
        steps = ((kern, specs[0], (gx, heads, batch), a, main, True), (ckern, specs[1], cgrid, cargs, comb, False))
        return steps, (self.splits, sp.n0, gx * heads * batch, sp.cus, sp.occupancy, sp.block_dv, nhead_q, batch,
                       max_seqlen_q)

    def run(self, q, k, v, out, lse=None, *, stream=None, **kw):
        """Compute ``out`` (and ``lse``) for tensors of this plan's problem class.  Keywords as :meth:`args`."""
        if self._lse and lse is None:
            raise error("usage.value", f"kernel {self.entry.name} stores the LSE: pass an lse tensor", None,
                        "[B, Hq, Sq] (batch) or [Hq, Tq] (group) float32", cls=UsageError)
        device = q.get_device()
        kern = self._kernels.get(device) or self._stage.kernel(device)
        batch, nhq, msq, args = self.args(q, k, v, out, lse, ptr=(lambda x: x) if kern.needs_objects else None, **kw)
        self.launch(device, batch, nhq, msq, args, stream)
        return out


_MAX_SK = abi.FWD_NAMES.index("max_seqlen_k")
_NHK = abi.FWD_NAMES.index("nhead_k")
_I32_MAX = (1 << 31) - 1


class SplitLaunch:
    """Launch a split-KV plan: the split kernel into fp32 workspaces, then the combine kernel into ``out``/``lse``.

    Splits per launch: :func:`fmha_dsl.costmodel.splits_at` (the shortest critical path over the SMs x the split
    kernel's occupancy, at most the kernel's count or the problem's ``num_splits`` and the key blocks), halved while
    the workspace's element strides would overflow int32.  The workspaces ``[B, Hq * splits, max_seqlen_q,
    BLOCK_DV]`` / ``[B, Hq * splits, max_seqlen_q]`` come from torch's caching allocator on the launch stream's device
    (stream-ordered: freed after the launch, reused only behind it on torch's current stream; a caller's own stream is
    recorded on them).
    """

    __slots__ = ("combine", "block_m", "n0", "block_dv", "cus", "occupancy")

    def __init__(self, combine: Stage, block_m: int, n0: int, block_dv: int, cus: int, occupancy: int = 1):
        self.combine, self.block_m, self.n0, self.block_dv, self.cus = combine, block_m, n0, block_dv, cus
        self.occupancy = occupancy

    @classmethod
    def of(cls, split: Stage, combine: Stage, block_m: int, block_dv: int) -> SplitLaunch:
        """The launcher of a split stage and its combine: the device's compute units and the split kernel's
        occupancy (programs resident per CU, from its build) decide the split count."""
        d = split._dispatcher
        return cls(combine, block_m, int(split.entry.alg["tile"][1]), block_dv, d.compute_units,
                   occupancy(split.entry, d.arch))

    def count(self, limit: int, batch: int, nhead_q: int, max_seqlen_q: int, max_seqlen_k: int,
              nprog: int | None = None) -> int:
        """Splits for a launch of ``nprog`` programs before splitting (default: query blocks x heads x batch)."""
        if nprog is None:
            nprog = -(-max(int(max_seqlen_q), 1) // self.block_m) * nhead_q * batch
        s = splits_at(int(limit), int(max_seqlen_k), self.n0, nprog, self.cus, self.occupancy)
        while s > 1 and nhead_q * s * max(1, max_seqlen_q) * self.block_dv > _I32_MAX:
            s //= 2
        return s

    def launch(self, kern, limit, device, gx, heads, batch, nhead_q, max_seqlen_q, args, stream,
               explicit_stream) -> None:
        import torch

        s = self.count(limit, batch, nhead_q, max_seqlen_q, args[_MAX_SK], gx * heads * batch)
        wst, lst = workspace_strides(batch, nhead_q, s, max_seqlen_q, self.block_dv)
        dev = f"cuda:{device}" if device >= 0 else "cpu"
        n_o = batch * wst[0]
        buf = torch.empty(n_o + batch * lst[0], dtype=torch.float32, device=dev)  # O partials, then LSE partials
        if explicit_stream and device >= 0:
            buf.record_stream(torch.cuda.ExternalStream(stream, device=dev))
        if kern.needs_objects:
            wp, lp = buf[:n_o], buf[n_o:]
        else:
            wp = buf.data_ptr()
            lp = wp + 4 * n_o   # n_o is a multiple of BLOCK_DV >= 16: the LSE part stays 64-byte aligned
        a, cargs = split_args(args, wp, lp, wst, lst, nhead_q, s)
        kern.launch((gx, heads * s, batch), a, stream)
        ckern = self.combine.kernel(device)
        ckern.launch(((max_seqlen_q + COMBINE_BLOCK_M - 1) // COMBINE_BLOCK_M, nhead_q, batch), cargs, stream)


def check_promise(entry, idx, names, args) -> None:
    """Raise ``dispatch.alignment`` when an argument at ``idx`` (names: ``names``) breaks the 16-divisibility that
    ``entry``'s binary was built to assume."""
    for i in idx:
        if args[i] & 15:
            raise error("dispatch.alignment", f"kernel {entry.name} assumes 16-divisible {names[i]}, got {args[i]}",
                        None, "plan with Dispatcher.plan(problem, aligned=False) for unaligned arguments",
                        cls=UsageError)


# how a caller sizes a paged_attention workspace (the errors' hint)
WORKSPACE_HINT = "fmha_dsl.paged.workspace_numel(q, k_cache, v_cache, batch=..., max_seqlen_q=..., max_seqlen_k=...)"


def workspace_buffer(workspace, numel: int, device, hint: str):
    """A plan's fp32 workspace: the caller's (checked: contiguous float32 on ``device``, at least ``numel`` elements)
    or, when None, one from torch's caching allocator."""
    import torch

    if workspace is None:
        return torch.empty(numel, dtype=torch.float32, device=device)
    check_workspace_kind(workspace, device, hint)
    if workspace.numel() < numel:
        raise error("usage.value", f"workspace must be a contiguous float32 tensor on {device} with at least {numel} "
                    f"elements, got {tuple(workspace.shape)} {workspace.dtype} on {workspace.device}", None,
                    f"size it with {hint}", cls=UsageError)
    return workspace


def check_workspace_kind(workspace, device, hint: str) -> None:
    """A caller's workspace is a contiguous float32 tensor on ``device`` -- checked whether or not the plan a call
    gets uses it (which first use decides), so that a bad one never depends on that choice."""
    import torch

    if not isinstance(workspace, torch.Tensor):
        raise error("usage.type", f"workspace must be a torch tensor (contiguous float32 on {device}), got "
                    f"{type(workspace).__name__}", None, f"size it with {hint}", cls=UsageError)
    if workspace.dtype != torch.float32 or workspace.device != device or not workspace.is_contiguous():
        raise error("usage.value", f"workspace must be a contiguous float32 tensor on {device}, got "
                    f"{tuple(workspace.shape)} {workspace.dtype} on {workspace.device}"
                    + ("" if workspace.is_contiguous() else " (not contiguous)"), None, f"size it with {hint}",
                    cls=UsageError)


def dims(entry, group: bool, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> tuple:
    """``(batch, nhead_q, nhead_k, head_dim_q, head_dim_v, seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k)`` of a
    call's tensors (batch ``[B, H, S, D]``; group ``[T, H, D]`` with the ``cu_seqlens`` and ``max_seqlen_*`` a
    group-mode kernel needs, batch-mode lengths 0)."""
    if group:
        if cu_seqlens_q is None or cu_seqlens_k is None or max_seqlen_q is None or max_seqlen_k is None:
            raise error("usage.value", f"kernel {entry.name} is a group-mode (varlen) kernel: pass "
                        "cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k", None,
                        "cu_seqlens are int32 [B + 1] device tensors; max_seqlen_* are ints", cls=UsageError)
        return (cu_seqlens_q.shape[0] - 1, q.shape[1], k.shape[1], q.shape[2], v.shape[2], 0, 0, int(max_seqlen_q),
                int(max_seqlen_k))
    batch, nhq, sq, dq = q.shape
    return batch, nhq, k.shape[1], dq, v.shape[3], sq, k.shape[2], sq, k.shape[2]


def resolve_stream(stream, device: int) -> tuple[int, bool]:
    """``(raw handle, given by the caller)``: torch's current stream on ``device`` when ``stream`` is None (0 on the
    CPU), else the caller's int handle or torch stream."""
    if stream is None:
        return (current_stream(device) if device >= 0 else 0), False
    return (stream if isinstance(stream, int) else _stream_handle(stream)), True


def _stream_handle(stream) -> int:
    if isinstance(stream, int):
        return stream
    h = getattr(stream, "cuda_stream", None)
    if h is None:
        raise error("usage.value", f"stream must be an int handle or a torch stream, got {type(stream).__name__}",
                    cls=UsageError)
    return int(h)


_RAW_STREAM = []


def current_stream(device: int) -> int:
    """torch's current stream on ``device`` as a raw handle (``torch._C._cuda_getCurrentRawStream``)."""
    if _RAW_STREAM:
        return _RAW_STREAM[0](device)
    import torch

    fn = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fn is None:
        def fn(dev):
            return torch.cuda.current_stream(dev).cuda_stream
    _RAW_STREAM.append(fn)
    return fn(device)
