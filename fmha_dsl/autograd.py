"""``fmha_dsl.attention`` as a differentiable torch operator: two ``torch.library`` custom ops and their autograd.

    out = fmha_dsl.attention(q, k, v, causal=True)     # q/k/v (or bias) require grad
    out.sum().backward()                                # q.grad, k.grad, v.grad (and bias.grad)

``fmha_dsl::attention_fwd`` returns ``(out, lse)`` and ``fmha_dsl::attention_bwd`` the gradients; both have fake
(meta) implementations, so ``torch.compile`` traces a model that calls :func:`fmha_dsl.attention` without a graph
break, and ``torch.library.opcheck`` passes.  The forward saves only what the backward needs: q, k, v, out, lse,
the bias / slopes / ``cu_seqlens`` it was given, and the scalars (the dropout seed and offset among them, so the
backward recomputes the forward's keep-mask exactly).  ``torch.are_deterministic_algorithms_enabled()`` selects
the deterministic backward (dQ summed in a fixed order).

Eager calls (not under ``torch.compile``) take a ``torch.autograd.Function`` around the same forward and backward
(:class:`_Eager`): a ``torch.library.custom_op`` call costs far more host time than the kernels of a small problem
(measured on an H200 with torch 2.11: a forward + backward step of 1x2x128x64 spent 890 us on the host through the
custom ops, docs/benchmarks.md).  Both routes run the same functions, so they give the same gradients.

The ops are registered on first use (:func:`ops`), not at import.
"""

import threading  # no `from __future__ import annotations`: torch.library reads the ops' annotations as types

__all__ = ["ops", "attention_autograd"]

_LOCK = threading.Lock()
_OPS: dict = {}
_REGISTRIES: dict = {}   # "@<id>" -> a Registry / Dispatcher object handed to attention() (ops take strings)


def _registry_name(registry):
    """What the ops carry for ``registry=``: None, a path as given, or a token for an in-memory object."""
    if registry is None or isinstance(registry, str):
        return registry
    import os

    if isinstance(registry, os.PathLike):
        return os.fspath(registry)
    token = f"@{id(registry)}"
    _REGISTRIES[token] = registry
    return token


def _registry(name):
    return _REGISTRIES.get(name, name) if name is not None and name.startswith("@") else name


def ops(attention=None):
    """``(fwd_op, bwd_op)``, registered with torch on the first call (``attention``: the forward they run,
    :func:`fmha_dsl.attention`, which hands itself over so that this module does not import it)."""
    if _OPS:
        return _OPS["fwd"], _OPS["bwd"]
    with _LOCK:
        if not _OPS:
            if attention is None:
                import fmha_dsl

                attention = fmha_dsl.attention
            _register(attention)
    return _OPS["fwd"], _OPS["bwd"]


def _forward(attention, q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
             window_left, window_right, dropout_p, seed, offset, softcap, sink, scale, registry):
    """``(out, lse)``: the forward both routes run (``causal``: "no" | "top_left" | "bottom_right"; a plain call --
    no window, top-left or no mask -- is passed as one, so that repeat calls replay on the torch fast path)."""
    from .attention_bwd import compile_backward_ahead

    window = None if window_left < 0 and window_right < 0 else (window_left, window_right)
    c = True if causal == "top_left" and window is None else _CAUSAL[causal]
    # a new class: its backward's candidates compile in the background behind the forward's (the backward's own
    # keywords, as _backward passes them)
    ahead = compile_backward_ahead(q, k, v, causal=_CAUSAL[causal], window=(window_left, window_right), bias=bias,
                                   alibi_slopes=alibi_slopes, dropout_p=dropout_p, softcap=softcap, sink=sink,
                                   cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                                   max_seqlen_k=max_seqlen_k, registry=_registry(registry))
    got = attention(q, k, v, causal=c, window=window, bias=bias,
                    alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed, softcap=softcap, sink=sink, scale=scale,
                    return_lse=True, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, offset=offset,
                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, registry=_registry(registry))
    if ahead is not None:  # the forward compiled nothing (decided already): the backward's start now
        try:
            ahead.start_ahead()
        except Exception:  # noqa: BLE001  (only time is lost: the backward compiles them itself)
            pass
    return got


def _backward(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              causal, window_left, window_right, dropout_p, seed, offset, softcap, sink, scale, deterministic,
              registry):
    """``(dq, dk, dv, dbias | None)``: the backward both routes run."""
    from .attention_bwd import attention_backward

    got = attention_backward(q, k, v, out, lse, dout.contiguous() if dout.stride(-1) != 1 else dout,
                             causal=_CAUSAL[causal], window=(window_left, window_right), bias=bias,
                             alibi_slopes=alibi_slopes, dropout_p=dropout_p, seed=seed, softcap=softcap, sink=sink,
                             scale=scale, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, offset=offset,
                             deterministic=deterministic, registry=_registry(registry))
    return got[0], got[1], got[2], (got[3] if bias is not None else None)


_CAUSAL = {"no": False, "top_left": "top_left", "bottom_right": "bottom_right"}


def _no_lse_gradient():
    from .errors import UsageError, error

    raise error("usage.value", "the LSE that attention(..., return_lse=True) returns has no gradient, and a loss "
                "used it", None, "use lse.detach() in the loss (the backward propagates through `out` only)",
                cls=UsageError)
