"""The gathered route of paged attention: a prefill batch's cached K/V copied into contiguous rows, then the forward
family's group-mode kernel over them.

    plan = with_gathered(disp, paged_plan, problem, aligned, device, batch, nhead_q, max_seqlen_q, args, make_timer)
    plan.launch(device, batch, nhead_q, max_seqlen_q, args, workspace=ws)      # args: the paged kernel's (paged_abi)

Why: the paged kernels address K/V row by row through the page table, the forward's read whole tiles (TMA on sm90,
which has no gather); on seed 003's prefill shapes that costs the paged kernels 6-33 % of the forward's speed on the
same K/V made contiguous (docs/benchmarks.md, "Serving").  One copy of the batch's K/V (``fmha_kv_gather``:
:mod:`fmha_dsl.kernels.triton_gather`) costs about twice its bytes over the copy bandwidth -- 1-2 % of a prefill's
attention time -- and a workspace of ``B x max_seqlen_k`` rows (:func:`fmha_dsl.kernels.paged_abi.gather_layout`).

:func:`with_gathered` offers the route to a prefill-sized call (:func:`fmha_dsl.kernels.paged_abi.gather_fits`,
within ``FMHA_DSL_GATHER_MIB``) of a compiling dispatcher: the copy kernel is built, the forward problem's own
first-use selection picks its kernel on the gathered rows, and the two routes are timed on the caller's arguments.
The route runs one forward kernel: where that selection picks a split-KV kernel (a prefill of few programs, whose
splits share the keys in reach) the paged plan runs, untimed against it.
A :class:`GatheredPlan` launches like a :class:`~.plan_paged.PagedPlan` (same arguments, the same ``workspace``
slot, CUDA-graph capturable with a caller's workspace); with a caller's workspace too small for the copy it runs the
paged plan it was measured against.
"""

from __future__ import annotations

from fmha_dsl import knobs
from fmha_dsl.errors import FmhaError
from fmha_dsl.kernels import paged_abi
from fmha_dsl.kernels.fwd_abi import grid_of
from fmha_dsl.kernels.fwd_abi import pack as fwd_pack

from . import autotune, abi, decisions, race
from .plan import WORKSPACE_HINT, Plan, check_promise, workspace_buffer
from .plan_paged import launch_steps

_AT = {n: i for i, (n, _) in enumerate(paged_abi.ARGS)}


def forward_problem(p):
    """The forward problem a paged ``batch_prefill`` problem is over its gathered K/V (group mode, no cache)."""
    return p.model_copy(update={"family": "fwd", "mode": "group", "paged_kv": False, "kv_layout": "vectorized",
                                "kv_lookup": "sglang", "page_size": 1})


def fits(dtype: str, dq: int, dv: int, batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int,
         max_seqlen_k: int) -> bool:
    """Whether a call within these bounds may take the gathered route (``FMHA_DSL_GATHER_MIB`` bounds the copy)."""
    limit = knobs.gather_bytes()
    if dtype not in paged_abi.DTYPES:  # FP8 caches: the forward family has no FP8 kernels to run over the copy
        return False
    return limit > 0 and paged_abi.gather_fits(batch, nhead_q, nhead_k, max_seqlen_q, max_seqlen_k, dq, dv, dtype,
                                               limit)


def _views(buf, lay, dtype: str, objects: bool):
    """The workspace's ``Kout``, ``Vout`` and ``cu_seqlens_k``: tensors (the interpreter) or addresses."""
    if not objects:
        base = buf.data_ptr()
        return base + lay[0], base + lay[1], base + lay[2]
    import torch

    from .interpret import TORCH_NAMES

    raw = buf.view(torch.uint8)
    elem = getattr(torch, TORCH_NAMES[dtype])
    return raw[lay[0]:lay[1]].view(elem), raw[lay[1]:lay[2]].view(elem), raw[lay[2]:lay[3]].view(torch.int32)


