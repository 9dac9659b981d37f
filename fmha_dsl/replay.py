"""The replay path: a ``paged_attention`` / ``append_kv`` / ``attention_backward`` call like one already launched
replays its launches.

A server calls ``paged_attention`` every step with the same shapes and new contents (tables, lengths, new queries);
a training loop calls the backward every step with the same shapes. "Like" means equal in everything the checks and
the plan depend on -- every tensor's shape, strides, dtype and device, the maxima, the mask, the scalars, the
registry; the addresses may differ. The first such call takes the checked path (:mod:`fmha_dsl.paged`,
:mod:`fmha_dsl.attention_bwd`), which hands its launches to :func:`record`; later calls (:func:`run`) allocate what
the recorded call allocated, patch the new addresses into the recorded arguments and launch. Only calls that
synchronise nothing are recorded (the maxima given, torch tensors throughout, none converted); a call whose
addresses break a 16-byte promise the binary was built with goes the checked path.

Two implementations of the same protocol: the torch extension's ``Replayer`` (``runtime/torch_replay.h``, built
with the torch fast path in the background on first use: keying, allocation and launches in C++), and this module's
Python :class:`Recipe` until that is ready or where it cannot be built (``FMHA_DSL_TORCH_FAST=0``).

A call is a tuple of tensors (or None) in the caller's fixed order plus a hashable tuple of its other arguments.
Each pointer a recorded launch takes is tied to the call's tensor it is the base of (else to the one whose bytes hold
it, at its offset), so views of one buffer (K and V of a combined cache) keep their own places; a call that passes
one tensor in two places (one descale for K and V) is not recorded -- a later call of the same shapes may not alias
them, and the recipe could not tell which of the two each pointer was; such calls take the checked path each time
(distinct tensors, e.g. clones of one descale, keep a server's step on the replay path).
"""

from __future__ import annotations

_RECIPES: dict = {}
_LIMIT = 1024               # recipes kept (a server has a handful of shapes; the cache is cleared when full)
_STATE: dict = {}           # "torch", "tensor": torch.Tensor, "stream": torch._C._cuda_getCurrentRawStream,
#                             "loaded": runtime.torch_fast.loaded, "replayer": the C++ Replayer once it is loaded


def registry_key(registry):
    """What a call's ``registry`` contributes to its scalars: None, a path as given, or the object's identity."""
    return registry if registry is None or isinstance(registry, str) else id(registry)


def key(tensors, scalars):
    """The call's class for the Python replay -- every tensor's shape, strides, dtype, device and whether it starts
    on a 16-byte boundary (a misaligned call gets its own recipe, built without the promise, and never displaces the
    aligned one), and ``scalars`` -- or None when it cannot be replayed (an argument is not a plain torch tensor).  A
    key holding something unhashable (a window given as a list) finds no recipe and records none."""
    T = _STATE.get("tensor")
    if T is None:
        return None
    k = [scalars]
    for x in tensors:
        if x is None:
            k.append(None)
        elif type(x) is T:
            k += (x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() & 15 == 0)
        else:
            return None
    return tuple(k)


class Recipe:
    """What one call launched: per kernel its grid, its arguments, and the slots that hold tensor addresses
    (argument index, tensor index, byte offset); the addresses that must stay 16-byte aligned (tensor index, byte
    offset); and what the call allocated (tensor index, shape, strides, dtype, device, zero-filled first)."""

    __slots__ = ("steps", "checks", "allocs", "device")

    def __init__(self, steps, checks, allocs, device):
        self.steps, self.checks, self.allocs, self.device = steps, checks, allocs, device

    def replay(self, tensors) -> bool:
        """Launch with ``tensors`` (in the recorded call's order, allocations filled in) in place of the recorded
        ones; False (nothing launched) when an address breaks an alignment promise."""
        ptrs = [t.data_ptr() if t is not None else 0 for t in tensors]
        for ti, off in self.checks:
            if (ptrs[ti] + off) & 15:
                return False
        stream = _STATE["stream"](self.device) if self.device >= 0 else 0
        for kern, grid, args, slots in self.steps:
            a = args.copy()
            for i, ti, off in slots:
                a[i] = ptrs[ti] + off
            kern.launch(grid, a, stream)
        return True


def replayer():
    """The extension's ``Replayer`` once the torch fast path's module is loaded (None until then)."""
    r = _STATE.get("replayer")
    if r is None and "loaded" in _STATE:  # (after start())
        mod = _STATE["loaded"]()
        if mod is None or not hasattr(mod, "Replayer"):
            return None
        r = _STATE["replayer"] = mod.Replayer(_STATE["tensor"], _STATE["stream"], _LIMIT)
    return r