_NON_TENSOR_INPUTS = 15  # the forward's inputs after q, k, v, bias: no gradient


def _register(attention) -> None:
    from typing import Optional

    import torch
    from torch import Tensor

    @torch.library.custom_op("fmha_dsl::attention_fwd", mutates_args=(), device_types=None)
    def fwd(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], alibi_slopes: Optional[Tensor],
            cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: Optional[int],
            max_seqlen_k: Optional[int], causal: str, window_left: int, window_right: int, dropout_p: float,
            seed: int, offset: int, softcap: Optional[float], sink: int, scale: Optional[float],
            registry: Optional[str]) -> tuple[Tensor, Tensor]:
        return _forward(attention, q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, causal, window_left, window_right, dropout_p, seed, offset, softcap, sink, scale,
                        registry)

    @fwd.register_fake
    def _(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window_left,
          window_right, dropout_p, seed, offset, softcap, sink, scale, registry):
        dv = v.shape[-1]
        if cu_seqlens_q is not None:
            out = q.new_empty((q.shape[0], q.shape[1], dv))
            lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
        else:
            out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], dv))
            lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)
        return out, lse

    @torch.library.custom_op("fmha_dsl::attention_bwd", mutates_args=(), device_types=None)
    def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, bias: Optional[Tensor],
            alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
            max_seqlen_q: Optional[int], max_seqlen_k: Optional[int], causal: str, window_left: int,
            window_right: int, dropout_p: float, seed: int, offset: int, softcap: Optional[float], sink: int,
            scale: Optional[float], deterministic: bool, registry: Optional[str]
            ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        dq, dk, dv, dbias = _backward(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                                      max_seqlen_q, max_seqlen_k, causal, window_left, window_right, dropout_p, seed,
                                      offset, softcap, sink, scale, deterministic, registry)
        return dq, dk, dv, (dbias if dbias is not None else q.new_empty((0,)))

    @bwd.register_fake
    def _(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
          window_left, window_right, dropout_p, seed, offset, softcap, sink, scale, deterministic, registry):
        dbias = torch.empty_like(bias) if bias is not None else q.new_empty((0,))
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias

    def setup_context(ctx, inputs, output):
        """What both routes save: the tensors the backward reads and the forward's other arguments."""
        (q, k, v, bias, alibi_slopes, cu_q, cu_k, max_q, max_k, causal, wl, wr, dropout_p, seed, offset, softcap,
         sink, scale, registry) = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k)
        ctx.scalars = (max_q, max_k, causal, wl, wr, dropout_p, seed, offset, softcap, sink, scale, registry)

    def gradients(ctx, dout, run):
        """``backward``'s result from the saved state, ``run`` being the backward op or :func:`_backward`."""
        q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k = ctx.saved_tensors
        *scalars, registry = ctx.scalars
        dq, dk, dv, dbias = run(dout, q, k, v, out, lse, bias, alibi_slopes, cu_q, cu_k, *scalars,
                                torch.are_deterministic_algorithms_enabled(), registry)
        return (dq, dk, dv, dbias if bias is not None else None) + (None,) * _NON_TENSOR_INPUTS

    def backward(ctx, dout, dlse):  # (the traced route gets a materialised dlse: an LSE gradient is dropped here)
        return gradients(ctx, dout, bwd)

    fwd.register_autograd(backward, setup_context=setup_context)

    class _Eager(torch.autograd.Function):
        """The eager route: the same forward and backward without the custom ops' dispatch."""

        @staticmethod
        def forward(ctx, *inputs):
            output = _forward(attention, *inputs)
            setup_context(ctx, inputs, output)
            ctx.set_materialize_grads(False)  # an unused LSE gets no gradient tensor (None below)
            return output

        @staticmethod
        def backward(ctx, dout, dlse):
            if dlse is not None:
                _no_lse_gradient()
            return gradients(ctx, dout, _backward)

    _OPS.update(fwd=fwd, bwd=bwd, eager=_Eager.apply, compiling=torch.compiler.is_compiling)


def attention_autograd(attention, q, k, v, *, causal, window, bias, alibi_slopes, dropout_p, seed, softcap, sink,
                       scale, return_lse, cu_seqlens_q, cu_seqlens_k, registry, offset, max_seqlen_q, max_seqlen_k):
    """The differentiable forward: :func:`fmha_dsl.attention` (passed as ``attention``) and its arguments, through
    the custom ops."""
    from .attention_args import _check_dropout, _mask
    from .numeric import window_side

    mode = _mask(causal, window)[0]  # checks both; the ops carry the corner and the window as given
    c = {"no": "no", "generic": "no", "top_left": "top_left", "bottom_right": "bottom_right"}[mode]
    wl, wr = (-1, -1) if window is None else (window_side(window[0]), window_side(window[1]))   # (op ints: int64)
    seed = _check_dropout(dropout_p, seed, offset) if dropout_p else 0
    fwd, _ = ops(attention)
    run = fwd if _OPS["compiling"]() else _OPS["eager"]  # torch.compile traces the op; eager skips its dispatch
    out, lse = run(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, c, wl, wr,
                   float(dropout_p or 0.0), int(seed or 0), int(offset), softcap, int(sink or 0), scale,
                   _registry_name(registry))
    return (out, lse) if return_lse else out
