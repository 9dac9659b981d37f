"""[api] The index arguments of a group-mode (varlen) or paged call: ``cu_seqlens``, lengths and page ids as int32
(a wider value checked to fit, never wrapped), their values read back only when the call has no ``max_seqlen_*``
(one device-to-host copy then; with them, nothing here synchronises), and the ``max_seqlen_*`` themselves.  Shared by
:mod:`fmha_dsl.attention_args` (attention, attention_backward) and :mod:`fmha_dsl.paged_args`; errors name the
function being called (:data:`fmha_dsl.attention_args.CALLER`)."""

from __future__ import annotations

from .attention_args import _torch, _usage
from .numeric import MAX_LEN_HINT, max_len_problem

__all__ = ["INT32_RANGE", "int32_of", "group_lengths", "max_len", "check_max_lengths", "cu_seqlens_of",
           "check_cu_host"]


INT32_RANGE = (-(1 << 31), (1 << 31) - 1)


def int32_of(name: str, x, what: str, sync_ok: bool = True):
    """``x`` (a NumPy array of integers, or a torch integer tensor) as int32 -- after checking that every value
    fits: a cast would wrap ``2**32 + 3`` to 3, a page id or length that the checks after it would take for a good
    one.  A wider tensor on a GPU is checked there (one device-to-host read of a flag) only when the call reads device
    values back anyway (``sync_ok``: no ``max_seqlen_*`` given) and no CUDA graph is being captured; a call that
    promises no synchronisation takes its values as int32 (pass int32 tables and offsets: nothing is cast then)."""
    lo, hi = INT32_RANGE
    if not hasattr(x, "get_device"):
        import numpy as np

        if x.size and (x.min() < lo or x.max() > hi):
            at = int(np.argmax((x < lo) | (x > hi)))
            raise _usage("usage.value", f"`{name}` holds {int(x.reshape(-1)[at])} (flat index {at}), outside int32",
                         what)
        return x.astype(np.int32)
    torch = _torch()
    if x.dtype == torch.int32:
        return x
    if x.numel() and x.dtype in (torch.int64, torch.uint64, torch.uint32) and (
            x.get_device() < 0 or sync_ok and not torch.cuda.is_current_stream_capturing()):
        bad = (x < lo) | (x > hi)
        if bool(bad.any()):
            at = int(bad.reshape(-1).nonzero()[0, 0])
            raise _usage("usage.value", f"`{name}` holds {int(x.reshape(-1)[at])} (flat index {at}), outside int32",
                         what)
    return x.to(torch.int32)


def cu_seqlens_of(name, cu, total, dev, torch, sync_ok: bool = True):
    """cu_seqlens as an int32 tensor on q's device, and its values when they are on the host (else None)."""
    host = None
    if not isinstance(cu, torch.Tensor):
        import numpy as np

        a = np.asarray(cu)
        if a.dtype.kind not in "iu":
            raise _usage("usage.dtype", f"`{name}` must hold integers, got dtype {a.dtype}", "int32, B + 1 entries")
        cu = torch.from_numpy(int32_of(name, a, "int32, B + 1 entries"))
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise _usage("usage.shape", f"`{name}` must be 1-D with B + 1 >= 1 entries, got shape {tuple(cu.shape)}",
                     "cu_seqlens[b] is the first row of sequence b; the last entry is the total length")
    if cu.dtype not in (torch.int32, torch.int64):
        raise _usage("usage.dtype", f"`{name}` must be int32, got {cu.dtype}", f"pass {name}.to(torch.int32)")
    where = cu.get_device()
    if where < 0:
        host = cu.tolist()
    elif where != dev:
        raise _usage("usage.device", f"`{name}` is on cuda:{where} but q is on {'cpu' if dev < 0 else f'cuda:{dev}'}",
                     f"move it with {name}.to(q.device)")
    if where != dev:
        cu = cu.to(device=f"cuda:{dev}", dtype=torch.int32)
    elif cu.dtype != torch.int32:
        cu = int32_of(name, cu, "int32, B + 1 entries", sync_ok)
    return cu, host


def check_cu_host(name, vals, total):
    if vals[0] != 0:
        raise _usage("usage.value", f"`{name}` must start at 0, got {vals[0]}", "cu_seqlens[0] is always 0")
    for i in range(len(vals) - 1):
        if vals[i + 1] < vals[i]:
            raise _usage("usage.value", f"`{name}` must be non-decreasing, got {vals[i]} then {vals[i + 1]} at index "
                         f"{i}", "sequence b owns rows cu_seqlens[b] : cu_seqlens[b + 1]")
    if vals[-1] != total:
        raise _usage("usage.value", f"`{name}` must end at the total length {total}, got {vals[-1]}",
                     "the last entry is the number of rows of the 3-D tensor")
    return max((vals[i + 1] - vals[i] for i in range(len(vals) - 1)), default=0)


# ---- validation helpers (cold: they run only to raise, or on uncommon arguments) -----------------------

def group_lengths(cu_q, cu_k, tq, tk, dev, max_q, max_k):
    torch = _torch()
    reads = max_q is None or max_k is None   # (the call reads device values back: a wide one is checked too)
    cu_q, host_q = cu_seqlens_of("cu_seqlens_q", cu_q, tq, dev, torch, reads)
    cu_k, host_k = cu_seqlens_of("cu_seqlens_k", cu_k, tk, dev, torch, reads)
    if cu_q.shape[0] != cu_k.shape[0]:
        raise _usage("usage.shape", f"cu_seqlens_q and cu_seqlens_k must have the same length B + 1, got "
                     f"{cu_q.shape[0]} and {cu_k.shape[0]}",
                     "both list B + 1 offsets, one sequence per pair of entries")
    maxes = []
    for name, given, vals, cu, total in (("max_seqlen_q", max_q, host_q, cu_q, tq),
                                         ("max_seqlen_k", max_k, host_k, cu_k, tk)):
        if vals is None and given is None:
            vals = cu.tolist()  # one device-to-host copy; pass max_seqlen_q/k to avoid it
        longest = None if vals is None else [check_cu_host("cu_seqlens_" + name[-1], vals, total)]
        maxes.append(max_len(name, given, longest, MAX_LEN_HINT))
    return cu_q, cu_k, cu_q.shape[0] - 1, maxes[0], maxes[1]


def max_len(name: str, given, host, what: str) -> int:
    """``max_seqlen_*``: the caller's (an int >= 0, checked against host values when there are some) or the
    host values' maximum."""
    m = None if host is None else int(max(host, default=0))
    why = None if given is None else max_len_problem(name, given, m)
    if why:
        raise _usage("usage.value", why, what)
    return int(m if given is None else given)


def check_max_lengths(max_q, max_k, lens_q, lens_k) -> None:
    """``max_seqlen_q``/``max_seqlen_k``, each (when given) an int >= 0 and at least the longest of ``lens_q`` /
    ``lens_k`` (batch mode: ``[S]``; group mode: the ``cu_seqlens`` differences)."""
    for name, given, lens in (("max_seqlen_q", max_q, lens_q), ("max_seqlen_k", max_k, lens_k)):
        if given is not None:
            max_len(name, given, lens, MAX_LEN_HINT)
