"""NumPy reference of the attention forward pass (CPU; truth for every test, and the no-GPU backend).

It computes exactly what ``docs/semantics.md`` defines::

    out, lse = attention_fwd(q, k, v, causal="bottom_right", dropout_p=0.1, seed=7)

No torch and no triton here.  Dropout is bit-exact with Triton's ``tl.rand(seed, offsets)``:
:func:`philox_uniform` is Philox4x32-10 (Random123) with the counter ``(offset_lo, offset_hi, 0, 0)``
and the key ``(seed_lo, seed_hi)``, followed by Triton's uint32 -> float conversion.

Arguments of :func:`attention_fwd`
    ``q, k, v``      batch mode ``[B, H, S, D]``; group mode (``cu_seqlens_q/k`` given) ``[T, H, D]``.
    ``causal``       ``None``/``False`` (no mask), ``True`` or ``"top_left"``, ``"bottom_right"``.
    ``window``       ``(left, right)``, negative = unbounded; bottom-right aligned unless ``causal`` is
                     ``True``/``"top_left"``.  With ``causal`` set, the window's ``right`` becomes 0.
    ``bias``         elementwise, ``[B|1, Hq|1, Sq, Sk]`` (group mode: ``Sq_max``, ``Sk_max`` -- ``max_seqlen_q/k``
                     when given, else the longest sequences; sequence ``b`` uses ``bias[b, h, :Sq_b, :Sk_b]``).
    ``alibi_slopes`` ``[Hq]`` or ``[B, Hq]``.
    ``dropout_p``, ``seed``, ``offset``   dropout (``0 <= p < 1``), Philox seed and base offset.
    ``softcap``      ``None`` (off) or ``> 0``.
    ``sink``         number of sink key columns (``>= 0``).
    ``scale``        defaults to ``1/sqrt(Dq)``.
    ``accum``        accumulation dtype (``np.float32``, or ``np.float64`` for tests).

Returns ``(out, lse)``: ``out`` in q's dtype, ``lse`` float32 (``[B, Hq, Sq]``, or ``[Hq, Tq]`` in
group mode).  A row with no allowed column gives ``out = 0`` and ``lse = -inf``.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import UsageError, error
from .numeric import (MAX_LEN_HINT, dropout_problem, is_int, max_len_problem, scale_problem, softcap_problem,
                      window_side)
from .reference_rng import _check_seed, philox4x32, philox_uniform, uint32_to_uniform_float  # noqa: F401

__all__ = ["attention_fwd", "philox4x32", "philox_uniform", "uint32_to_uniform_float"]   # (the RNG re-exported)

# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------

_FLOATS = (np.float16, np.float32, np.float64)
_ROW_BLOCK_ELEMS = 1 << 22  # rows processed at once: keeps a score block under ~16 MiB (fp32)


def _usage(rule, msg, hint=None):
    return error(rule, msg, None, hint, cls=UsageError)


def as_array(name, x, dtype=None) -> np.ndarray:
    """``np.asarray(x, dtype)``, or a located error when ``x`` is no array (a ragged nested list, an object that
    does not convert)."""
    try:
        return np.asarray(x, dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise _usage("usage.type", f"`{name}` must be an array (or nested lists of one shape), got "
                     f"{type(x).__name__}: {why}", "pass a numpy array") from None


def _as_float_array(name, x):
    if x is None:
        raise _usage("usage.shape", f"`{name}` is required, got None",
                     "every array of the call is required, as the signature lists them")
    a = as_array(name, x)
    if a.dtype.type not in _FLOATS:
        raise _usage("usage.dtype", f"`{name}` must be float16, float32 or float64, got dtype {a.dtype}",
                     "pass bf16 data as float32")
    return a


def check_finite(name: str, a, read=(), masks: bool = False) -> None:
    """Refuse a NaN or infinite value in the part ``read`` of array ``a`` (a tuple of slices; all of it by default)
    -- with ``masks``, ``-inf`` is allowed (a bias entry of ``-inf`` masks its score).  The reference computes with
    every value it is given (a masked score still multiplies its V row by 0, so a NaN anywhere is a NaN out), where the
    kernels skip what a mask hides: a non-finite input is an error, not a silent difference."""
    part = a[read] if read else a
    bad = np.isnan(part) | (part == np.inf) if masks else ~np.isfinite(part)
    if bad.any():
        full = tuple(read) + (slice(None),) * (a.ndim - len(read))
        at = [int(i) + (sl.start or 0) for i, sl in zip(np.argwhere(bad)[0], full)]
        what = "finite (or -inf, which masks)" if masks else "finite"
        raise _usage("usage.value", f"`{name}{at}` is {float(a[tuple(at)])}: the reference takes {what} values",
                     "replace or mask the non-finite values (the NumPy reference reads every element it is given)")


def _normalize_causal(causal):
    if causal is None or (isinstance(causal, (bool, np.bool_)) and not causal):
        return None
    if isinstance(causal, (bool, np.bool_)):
        return "top_left"
    if isinstance(causal, str) and causal in ("top_left", "bottom_right"):
        return causal
    from .errors import did_you_mean

    hint = did_you_mean(causal, ["top_left", "bottom_right"]) if isinstance(causal, str) else None
    raise _usage("usage.value", f"causal must be None, False, True, 'top_left' or 'bottom_right', got {causal!r}",
                 hint or "True means top-left; use 'bottom_right' for the bottom-right corner")


def _normalize_window(window):
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise _usage("usage.value", f"window must be a pair (left, right) of ints, got {window!r}",
                     "negative means unbounded, e.g. (128, 0)") from None
    if not (is_int(left) and is_int(right)):
        raise _usage("usage.value", f"window must be a pair (left, right) of ints, got {window!r}",
                     "negative means unbounded, e.g. (128, 0)")
    return window_side(left), window_side(right)


def _check_cu(name, cu, total):
    a = as_array(name, cu)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise _usage("usage.shape", f"`{name}` must be a 1-D integer array, got shape {a.shape} dtype {a.dtype}",
                     "int32 with B + 1 entries")
    if a.shape[0] < 1:
        raise _usage("usage.shape", f"`{name}` must have B + 1 >= 1 entries, got an empty array",
                     "B + 1 offsets, starting at 0")
    a = a.astype(np.int64)
    if a[0] != 0:
        raise _usage("usage.shape", f"`{name}` must start at 0, got {int(a[0])}",
                     "cu_seqlens[b] is the first row of sequence b")
    d = np.diff(a)
    if np.any(d < 0):
        bad = int(np.argmax(d < 0))
        raise _usage("usage.shape", f"`{name}` must be non-decreasing, got {int(a[bad])} then {int(a[bad + 1])} "
                     f"at index {bad}", "cu_seqlens are cumulative lengths: each entry at least the previous")
    if a[-1] != total:
        raise _usage("usage.shape", f"`{name}` must end at the total length {total}, got {int(a[-1])}",
                     "the last entry is the number of rows of the 3-D tensor")
    return a


# ----------------------------------------------------------------------------------------------
# the forward pass
# ----------------------------------------------------------------------------------------------


def attention_fwd(q, k, v, *, causal=None, window=None, bias=None, alibi_slopes=None, dropout_p=0.0, seed=0,
                  offset=0, softcap=None, sink=0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, accum=np.float32):
    """Forward attention per ``docs/semantics.md``; returns ``(out, lse)``. See the module docstring."""
    c = setup(q, k, v, causal=causal, window=window, bias=bias, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
              seed=seed, offset=offset, softcap=softcap, sink=sink, scale=scale, cu_seqlens_q=cu_seqlens_q,
              cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, accum=accum)
    q, k, v, bias, alibi_slopes, cfg = c.q, c.k, c.v, c.bias, c.alibi_slopes, c.cfg
    group, B, Hq, Hk, Dv, Sq_max = c.group, c.B, c.Hq, c.Hk, c.Dv, c.Sq_max
    cq, ck, lens_q, lens_k = c.cq, c.ck, c.lens_q, c.lens_k
    Tq = q.shape[0]
    G = Hq // Hk
    if group:
        out = np.zeros((Tq, Hq, Dv), dtype=q.dtype)
        lse = np.full((Hq, Tq), -np.inf, dtype=np.float32)
        for b in range(B):
            qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
            for h in range(Hq):
                bh = None if bias is None else bias[min(b, bias.shape[0] - 1), min(h, bias.shape[1] - 1),
                                                    :int(lens_q[b]), :int(lens_k[b])]
                o, l = _head(q[qs, h, :], k[ks, h // G, :], v[ks, h // G, :], b, h, bh,
                             None if alibi_slopes is None else float(alibi_slopes[b, h]), cfg)
                out[qs, h, :] = o
                lse[h, qs] = l
    else:
        out = np.zeros((B, Hq, Sq_max, Dv), dtype=q.dtype)
        lse = np.full((B, Hq, Sq_max), -np.inf, dtype=np.float32)
        for b in range(B):
            for h in range(Hq):
                bh = None if bias is None else bias[min(b, bias.shape[0] - 1), min(h, bias.shape[1] - 1)]
                o, l = _head(q[b, h], k[b, h // G], v[b, h // G], b, h, bh,
                             None if alibi_slopes is None else float(alibi_slopes[b, h]), cfg)
                out[b, h] = o
                lse[b, h] = l
    return out, lse



class Setup:
    """The checked, canonical arguments of a reference call (what :func:`setup` returns)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def setup(q, k, v, *, causal=None, window=None, bias=None, alibi_slopes=None, dropout_p=0.0, seed=0, offset=0,
          softcap=None, sink=0, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
          max_seqlen_k=None, accum=np.float32) -> Setup:
    """Check a reference call's arguments (raising a located :class:`UsageError`) and put them in canonical
    form: the arrays, the mask as ``cfg["mwin"]``, the per-sequence lengths.  Shared by the forward and
    :mod:`fmha_dsl.reference_bwd`."""
    q = _as_float_array("q", q)
    k = _as_float_array("k", k)
    v = _as_float_array("v", v)
    for name, a in (("k", k), ("v", v)):
        if a.dtype != q.dtype:
            raise _usage("usage.dtype", f"`{name}` must have q's dtype {q.dtype}, got {a.dtype}",
                         "pass it as q's dtype (.astype(q.dtype))")
    accum = np.dtype(accum)
    if accum.type not in (np.float32, np.float64):
        raise _usage("usage.dtype", f"accum must be float32 or float64, got {accum}",
                     "accum=np.float32 (as the kernels accumulate) or np.float64")

    group = cu_seqlens_q is not None or cu_seqlens_k is not None
    if group and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise _usage("usage.shape", "group mode needs both cu_seqlens_q and cu_seqlens_k, got only "
                     + ("cu_seqlens_q" if cu_seqlens_k is None else "cu_seqlens_k"),
                     "pass both (B + 1 offsets each), or 4-D arrays for batch mode")
    rank = 3 if group else 4
    layout = "[T, H, D] (group mode)" if group else "[B, H, S, D] (batch mode)"
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim != rank:
            raise _usage("usage.shape", f"`{name}` must be {rank}-D {layout}, got shape {a.shape}",
                         "group mode takes 3-D tensors with cu_seqlens_q/k; batch mode 4-D without")
    # canonical [B, H, S, D] views (group: B = 1, sequences sliced below)
    if group:
        Tq, Hq, Dq = q.shape
        Tk, Hk, Dk = k.shape
        Tv, Hv, Dv = v.shape
        if (Tv, Hv) != (Tk, Hk):
            raise _usage("usage.shape", f"`v` must be [Tk={Tk}, Hk={Hk}, Dv], got shape {v.shape}",
                         "v holds the same tokens and heads as k")
        cq = _check_cu("cu_seqlens_q", cu_seqlens_q, Tq)
        ck = _check_cu("cu_seqlens_k", cu_seqlens_k, Tk)
        if cq.shape != ck.shape:
            raise _usage("usage.shape", f"cu_seqlens_q and cu_seqlens_k must have the same length B + 1, "
                         f"got {cq.shape[0]} and {ck.shape[0]}",
                         "both list B + 1 offsets, one sequence per pair of entries")
        B = cq.shape[0] - 1
        lens_q, lens_k = np.diff(cq), np.diff(ck)
        Sq_max = int(lens_q.max()) if B else 0
        Sk_max = int(lens_k.max()) if B else 0
    else:
        B, Hq, Sq_max, Dq = q.shape
        Bk, Hk, Sk_max, Dk = k.shape
        if Bk != B:
            raise _usage("usage.shape", f"`k` must have batch {B} like q, got shape {k.shape}",
                         "q, k and v are [B, H, S, D] with one batch size")
        if v.shape[:3] != k.shape[:3]:
            raise _usage("usage.shape", f"`v` must be [B={B}, Hk={Hk}, Sk={Sk_max}, Dv], got shape {v.shape}",
                         "v holds the same batch, heads and keys as k")
        Dv = v.shape[3]
    for name, given, longest in (("max_seqlen_q", max_seqlen_q, Sq_max), ("max_seqlen_k", max_seqlen_k, Sk_max)):
        why = None if given is None else max_len_problem(name, given, longest)
        if why:
            raise _usage("usage.value", why, MAX_LEN_HINT)
    if group:  # the given maxima are the kernels' Sq_max / Sk_max: of the bias's shape and the dropout counter
        Sq_max = Sq_max if max_seqlen_q is None else int(max_seqlen_q)
        Sk_max = Sk_max if max_seqlen_k is None else int(max_seqlen_k)
    if Dk != Dq:
        raise _usage("usage.shape", f"`k` must have q's head dim Dq={Dq}, got {Dk} (shape {k.shape})",
                     "q and k share the head dim (v's may differ)")
    if Hk == 0 or Hq % Hk != 0:
        raise _usage("usage.shape", f"query heads must be a multiple of key heads (Hq % Hk == 0), got Hq={Hq}, "
                     f"Hk={Hk}", "GQA/MQA: each key head serves Hq // Hk query heads")
    if Dq < 1 or Dv < 1:   # (as the kernels' path: what runs on arrays runs on the GPU)
        raise _usage("usage.shape", f"head dims must be >= 1, got Dq={Dq}, Dv={Dv}",
                     "the last dim of q, k and v is the head dim")
    for name, a in (("q", q), ("k", k), ("v", v)):
        check_finite(name, a)

    # scalar arguments
    mode = _normalize_causal(causal)
    win = _normalize_window(window)
    if scale is None:
        scale = 1.0 / math.sqrt(Dq)
    for why, hint in ((scale_problem(scale), "None means 1/sqrt(Dq)"),
                      (softcap is not None and softcap_problem(softcap), "None turns the soft-cap off"),
                      (dropout_problem(dropout_p), "0 disables dropout")):
        if why:
            raise _usage("usage.value", why, hint)
    if not is_int(sink) or sink < 0:
        raise _usage("usage.value", f"sink must be an int >= 0, got {sink!r}", "0 disables sink tokens")
    seed = _check_seed(seed)
    if not is_int(offset) or not 0 <= offset < (1 << 63):
        raise _usage("usage.value", f"offset must be an int in [0, 2**63), got {offset!r}",
                     "the Philox counter's base: advance it by the elements a previous call drew")

    # bias and slopes
    if bias is not None:
        bias = _as_float_array("bias", bias)
        want = (Sq_max, Sk_max)
        if bias.ndim != 4 or bias.shape[2:] != want or bias.shape[0] not in (1, B) or bias.shape[1] not in (1, Hq):
            what = "[B|1, Hq|1, Sq_max, Sk_max]" if group else "[B|1, Hq|1, Sq, Sk]"
            raise _usage("usage.shape", f"`bias` must be {what} = [{B}|1, {Hq}|1, {Sq_max}, {Sk_max}], "
                         f"got shape {bias.shape}", "size-1 batch/head dims broadcast")
        if not group:
            check_finite("bias", bias, masks=True)
        for b in range(B if group else 0):   # group mode: the entries sequence b reads, its corner
            rows = slice(b, b + 1) if bias.shape[0] > 1 else slice(None)
            check_finite("bias", bias, (rows, slice(None), slice(0, int(lens_q[b])), slice(0, int(lens_k[b]))), True)
    if alibi_slopes is not None:
        alibi_slopes = as_array("alibi_slopes", alibi_slopes)
        if alibi_slopes.dtype.kind != "f":
            raise _usage("usage.dtype", f"`alibi_slopes` must be a float array, got dtype {alibi_slopes.dtype}",
                         "one slope per query head (or per sequence and head), e.g. float32")
        if alibi_slopes.shape not in ((Hq,), (B, Hq)):
            raise _usage("usage.shape", f"`alibi_slopes` must be [Hq] = [{Hq}] or [B, Hq] = [{B}, {Hq}], "
                         f"got shape {alibi_slopes.shape}", "one slope per query head (or per sequence and head)")
        alibi_slopes = alibi_slopes.astype(np.float32)
        if not np.isfinite(alibi_slopes).all():
            at = tuple(int(i) for i in np.argwhere(~np.isfinite(alibi_slopes))[0])
            raise _usage("usage.value", f"`alibi_slopes{list(at)}` is {float(alibi_slopes[at])}: slopes must be finite "
                         "in float32", "ALiBi's slopes are 2**(-8 h / Hq) for head h")
        if alibi_slopes.ndim == 1:
            alibi_slopes = np.broadcast_to(alibi_slopes, (B, Hq))

    # mask as a window (left, right, top_left?) or None; causal + window clips right to 0
    mask_none = mode is None and (win is None or (win[0] < 0 and win[1] < 0))
    if mask_none:
        mwin = None
    else:
        left, right = win if win is not None else (-1, 0)
        if mode is not None:
            right = 0
        mwin = (left, right, mode == "top_left")

    cfg = {"scale": float(scale), "softcap": None if softcap is None else float(softcap), "mwin": mwin,
               "sink": int(sink) if not mask_none else 0, "dropout_p": float(dropout_p), "seed": seed,
               "offset": int(offset),
               "Hq": Hq, "Sq_max": Sq_max, "Sk_max": Sk_max, "accum": accum.type}
    if not group:
        cq = ck = lens_q = lens_k = None
    return Setup(q=q, k=k, v=v, bias=bias, alibi_slopes=alibi_slopes, cfg=cfg, group=group, B=B, Hq=Hq, Hk=Hk,
                 Dq=Dq, Dv=Dv, Sq_max=Sq_max, Sk_max=Sk_max, cq=cq, ck=ck, lens_q=lens_q, lens_k=lens_k)

