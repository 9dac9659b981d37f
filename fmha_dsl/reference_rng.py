"""[reference] The dropout mask's random numbers: Philox4x32 (Random123) as Triton's ``tl.rand`` draws them, bit for
bit, so that the NumPy reference keeps and drops exactly the elements the kernels do."""

from __future__ import annotations

import numpy as np

from .errors import UsageError, error
from .numeric import is_int

_M0 = np.uint64(0xD2511F53)  # round multiplier applied to c0
_M1 = np.uint64(0xCD9E8D57)  # round multiplier applied to c2
_W0 = 0x9E3779B9  # key schedule (golden ratio)
_W1 = 0xBB67AE85  # key schedule (sqrt(3) - 1)
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_UNIFORM_SCALE = np.float32(4.6566127342e-10)  # Triton's scale for int32 -> [0, 1)


def philox4x32(counter, key, rounds: int = 10):
    """Philox4x32-``rounds`` of a counter block ``(c0, c1, c2, c3)`` under ``key = (k0, k1)``.

    Counter words are uint32 arrays (or ints; they broadcast), key words are ints.  Returns four
    uint32 arrays.  With ``rounds=10`` this is Random123's ``philox4x32_10``.
    """
    c = np.broadcast_arrays(*[np.asarray(x, dtype=np.uint64) & _MASK32 for x in counter])
    c0, c1, c2, c3 = (x.copy() for x in c)
    k0, k1 = int(key[0]) & 0xFFFFFFFF, int(key[1]) & 0xFFFFFFFF
    for _ in range(int(rounds)):
        p0 = _M0 * c0  # < 2**64: exact in uint64
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> _SHIFT32) ^ c1 ^ np.uint64(k0), p1 & _MASK32,
                          (p0 >> _SHIFT32) ^ c3 ^ np.uint64(k1), p0 & _MASK32)
        k0 = (k0 + _W0) & 0xFFFFFFFF
        k1 = (k1 + _W1) & 0xFFFFFFFF
    return tuple(x.astype(np.uint32) for x in (c0, c1, c2, c3))


def uint32_to_uniform_float(x: np.ndarray) -> np.ndarray:
    """Triton's ``uint_to_uniform_float`` for 32-bit words: a float32 in ``[0, 1)``.

    The word is read as int32, negative values are bit-inverted (``~x``), and the result is
    ``float32(x) * float32(4.6566127342e-10)``.
    """
    s = np.asarray(x).astype(np.uint32).view(np.int32)
    s = np.where(s < 0, ~s, s)
    return s.astype(np.float32) * _UNIFORM_SCALE


def philox_uniform(seed: int, offsets) -> np.ndarray:
    """Bit-exact ``tl.rand(seed, offsets)``: float32 uniforms in ``[0, 1)``, shaped like ``offsets``.

    ``seed`` is any int in ``[-2**63, 2**64)`` (taken as uint64: low word ``k0``, high word ``k1``).
    ``offsets`` is an integer array: the counter is ``(lo32(offset), hi32(offset), 0, 0)``, where the
    high word is used only for 64-bit offset dtypes (as Triton does for int64 offsets; a Python list
    becomes int64).
    """
    seed = _check_seed(seed)
    off = np.asarray(offsets)
    if off.dtype.kind not in "iu":
        raise error("usage.dtype", f"offsets must be an integer array, got dtype {off.dtype}", None,
                    "pass e.g. np.arange(n, dtype=np.int64)", cls=UsageError)
    if off.dtype.itemsize == 8:
        u = off.astype(np.uint64, copy=False) if off.dtype.kind == "u" else off.view(np.uint64)
        lo, hi = u & _MASK32, u >> _SHIFT32
    else:
        lo, hi = off.astype(np.int64) & 0xFFFFFFFF, 0
    r0, _, _, _ = philox4x32((lo, hi, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    return uint32_to_uniform_float(r0).reshape(off.shape)


def _check_seed(seed) -> int:
    if not is_int(seed) or not (-(1 << 63) <= int(seed) < (1 << 64)):
        raise _usage("usage.value", f"seed must be an int in [-2**63, 2**64), got {seed!r}",
                     "Triton converts the seed to uint64")
    return int(seed) & 0xFFFFFFFFFFFFFFFF


def _usage(rule, msg, hint=None):
    return error(rule, msg, None, hint, cls=UsageError)


__all__ = ["philox4x32", "philox_uniform", "uint32_to_uniform_float"]
