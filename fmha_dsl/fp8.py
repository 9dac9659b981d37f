"""FP8 e4m3 (OCP "fn": no infinities, NaN = S.1111.111, largest finite 448) in NumPy, which has no such dtype.

The serving kernels' FP8 contract (CK's ``fp8bf16``: e4m3 Q and caches, per-tensor descales, bf16 output) is defined
on the values these bytes stand for: :func:`decode_e4m3` gives them, :func:`encode_e4m3` rounds float32 to the
nearest of them (ties to the even code, beyond +-448 saturated, as ``cvt.rn.satfinite`` does) and :func:`round_e4m3`
is the two in turn.  ``torch.float8_e4m3fn`` holds the same bytes.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["decode_e4m3", "encode_e4m3", "round_e4m3", "E4M3_MAX"]

E4M3_MAX = 448.0


@functools.lru_cache(maxsize=None)
def _table() -> np.ndarray:
    """The value of every byte (float32 [256])."""
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    val = sign * val
    val[(b & 0x7F) == 0x7F] = np.nan
    return val.astype(np.float32)


def decode_e4m3(bits) -> np.ndarray:
    """float32 values of e4m3 bytes (any integer array; uint8 as stored)."""
    return _table()[np.asarray(bits).astype(np.uint8)]


def encode_e4m3(x) -> np.ndarray:
    """uint8 e4m3 bytes of float values: round to nearest, ties to the even code; beyond +-448 saturated; NaN stays
    NaN (0x7F)."""
    x = np.asarray(x, dtype=np.float32)
    grid = _table()[:127]                       # the non-negative finite values, increasing with the code
    a = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(grid, a, side="left"), 0, 126)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - grid[lo], grid[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    code = np.where(np.signbit(x), code | 0x80, code).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)


def round_e4m3(x) -> np.ndarray:
    """``x`` rounded to e4m3 values (float32)."""
    return decode_e4m3(encode_e4m3(x))