def workspace_layout(problem, batch: int, args) -> tuple[int, ...]:
    """:func:`fmha_dsl.kernels.paged_abi.gather_layout` of the paged call ``args`` (of ``problem``'s class)."""
    return paged_abi.gather_layout(batch, args[_AT["nhead_k"]], args[_AT["max_seqlen_k"]], problem.hdim_q,
                                   problem.hdim_v, problem.dtype)


def gather_step(stage, device: int, batch: int, args, buf, lay, dtype: str) -> tuple:
    """``((kernel, grid, arguments), (Kout, Vout, cu_seqlens_k))``: the copy of the paged call ``args`` into the
    workspace ``buf`` laid out as ``lay`` (:func:`workspace_layout`)."""
    a, nhk, msk = args, args[_AT["nhead_k"]], args[_AT["max_seqlen_k"]]
    kern = stage.kernel(device)
    kt, vt, ct = _views(buf, lay, dtype, kern.needs_objects)
    ptrs = [a[_AT[n]] for n in ("K", "V")] + [kt, vt] + [a[_AT[n]] for n in ("seqlens_k", "Table", "kv_indptr")] + [ct]
    gargs = paged_abi.pack_gather(ptrs, [a[_AT[n]] for n in ("stride_kp", "stride_ks", "stride_kh")],
                                  [a[_AT[n]] for n in ("stride_vp", "stride_vs", "stride_vh")], a[_AT["stride_tb"]],
                                  batch, nhk, a[_AT["num_pages"]], a[_AT["table_width"]])
    return (kern, paged_abi.gather_grid(batch, nhk, msk), gargs), (kt, vt, ct)


def forward_args(args, gathered, nhead_q: int, max_seqlen_q: int) -> list:
    """The forward kernel's arguments (:mod:`fmha_dsl.kernels.fwd_abi`) for the paged call ``args`` over the gathered
    ``(Kout, Vout, cu_seqlens_k)``: the same queries, output, LSE, ALiBi, scale, soft-cap, mask and sink."""
    a = args
    nhk, dq, dv, lse = (a[_AT[n]] for n in ("nhead_k", "head_dim_q", "head_dim_v", "Lse"))
    kt, vt, ct = gathered
    ls = None if lse is None or (isinstance(lse, int) and not lse) else (a[_AT["stride_lh"]], a[_AT["stride_lm"]])
    ptrs = [a[_AT["Q"]], kt, vt, a[_AT["Out"]], lse, 0, a[_AT["Alibi"]], a[_AT["cu_seqlens_q"]], ct]
    return fwd_pack(ptrs, True, (a[_AT["stride_qm"]], a[_AT["stride_qh"]], 1), (nhk * dq, dq, 1), (nhk * dv, dv, 1),
                    (a[_AT["stride_om"]], a[_AT["stride_oh"]], 1), ls, None,
                    (a[_AT["stride_ab"]], a[_AT["stride_ah"]]), nhead_q, nhk, dq, dv, 0, 0, max_seqlen_q,
                    a[_AT["max_seqlen_k"]], a[_AT["sm_scale"]], a[_AT["softcap"]], 0.0, 0, 0, a[_AT["window_left"]],
                    a[_AT["window_right"]], a[_AT["mask_bottom_right"]], a[_AT["sink"]])


