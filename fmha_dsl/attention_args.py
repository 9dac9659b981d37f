"""The argument checks of :func:`fmha_dsl.attention` on torch tensors: every bad input is a
:class:`~fmha_dsl.errors.UsageError` naming the argument, what was expected and a hint.  Cold code: these run to
raise, or for uncommon arguments (group mode's lengths, a bias); the hot path in :mod:`fmha_dsl.attention` calls
them only then.  Importing this module does no work (torch is looked up when a check runs).
"""

from __future__ import annotations

import contextvars
import sys

from .errors import UsageError, error
from .numeric import dropout_problem, is_int, scale_problem, shown, softcap_problem, window_side


def _torch():
    return sys.modules["torch"]  # imported by attention() before any check runs


# torch dtype -> the kernel key's dtype name: the one map of the torch entry points (attention, attention_backward,
# paged_attention), filled on their first torch call by torch_dtype_names()
TORCH_DTYPES: dict = {}


def torch_dtype_names() -> dict:
    """:data:`TORCH_DTYPES`, filled once (torch is imported by then)."""
    if not TORCH_DTYPES:
        torch = _torch()
        TORCH_DTYPES.update({torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"})
    return TORCH_DTYPES


# which public function is checking its arguments (errors name it): attention() or attention_backward()
CALLER = contextvars.ContextVar("fmha_dsl_caller", default="attention()")


def _usage(rule: str, msg: str, hint: str | None = None) -> UsageError:
    return error(rule, f"{CALLER.get()}: {msg}", None, hint, cls=UsageError)


def check_one_bias(bias, alibi) -> None:
    """The kernels take an elementwise bias or ALiBi slopes, not both (NumPy calls follow them: what runs on
    arrays runs on the GPU)."""
    if bias is not None and alibi is not None:
        raise _usage("usage.value", "bias and alibi_slopes cannot be combined in one kernel",
                     "fold the ALiBi term into the bias tensor")


def check_numpy_call(q, arrays: dict, tensors: dict, registry=None, same_dtype=(), workspace=None,
                     like: str = "q") -> None:
    """A call on NumPy arrays (the reference) takes what the torch path takes, of one kind: ``arrays`` (name ->
    value) must be numpy arrays (``bias`` and ``alibi_slopes`` may be None: not given), those named in
    ``same_dtype`` of q's dtype; ``tensors`` (index arguments, which may also be lists) must not be torch tensors;
    and no ``registry`` (it picks GPU kernels) nor ``workspace`` (their scratch).  ``like``: the name of ``q``, the
    array the call's kind was read from."""
    import numpy as np

    if same_dtype and q.dtype.type not in (np.float16, np.float32, np.float64):   # before "k must have q's dtype"
        raise _usage("usage.dtype", f"`{like}` must be float16, float32 or float64, got dtype {q.dtype}",
                     f"convert it, e.g. {like}.astype(np.float32) (bf16 data goes in as float32)")
    for name, x in arrays.items():
        if not isinstance(x, np.ndarray) and (x is not None or name not in ("bias", "alibi_slopes")):
            what = "a numpy array or a torch tensor" if name == like else f"a numpy array like {like}"
            raise _usage("usage.type", f"`{name}` must be {what}, got {type(x).__name__}",
                         "pass the arrays of one kind: numpy runs the reference, torch GPU tensors the kernels")
        if name in same_dtype and x is not None and x.dtype != q.dtype:
            raise _usage("usage.dtype", f"`{name}` must have {like}'s dtype {q.dtype}, got {x.dtype}",
                         f"pass {name}.astype(q.dtype)")
    for name, x in tensors.items():
        if (type(x).__module__ or "").startswith("torch"):
            raise _usage("usage.type", f"`{name}` is a torch tensor but {like} is a numpy array",
                         "pass the arrays of one kind: numpy runs the reference, torch GPU tensors the kernels")
    for name, x, what in (("registry", registry, "picks GPU kernels"),
                          ("workspace", workspace, "is the kernels' scratch")):
        if x is not None:
            raise _usage("usage.value", f"`{name}` {what}, but numpy arrays run the reference",
                         f"drop {name}=, or pass torch tensors on the GPU")


def accumulation(q):
    """The reference's accumulation dtype for NumPy inputs like ``q``: float32, as the kernels accumulate, or float64
    for float64 arrays (which no kernel takes: their results carry float64's precision)."""
    import numpy as np

    return np.float64 if q.dtype == np.float64 else np.float32


def named(exc: UsageError) -> UsageError:
    """A reference's :class:`~fmha_dsl.errors.UsageError` (which names no API function) again, naming the function
    being called (:data:`CALLER`)."""
    d = exc.diagnostics[0]
    return _usage(d.rule, d.message, d.hint)


def as_bool(x):
    """A NumPy bool scalar as Python's (a flag given as ``np.bool_`` means what True or False means); else ``x``."""
    t = type(x)
    return bool(x) if t.__module__ == "numpy" and t.__name__ in ("bool", "bool_") else x


def flag(name: str, x, caller: str | None = None) -> bool:
    """A flag argument (``return_lse``, ``deterministic``): True or False (NumPy's bool too); anything else is an
    error, not a value read as true or false (``return_lse="no"`` returned the LSE).  ``caller``: the function to
    name when :data:`CALLER` is not set to it."""
    x = as_bool(x)
    if x is not True and x is not False:
        raise error("usage.value", f"{caller or CALLER.get()}: `{name}` must be True or False, got {shown(x)}", None,
                    "a flag takes a bool", cls=UsageError)
    return x


_TRUE_MEANS = {"top_left": "True means top-left (torch's is_causal); 'bottom_right' aligns the last rows",
               "bottom_right": "True means bottom-right here (a sequence's queries are its last tokens); 'top_left' "
                               "aligns the first query with the first key"}


def causal_mode(causal, true_means: str = "top_left", caller: str | None = None) -> str | None:
    """A ``causal`` argument as the mask's corner: None (no mask), ``"top_left"`` or ``"bottom_right"``; ``True`` is
    ``true_means`` (top-left in attention(), as torch's is_causal; bottom-right in paged_attention(), whose queries
    are each sequence's last tokens, as in FlashAttention-2's varlen and FlashInfer), NumPy's bool a bool.
    ``caller``: the function to name when :data:`CALLER` is not set to it."""
    if causal is not True and causal is not False and causal is not None:
        causal = as_bool(causal)
    if causal is False or causal is None:
        return None
    if causal is True:
        return true_means
    if isinstance(causal, str) and causal in ("top_left", "bottom_right"):
        return causal
    from .errors import did_you_mean

    hint = did_you_mean(causal, ["top_left", "bottom_right"]) if isinstance(causal, str) else None
    raise error("usage.value", f"{caller or CALLER.get()}: causal must be False, True, 'top_left' or 'bottom_right', "
                f"got {shown(causal)}", None, hint or _TRUE_MEANS[true_means], cls=UsageError)


def _mask(causal, window):
    """(mask name, window_left, window_right, bottom_right) per docs/semantics.md."""
    mode = causal_mode(causal)
    if window is None:
        if mode is None:
            return "no", -1, -1, 1
        return mode, -1, 0, int(mode == "bottom_right")
    try:
        left, right = window
    except (TypeError, ValueError):
        left = right = None
    if not (is_int(left) and is_int(right)):
        raise _usage("usage.value", f"window must be a pair (left, right) of ints, got {window!r}",
                     "negative means unbounded, e.g. window=(128, 0) for a 128-token causal window")
    left, right = window_side(left), window_side(right)
    if mode is None:
        if left < 0 and right < 0:
            return "no", -1, -1, 1
        return "generic", left, right, 1
    return mode, left, 0, int(mode == "bottom_right")


def _bad_types(k, v):
    for name, x in (("k", k), ("v", v)):
        if not isinstance(x, _torch().Tensor):
            raise _usage("usage.type", f"`{name}` must be a torch tensor like q, got {type(x).__name__}",
                         "pass q, k and v of one kind")


def _bad_dtypes(q, k, v):
    dt = q.dtype
    torch = _torch()
    if dt not in (torch.float16, torch.bfloat16, torch.float32):
        raise _usage("usage.dtype", f"`q` must be float16, bfloat16 or float32, got {dt}", "convert with q.half()")
    name, x = ("k", k) if k.dtype is not dt else ("v", v)
    raise _usage("usage.dtype", f"`{name}` must have q's dtype {dt}, got {x.dtype}", f"pass {name}.to(q.dtype)")


def _bad_rank(qsh, ksh, vsh, group):
    nd = 3 if group else 4
    name, sh = next((n, s) for n, s in (("q", qsh), ("k", ksh), ("v", vsh)) if len(s) != nd)
    layout = "[T, H, D] (group mode, with cu_seqlens)" if group else "[B, H, S, D] (batch mode)"
    raise _usage("usage.shape", f"`{name}` must be {nd}-D {layout}, got shape {tuple(sh)}",
                 "BSHD tensors go in as x.transpose(1, 2); varlen needs cu_seqlens_q/k and 3-D tensors")


def _check_heads(hq, hk, dq, dk, dv, ksh):
    if dk != dq:
        raise _usage("usage.shape", f"`k` must have q's head dim Dq={dq}, got {dk} (shape {tuple(ksh)})",
                     "q and k share the head dim (v's may differ)")
    if hk < 1 or hq % hk:
        raise _usage("usage.shape", f"query heads must be a multiple of key heads (GQA/MQA), got Hq={hq}, Hk={hk}",
                     "each key head serves Hq // Hk query heads")
    if dq < 1 or dv < 1:
        raise _usage("usage.shape", f"head dims must be >= 1, got Dq={dq}, Dv={dv}",
                     "the last dim of q, k and v is the head dim")


def _bad_batch_shapes(qsh, ksh, vsh):
    b, hq, _, dq = qsh
    bk, hk, sk, dk = ksh
    bv, hv, sv, dv = vsh
    if bk != b or bv != b:
        name, sh = ("k", ksh) if bk != b else ("v", vsh)
        raise _usage("usage.shape", f"`{name}` must have q's batch {b}, got shape {tuple(sh)}",
                     "q, k and v are [B, H, S, D]; pass BSHD tensors as x.transpose(1, 2)")
    if (hv, sv) != (hk, sk):
        raise _usage("usage.shape", f"`v` must be [B, Hk={hk}, Sk={sk}, Dv] like k, got {tuple(vsh)}",
                     "k and v need the same heads and sequence length")
    _check_heads(hq, hk, dq, dk, dv, ksh)


def _batch_shapes(qsh, ksh, vsh) -> tuple:
    """``(b, hq, sq, dq, hk, sk, dv)`` of batch-mode ``[B, H, S, D]`` shapes, or a located error."""
    if len(qsh) != 4 or len(ksh) != 4 or len(vsh) != 4:
        _bad_rank(qsh, ksh, vsh, False)
    b, hq, sq, dq = qsh
    bk, hk, sk, dk = ksh
    bv, hv, sv, dv = vsh
    if bk != b or bv != b or hv != hk or sv != sk or dk != dq or hk < 1 or hq % hk or dq < 1 or dv < 1:
        _bad_batch_shapes(qsh, ksh, vsh)
    return b, hq, sq, dq, hk, sk, dv


def _group_shapes(qsh, ksh, vsh, cu_q, cu_k):
    if cu_q is None or cu_k is None:
        raise _usage("usage.shape", "group mode needs both cu_seqlens_q and cu_seqlens_k, got only "
                     + ("cu_seqlens_q" if cu_k is None else "cu_seqlens_k"),
                     "pass both (int32, B + 1 offsets), or 4-D tensors for batch mode")
    if len(qsh) != 3 or len(ksh) != 3 or len(vsh) != 3:
        _bad_rank(qsh, ksh, vsh, True)
    tq, hq, dq = qsh
    tk, hk, dk = ksh
    tv, hv, dv = vsh
    if (tv, hv) != (tk, hk):
        raise _usage("usage.shape", f"`v` must be [Tk={tk}, Hk={hk}, Dv] like k, got {tuple(vsh)}",
                     "v holds the same tokens and heads as k")
    _check_heads(hq, hk, dq, dk, dv, ksh)
    return tq, hq, dq, tk, hk, dv


def _check_devices(q, k, v, registry):
    dev = q.get_device()
    from .runtime.dispatch import Dispatcher

    if dev < 0 and not (isinstance(registry, Dispatcher) and registry.launcher == "interpret"):
        raise _usage("usage.device", f"`q` is on {q.device}; torch tensors run on a GPU",
                     "move the tensors with .cuda(), or pass numpy arrays to run the reference")
    if k.get_device() != dev or v.get_device() != dev:
        name, x = ("k", k) if k.get_device() != dev else ("v", v)
        raise _usage("usage.device", f"`{name}` is on {x.device} but q is on {q.device}",
                     f"move it with {name}.to(q.device)")


def _bad_strides(q, k):
    name, x = ("q", q) if q.stride(-1) != 1 else ("k", k)
    raise _usage("usage.stride", f"`{name}`'s last dim (head dim) must have stride 1, got strides {x.stride()}",
                 f"pass {name}.contiguous(); the other dims may be strided (e.g. BSHD via transpose)")


def check_dropout_p(p) -> None:
    why = dropout_problem(p)
    if why:
        raise _usage("usage.value", why, "0 disables dropout")


def _check_dropout(p, seed, offset):
    check_dropout_p(p)
    if not p:
        return seed
    if seed is None:
        torch = _torch()
        seed = int(torch.randint(0, (1 << 63) - 1, (), dtype=torch.int64).item())
    elif not is_int(seed) or not -(1 << 63) <= seed < (1 << 64):
        raise _usage("usage.value", f"seed must be an int in [-2**63, 2**64), got {seed!r}",
                     "None draws one from torch's generator")
    if not is_int(offset) or not 0 <= offset < (1 << 63):
        raise _usage("usage.value", f"offset must be an int in [0, 2**63), got {offset!r}",
                     "the Philox counter's base: advance it by the elements a previous call drew")
    seed = int(seed) & ((1 << 64) - 1)
    return seed - (1 << 64) if seed >= 1 << 63 else seed  # the kernel reads an i64: pass uint64 as its twin


def _check_softcap(softcap):
    why = softcap_problem(softcap)
    if why:
        raise _usage("usage.value", why, "typical soft-caps are 30 or 50 (Gemma 2, Grok); None turns it off")


def _check_scale(scale):
    why = scale_problem(scale)
    if why:
        raise _usage("usage.value", why, "None means 1/sqrt(Dq)")


def _check_sink(sink) -> int:
    """``sink`` as a Python int (a NumPy integer too), checked."""
    if not is_int(sink) or sink < 0:
        raise _usage("usage.value", f"sink must be an int >= 0, got {sink!r}", "0 or None disables sink tokens")
    return int(sink)


def _check_bias(bias, alibi, q, b, hq, sq, sk, group, dev):
    torch = _torch()
    T = torch.Tensor
    dt = q.dtype
    check_one_bias(bias, alibi)
    if bias is not None:
        if not isinstance(bias, T):
            raise _usage("usage.type", f"`bias` must be a torch tensor, got {type(bias).__name__}",
                         "pass a tensor of q's dtype on q's device, [B|1, Hq|1, Sq, Sk]")
        bsh = bias.shape
        if len(bsh) != 4 or bsh[0] not in (1, b) or bsh[1] not in (1, hq) or bsh[2] != sq or bsh[3] != sk:
            what = "[B|1, Hq|1, Sq_max, Sk_max]" if group else "[B|1, Hq|1, Sq, Sk]"
            raise _usage("usage.shape", f"`bias` must be {what} = [{b}|1, {hq}|1, {sq}, {sk}], got {tuple(bsh)}",
                         "size-1 batch/head dims broadcast (or use bias.expand)")
        if bias.dtype is not dt:
            raise _usage("usage.dtype", f"`bias` must have q's dtype {dt}, got {bias.dtype}", "pass bias.to(q.dtype)")
        if bias.get_device() != dev:
            raise _usage("usage.device", f"`bias` is on {bias.device} but q is on {q.device}",
                         "move it with bias.to(q.device)")
        if bias.stride(3) != 1 and sk > 1:
            raise _usage("usage.stride", f"`bias`'s last dim must have stride 1, got strides {bias.stride()}",
                         "pass bias.contiguous()")
        from .runtime.plan import bias_strides

        return "bias", bias_strides(bias), None
    if not isinstance(alibi, T):
        raise _usage("usage.type", f"`alibi_slopes` must be a torch tensor, got {type(alibi).__name__}",
                     "pass a float32 tensor on q's device, [Hq] or [B, Hq]")
    if tuple(alibi.shape) not in ((hq,), (b, hq)):
        raise _usage("usage.shape", f"`alibi_slopes` must be [Hq] = [{hq}] or [B, Hq] = [{b}, {hq}], got "
                     f"{tuple(alibi.shape)}", "one slope per query head (per sequence and head for [B, Hq])")
    if alibi.dtype != torch.float32:
        raise _usage("usage.dtype", f"`alibi_slopes` must be float32, got {alibi.dtype}", "pass alibi_slopes.float()")
    if alibi.get_device() != dev:
        raise _usage("usage.device", f"`alibi_slopes` is on {alibi.device} but q is on {q.device}",
                     "move it with alibi_slopes.to(q.device)")
    from .runtime.plan import alibi_strides

    return "alibi", None, alibi_strides(alibi)