def run(tensors: tuple, scalars: tuple):
    """Replay a call like a recorded one: the tensors the recipe allocated (a tuple, in index order) once its
    launches are enqueued, or None (no recipe, or an address breaks a promise: take the checked path)."""
    r = _STATE.get("replayer") or replayer()
    if r is not None:
        made = r.run(tensors, scalars)
        if made is not None:
            return made
    k = key(tensors, scalars)  # a recipe the extension could not take (another launcher), or none yet
    try:
        rec = _RECIPES.get(k) if k is not None else None
    except TypeError:  # an unhashable scalar
        return None
    if rec is None:
        return None
    torch = _STATE["torch"]
    full = list(tensors)
    made = []
    for i, shape, stride, dtype, dev, zero in rec.allocs:
        full[i] = torch.empty_strided(shape, stride, dtype=dtype, device=dev)
        if zero:
            full[i].zero_()
        made.append(full[i])
    if not rec.replay(full):
        return None
    if r is not None:  # recorded before the extension was ready: hand it over
        _native_record(r, tensors, scalars, rec, tuple((a[0], t, a[5]) for a, t in zip(rec.allocs, made)))
    return tuple(made)


def _native_record(r, view, scalars, rec: Recipe, allocated) -> None:
    """Give the extension's Replayer ``rec`` (when every kernel launches natively: ``fast_spec``)."""
    specs = [getattr(kern, "fast_spec", None) for kern, _, _, _ in rec.steps]
    if not all(specs):
        return
    native = tuple((fn, handle, block, shared, kinds, ntail, grid, args, slots)
                   for (fn, handle, block, shared, kinds, ntail), (_, grid, args, slots) in zip(specs, rec.steps))
    r.record(view, scalars, native, rec.checks, allocated, tuple(kern for kern, _, _, _ in rec.steps))


def record(tensors, allocated, scalars, plan, steps, zeroed=frozenset()) -> None:
    """Remember the launches ``steps`` (``[(kernel, grid, args)]``, the plan's own, in order) of a call whose tensors
    were ``tensors`` (the order :func:`run` gets them in, with the ones it allocated filled in at the indices
    ``allocated``; those in ``zeroed`` are zero-filled before the launches, as a workspace that accumulates).  The
    16-byte promises checked per replay are the plan's ``_aligned_idx`` of its step ``promised_step`` (default 0)."""
    if not steps or any(getattr(kern, "needs_objects", True) for kern, _, _ in steps):
        return
    from .kernels.abis import abi_of

    view = tuple(None if i in allocated else t for i, t in enumerate(tensors))
    k = key(view, scalars)
    if k is None:
        return
    ptrs = [t.data_ptr() if t is not None else None for t in tensors]
    live = [p for p in ptrs if p]   # (empty tensors may all have address 0: no launch reads through it)
    if len(set(live)) < len(live):  # one tensor in two places (e.g. one descale for K and V): which argument a
        return                      # launch's pointer came from is ambiguous, and a later call may not alias
    spans = [(p, p + max(t.numel() * t.element_size(), 1)) if t is not None else None for p, t in zip(ptrs, tensors)]
    families = [st.entry.sig["family"] for st in plan.stages]
    dtype = plan.entry.sig["dtype"]
    rec = []
    for (kern, grid, args), fam in zip(steps, families):
        slots = []
        for i, ty in enumerate(abi_of(fam).types(dtype)):
            if not ty.startswith("*") or not args[i]:
                continue
            v = args[i]
            ti = next((j for j, p in enumerate(ptrs) if p == v), None)  # a tensor's own base first: views of one
            if ti is None:                                              # buffer (K and V of a combined cache) overlap
                ti = next((j for j, sp in enumerate(spans) if sp is not None and sp[0] <= v < sp[1]), None)
            if ti is None:  # an address the call's tensors do not hold: not replayable
                return
            slots.append((i, ti, v - spans[ti][0]))
        rec.append((kern, tuple(grid), list(args), tuple(slots)))
    at = getattr(plan, "promised_step", 0)
    names = abi_of(families[at]).names
    promised = {names[i] for i in getattr(plan, "_aligned_idx", ())}
    checks = tuple((ti, off) for i, ti, off in rec[at][3] if names[i] in promised)
    allocs = tuple((i, tuple(tensors[i].shape), tuple(tensors[i].stride()), tensors[i].dtype,
                    tensors[i].device, i in zeroed) for i in sorted(allocated))
    device = next(t for t in tensors if t is not None).get_device()
    if len(_RECIPES) >= _LIMIT:
        _RECIPES.clear()
    recipe = Recipe(rec, checks, allocs, device)
    try:
        _RECIPES[k] = recipe
    except TypeError:  # an unhashable scalar: not replayable
        return
    r = replayer()
    if r is not None:
        _native_record(r, view, scalars, recipe, tuple((i, tensors[i], i in zeroed) for i in sorted(allocated)))


def start():
    """Bind torch once (called by :mod:`fmha_dsl.paged` on its first torch call), and start loading the torch
    fast path's extension in the background (its ``Replayer`` takes over from the Python replay when ready)."""
    if "torch" in _STATE:
        return
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:  # pragma: no cover  (old torch)
        def raw(dev):
            return torch.cuda.current_stream(dev).cuda_stream
    from .runtime import torch_fast

    _STATE.update(torch=torch, tensor=torch.Tensor, stream=raw, loaded=torch_fast.loaded)
    if torch.cuda.is_available():
        torch_fast.start()


__all__ = ["key", "record", "registry_key", "run", "replayer", "start", "Recipe"]