class GatheredPlan:
    """Runs a ``batch_prefill`` class as ``fmha_kv_gather`` into the workspace, then ``forward``'s kernel (a
    non-split group-mode :class:`~.plan.Plan`); ``fallback``: the paged plan, for a caller's workspace too small."""

    __slots__ = ("api_family", "problem", "entry", "stages", "forward", "fallback", "promised_step", "_aligned_idx",
                 "splits", "_gather", "_limit")

    def __init__(self, problem, gather, forward: Plan, fallback):
        if forward.splits:
            raise ValueError(f"the gathered route runs a forward kernel without split-KV, not {forward.entry.name}")
        self.api_family = "batch_prefill"
        self.problem = problem
        self._gather = gather
        self.forward = forward
        self.fallback = fallback
        self.stages = (gather, forward.stages[0])  # in launch order (the replay path reads their ABIs)
        self.entry = forward.entry
        self.promised_step = 1  # the 16-byte promises a replay checks: the forward kernel's
        self._aligned_idx = forward._aligned_idx
        self.splits = 0
        self._limit = knobs.gather_bytes()  # the copy's budget when the route was chosen (not read per launch)

    @property
    def kernel_id(self) -> str:
        return f"{self._gather.kernel_id}+{self.forward.kernel_id}"

    def __repr__(self) -> str:
        return f"GatheredPlan({self._gather.entry.name}, {self.forward.entry.name})"

    def workspace_numel(self, batch: int, nhead_q: int, nhead_k: int, max_seqlen_q: int, max_seqlen_k: int) -> int:
        """fp32 elements of the workspace a call within these bounds needs (the copy's, or the paged plan's)."""
        p = self.problem
        return max(paged_abi.gather_numel(batch, nhead_k, max_seqlen_k, p.hdim_q, p.hdim_v, p.dtype),
                   self.fallback.workspace_numel(batch, nhead_q, nhead_k, max_seqlen_q, max_seqlen_k))

    def launch(self, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args, stream=None, workspace=None):
        """As :meth:`.plan_paged.PagedPlan.launch`: returns ``([(kernel, grid, arguments)], workspace buffer)``."""
        return launch_steps(self.launches, device, batch, nhead_q, max_seqlen_q, args, stream, workspace)

    def launches(self, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args, workspace=None):
        """``([(kernel, grid, arguments)], workspace buffer | None)``: the copy, then the forward kernel."""
        p, nhk, msk = self.problem, args[_AT["nhead_k"]], args[_AT["max_seqlen_k"]]
        lay = paged_abi.bounded_layout(batch, nhk, msk, p.hdim_q, p.hdim_v, p.dtype, self._limit)
        numel = lay[3] // 4 if lay is not None else 0
        if lay is None or (workspace is not None and workspace.numel() < numel):
            return self.fallback.launches(device, batch, nhead_q, max_seqlen_q, args, workspace)
        fwd = self.forward
        gx, heads, _ = grid_of(fwd.packed, batch, nhead_q, nhk, max_seqlen_q, fwd.block_m)
        if not (gx and heads and batch):
            return [], None
        import torch

        buf = workspace_buffer(workspace, numel, torch.device(f"cuda:{device}" if device >= 0 else "cpu"),
                               WORKSPACE_HINT)
        step, gathered = gather_step(self._gather, device, batch, args, buf, lay, p.dtype)
        fargs = forward_args(args, gathered, nhead_q, max_seqlen_q)
        fk = fwd.stages[0].kernel(device)
        if self._aligned_idx and not fk.needs_objects:
            check_promise(fwd.entry, self._aligned_idx, abi.FWD_NAMES, fargs)
        return [step, (fk, (gx, heads, batch), fargs)], buf


