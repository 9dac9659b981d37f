"""[kernels] What the CPU interpreter harnesses (:mod:`.bwd_interpret`, :mod:`.paged_interpret`) share: the kernel
dtype of NumPy inputs, and the reference's ``causal``/``window`` keywords as a mask kernel's run-time arguments."""

from __future__ import annotations

import numpy as np

from .paged_abi import FP8_DTYPES

DTYPES = ("fp16", "bf16", "fp32")


def dtype_of(x, dtype=None) -> str:
    """``dtype`` checked, or the kernel dtype of array ``x`` (float16 -> fp16, float32 -> fp32; bf16 and fp8bf16 must
    be asked for: their inputs are float32 arrays of values on the dtype's grid)."""
    if dtype is None:
        dtype = {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}.get(np.asarray(x).dtype)
        if dtype is None:
            raise ValueError(f"inputs must be float16 or float32 (or pass dtype='bf16'), got {np.asarray(x).dtype}")
    if dtype not in DTYPES and dtype not in FP8_DTYPES:
        raise ValueError(f"dtype must be fp16, bf16, fp32 or fp8bf16, got {dtype!r}")
    return dtype


def mask_args(causal, window) -> tuple:
    """``(mode, no_mask, window_left, window_right)`` of :func:`fmha_dsl.reference.attention_fwd`'s ``causal`` and
    ``window``: ``mode`` None / ``"top_left"`` / ``"bottom_right"``; a causal mask clips the window's right side to 0;
    no mask at all gives ``(-1, -1)``."""
    from ..reference import _normalize_causal, _normalize_window

    mode = _normalize_causal(causal)
    win = _normalize_window(window)
    no_mask = mode is None and (win is None or (win[0] < 0 and win[1] < 0))
    left, right = win if win is not None else (-1, 0)
    if mode is not None:
        right = 0
    if no_mask:
        left, right = -1, -1
    return mode, no_mask, left, right