def _logits(qa, ka, i, j, Sq: int, Sk: int, bias, slope, cfg):
    """Steps 2-5 of docs/semantics.md for query rows ``i`` (``[r, 1]``; ``qa`` their queries, ``ka`` the keys, both in
    the accumulation dtype) against key columns ``j`` (``[1, Sk]``): ``(s, t)``, the scores after soft-cap, bias and
    ALiBi with ``-inf`` where the mask forbids, and ``t = tanh(scale q.k / softcap)`` (None without soft-cap; the
    backward's derivative needs it).  ``bias``: these rows of the bias (or None)."""
    acc = cfg["accum"]
    s = (qa @ ka.T) * acc(cfg["scale"])
    t = None
    if cfg["softcap"] is not None:
        c = acc(cfg["softcap"])
        t = np.tanh(s / c)
        s = c * t
    if bias is not None:
        s = s + bias.astype(acc)
    if slope is not None:
        s = s - acc(slope) * np.abs((i + (Sk - Sq)) - j).astype(acc)
    if cfg["mwin"] is not None:
        left, right, top_left = cfg["mwin"]
        d = i + (0 if top_left else Sk - Sq)
        allowed = np.ones((i.shape[0], Sk), dtype=bool)
        if left >= 0:
            allowed &= j >= d - left
        if right >= 0:
            allowed &= j <= d + right
        if cfg["sink"] > 0:
            allowed |= j < cfg["sink"]
        s = np.where(allowed, s, acc(-np.inf))
    return s, t


