"""The serving fast path: a ``paged_attention`` / ``append_kv`` call like one already launched replays its launches.

A server calls ``paged_attention`` every step with the same shapes and new contents (tables, lengths, new queries).
"Like" means equal in everything the checks and the plan depend on -- every tensor's shape, strides, dtype and
device, the maxima, the mask, the scalars, the registry -- which :func:`key` collects; the addresses may differ.
The first such call takes the checked path (:mod:`fmha_dsl.paged`), which hands its launches to :func:`record`;
later calls patch the new addresses into copies of the recorded arguments and launch (a few microseconds of host
time instead of the checked path's tens).  Only calls that synchronise nothing are recorded (the maxima given, torch
tensors throughout, none converted); a call whose addresses break a 16-byte promise the binary was built
with goes the checked path.
"""

from __future__ import annotations

_RECIPES: dict = {}
F32 = None                  # torch.float32 once torch is bound (start())
_LIMIT = 1024               # recipes kept (a server has a handful of shapes; the cache is cleared when full)
_STATE: dict = {}           # "torch", "tensor": torch.Tensor, "stream": torch._C._cuda_getCurrentRawStream


def key(required, optional, scalars):
    """The call's class for replay -- every tensor's shape, strides, dtype and device (``required``: must be plain
    torch tensors; ``optional``: tensors or None) and the other arguments (``scalars``) -- or None when it cannot be
    replayed (an argument is not a plain torch tensor)."""
    T = _STATE.get("tensor")
    if T is None:
        return None
    try:
        k = [(x.shape, x.stride(), x.dtype, x.get_device()) for x in required if type(x) is T]
        if len(k) != len(required):
            return None
        for x in optional:
            if x is None:
                k.append(None)
            elif type(x) is T:
                k.append((x.shape, x.stride(), x.dtype, x.get_device()))
            else:
                return None
        k.append(scalars)
        k = tuple(k)
        hash(k)
    except TypeError:  # e.g. a window given as a list
        return None
    return k


class Recipe:
    """What one call launched: per kernel its grid, its arguments, and the slots that hold tensor addresses
    (argument index, tensor index, byte offset); plus what the call allocated (``shapes``: its output's and LSE's,
    ``ws_numel``: a split-KV workspace)."""

    __slots__ = ("steps", "checks", "shapes", "ws_numel", "device")

    def __init__(self, steps, checks, shapes, ws_numel, device):
        self.steps, self.checks, self.shapes, self.ws_numel, self.device = steps, checks, shapes, ws_numel, device

    def replay(self, tensors) -> bool:
        """Launch with ``tensors`` (in the recorded call's order) in place of the recorded ones; False (nothing
        launched) when an address breaks an alignment promise: the caller then takes the checked path."""
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


def record(k, plan, steps, tensors, shapes=(), ws_numel: int = 0) -> None:
    """Remember the launches ``steps`` (``[(kernel, grid, args)]``, the plan's own, in order) of the call of class
    ``k`` whose tensors were ``tensors`` (the order :meth:`Recipe.replay` gets them in)."""
    if k is None or not steps or any(getattr(kern, "needs_objects", True) for kern, _, _ in steps):
        return
    from .kernels.abis import abi_of

    spans = [(t.data_ptr(), t.data_ptr() + max(t.numel() * t.element_size(), 1)) if t is not None else None
             for t in tensors]
    families = [st.entry.sig["family"] for st in plan.stages]
    dtype = plan.entry.sig["dtype"]
    rec = []
    for (kern, grid, args), fam in zip(steps, families):
        slots = []
        for i, ty in enumerate(abi_of(fam).types(dtype)):
            if not ty.startswith("*") or not args[i]:
                continue
            v = args[i]
            ti = next((j for j, sp in enumerate(spans) if sp is not None and sp[0] <= v < sp[1]), None)
            if ti is None:  # an address the call's tensors do not hold: not replayable
                return
            slots.append((i, ti, v - spans[ti][0]))
        rec.append((kern, tuple(grid), list(args), tuple(slots)))
    names = abi_of(families[0]).names
    promised = {names[i] for i in getattr(plan, "_aligned_idx", ())}
    checks = [(ti, off) for i, ti, off in rec[0][3] if names[i] in promised]
    if len(_RECIPES) >= _LIMIT:
        _RECIPES.clear()
    _RECIPES[k] = Recipe(rec, checks, shapes, ws_numel, next(t for t in tensors if t is not None).get_device())


def start():
    """Bind torch once (called by :mod:`fmha_dsl.paged` on its first torch call)."""
    if "torch" in _STATE:
        return
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:  # pragma: no cover  (old torch)
        def raw(dev):
            return torch.cuda.current_stream(dev).cuda_stream
    global F32
    F32 = torch.float32
    _STATE.update(torch=torch, tensor=torch.Tensor, stream=raw)


def get(k):
    return _RECIPES.get(k) if k is not None else None


__all__ = ["key", "record", "get", "start", "Recipe"]