def with_gathered(disp, plan, problem, aligned: bool, device: int, batch: int, nhead_q: int, max_seqlen_q: int, args,
                  make_timer):
    """``plan`` (a paged plan chosen for the call ``args``), or a :class:`GatheredPlan` when the gathered route is
    offered (see the module docstring) and times faster on these arguments.  ``make_timer(launch)``: a first-use
    ``measure`` running ``launch(plan)`` (:func:`fmha_dsl.api_dispatch.timer`), None where nothing is timed.

    The decision is recorded with the dispatcher's first-use decisions (key :func:`route_key`, persisted in the cache
    like them) when both routes were timed, and reused while it still names the two plans' kernels -- the paged
    plan's and the forward problem's current decision -- under the same candidate space (:func:`recorded_route`): a
    later process takes the recorded route without timing it again.  Where nothing is timed (a CUDA graph being
    captured, ``FMHA_DSL_AUTOTUNE=0``) the paged plan runs."""
    nhk, msk = args[_AT["nhead_k"]], args[_AT["max_seqlen_k"]]
    if (disp.builder is None or not aligned or not autotune.enabled() or device < 0
            or not fits(problem.dtype, problem.hdim_q, problem.hdim_v, batch, nhead_q, nhk, max_seqlen_q, msk)):
        return plan
    rk = route_key(problem, aligned)
    space = disp.builder.fingerprint(problem.family)
    rec = disp.tuned.get(rk) if disp.tuned is not None else None
    fproblem = forward_problem(problem)
    if recorded_route(rec, space, plan.entry.name, disp.decided_kernel(fproblem, aligned)) == "paged":
        return plan
    measure = make_timer(lambda p: p.launch(device, batch, nhead_q, max_seqlen_q, args))
    if measure is None:
        return plan
    entry, binary = disp.builder.gather(problem, disp.arch, cache_only=knobs.no_build())
    if entry is None:
        return plan
    import torch

    stage = disp.loose_stage(entry, binary)
    # the forward kernels are chosen on the gathered rows of this call: one copy into a workspace kept for the timing
    lay = workspace_layout(problem, batch, args)
    buf = workspace_buffer(None, lay[3] // 4, torch.device(f"cuda:{device}"), WORKSPACE_HINT)
    (kern, grid, gargs), gathered = gather_step(stage, device, batch, args, buf, lay, problem.dtype)
    kern.launch(grid, gargs, torch.cuda.current_stream(device).cuda_stream)
    fargs = forward_args(args, gathered, nhead_q, max_seqlen_q)
    try:
        fwd = disp.plan(fproblem, aligned, make_timer(lambda p: p.launch(device, batch, nhead_q, max_seqlen_q, fargs)))
    except FmhaError:  # no forward kernel for it: the paged route stays
        return plan
    if fwd.splits:  # (a GatheredPlan launches its forward kernel once, without split-KV's workspace and combine)
        return plan
    gplan = GatheredPlan(problem, stage, fwd, plan)
    if recorded_route(rec, space, plan.entry.name, fwd.entry.name) == "gathered":
        return gplan
    win, med = race.fastest(measure, {"paged": plan, "gathered": gplan})
    names = {"paged": f"paged {plan.entry.name}", "gathered": f"gathered {fwd.entry.name}"}
    disp.measured[rk] = {names[k]: t for k, t in med.items()}
    if len(med) == 2 and disp.tuned is not None:  # both timed (a route that failed -- out of memory -- is not a loss)
        rec = decisions.record_of(gplan.entry if win == "gathered" else plan.entry, med, names)
        rec.update(route=win, paged=plan.entry.name, forward=fwd.entry.name, space=space)
        disp.record_decision(rk, rec)
    return gplan if win == "gathered" else plan


def recorded_route(rec, space: str, paged: str, forward: str | None) -> str | None:
    """The route (``"paged"`` or ``"gathered"``) a recorded decision ``rec`` still gives: one measured under the
    candidate space ``space`` between the paged kernel ``paged`` and the forward kernel ``forward`` (the forward
    problem's current decision; None when there is none yet); else None, and the routes are timed again."""
    if not isinstance(rec, dict) or rec.get("route") not in ("paged", "gathered") or forward is None:
        return None
    if (rec.get("space"), rec.get("paged"), rec.get("forward")) != (space, paged, forward):
        return None
    return rec["route"]


def route_key(problem, aligned: bool) -> str:
    """The decision key of the route (paged or gathered) of a ``batch_prefill`` problem class: its first-use key
    (:func:`fmha_dsl.runtime.decisions.key`) + ``"|route"``."""
    return decisions.key(problem, aligned) + "|route"


__all__ = ["GatheredPlan", "with_gathered", "route_key", "recorded_route", "forward_problem", "fits",
           "workspace_layout", "gather_step", "forward_args"]