def _keep(cfg, b: int, h: int, i, j):
    """Step 7's dropout keep-mask at rows ``i`` and columns ``j`` of (sequence ``b``, head ``h``)."""
    off = cfg["offset"] + ((b * cfg["Hq"] + h) * cfg["Sq_max"] + i) * cfg["Sk_max"] + j
    return philox_uniform(cfg["seed"], off.astype(np.int64)) >= np.float32(cfg["dropout_p"])


def _head(qh, kh, vh, b, h, bias, slope, cfg):
    """One (sequence, query head): qh [Sq, Dq], kh [Sk, Dq], vh [Sk, Dv] -> out [Sq, Dv], lse [Sq]."""
    acc = cfg["accum"]
    Sq, Sk, Dv = qh.shape[0], kh.shape[0], vh.shape[1]
    out = np.zeros((Sq, Dv), dtype=acc)
    lse = np.full((Sq,), -np.inf, dtype=np.float32)
    if Sq == 0 or Sk == 0:
        return out, lse
    ka = kh.astype(acc)
    va = vh.astype(acc)
    j = np.arange(Sk)[None, :]
    step = max(1, _ROW_BLOCK_ELEMS // Sk)
    with np.errstate(all="ignore"):
        for r0 in range(0, Sq, step):
            r1 = min(Sq, r0 + step)
            i = np.arange(r0, r1)[:, None]
            s, _ = _logits(qh[r0:r1].astype(acc), ka, i, j, Sq, Sk, None if bias is None else bias[r0:r1], slope,
                           cfg)
            m = s.max(axis=1, keepdims=True)
            live = ~(m == acc(-np.inf))  # rows with an allowed column whose score is not -inf (NaN propagates)
            m = np.where(live, m, acc(0))
            e = np.exp(s - m)  # masked: exp(-inf) = 0
            l = e.sum(axis=1, keepdims=True)
            p = np.where(live, e / np.where(live, l, acc(1)), acc(0))
            lse[r0:r1] = np.where(live[:, 0], (m + np.log(l))[:, 0], -np.inf).astype(np.float32)
            if cfg["dropout_p"] > 0.0:
                p = np.where(_keep(cfg, b, h, i, j), p / acc(1.0 - cfg["dropout_p"]), acc(0))
            out[r0:r1] = p @ va
    return out, lse
