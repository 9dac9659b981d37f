"""The numeric range of the API's scalar arguments, shared by the kernels' path (:mod:`.attention_args`) and the
NumPy reference (:mod:`.reference`), so that both accept exactly the same values.

The kernels work in float32 and in base 2: ``scale`` and ``softcap`` are multiplied by ``log2(e)`` before use.  A
number is *usable* when it is a real, not a bool, finite, and stays finite in float32 after that multiply
(``|x| <= FP32_MAX / log2(e)``, about 2.36e38); a soft-cap must also stay nonzero in float32 (``>= 2**-126``, the
smallest normal), since the kernels divide by it.  Python ints of any size are compared exactly (``10**400`` is
out of range, not an OverflowError).  Also the ranges of a seqtune table's measurements, which the registry schema
and the report check alike.  Plain Python, no NumPy: importing this module does no work.
"""

from __future__ import annotations

import math
import numbers

FP32_MAX = 3.4028234663852886e38
FP32_TINY = 2.0 ** -126          # the smallest normal float32
LOG2E = 1.4426950408889634
SCALAR_MAX = FP32_MAX / LOG2E    # the largest |scale| or softcap that stays finite in base 2
INT64_MAX = (1 << 63) - 1
WINDOW_MAX = (1 << 31) - 2    # a window side at least this wide is unbounded
# a seqtune table's measurements (the registry schema and the report read them alike): a kernel time in
# microseconds (1 ns .. 11 days) and a point's lengths and counts, in [1, COUNT_MAX]
TIME_RANGE_US = (1e-3, 1e12)
COUNT_MAX = (1 << 31) - 1


def is_int(x) -> bool:
    """An integer (Python's or NumPy's), not a bool."""
    return isinstance(x, numbers.Integral) and not _is_bool(x)


def _is_bool(x) -> bool:
    t = type(x)
    return isinstance(x, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"))


def as_float(x) -> float | None:
    """``x`` as a finite Python float when it is a real number (not a bool) of float32's usable range (module
    docstring), else None."""
    if not isinstance(x, numbers.Real) or _is_bool(x):
        return None
    try:
        f = float(x)
    except (OverflowError, TypeError, ValueError):
        return None
    return f if math.isfinite(f) and abs(f) <= SCALAR_MAX else None


def usable_scale(x) -> bool:
    """A softmax scale the kernels can use (any sign; 0 allowed)."""
    return as_float(x) is not None


def usable_softcap(x) -> bool:
    """A logit soft-cap the kernels can use: ``FP32_TINY <= x <= SCALAR_MAX``."""
    f = as_float(x)
    return f is not None and f >= FP32_TINY


def scale_problem(scale) -> str | None:
    """What is wrong with a softmax ``scale`` (None: nothing) -- the message every path raises."""
    if usable_scale(scale):
        return None
    return (f"scale must be a finite number of magnitude <= {SCALAR_MAX:.3g} (float32, after the kernels' multiply "
            f"by log2(e)), got {shown(scale)}")


def softcap_problem(softcap) -> str | None:
    """What is wrong with a logit ``softcap`` that is not None (None: nothing)."""
    if usable_softcap(softcap):
        return None
    return (f"softcap must be None (off) or a number in [2**-126, {SCALAR_MAX:.3g}] (float32, after the kernels' "
            f"multiply by log2(e)), got {shown(softcap)}")


def dropout_problem(p) -> str | None:
    """What is wrong with a ``dropout_p`` (None: nothing)."""
    f = as_float(p)
    return None if f is not None and 0.0 <= f < 1.0 else f"dropout_p must be in [0, 1), got {shown(p)}"


MAX_LEN_HINT = "pass at least the longest sequence's length, or None to have it computed"


def max_len_problem(name: str, given, longest: int | None) -> str | None:
    """What is wrong with a ``max_seqlen_*`` argument that is not None, against the longest sequence when it is
    known (None: nothing)."""
    if not is_int(given) or given < 0:
        return f"{name} must be an int >= 0, got {shown(given)}"
    if longest is not None and given < longest:
        return f"{name}={given} is below the longest sequence ({longest})"
    return None


def is_time(t) -> bool:
    """A measured kernel time of a seqtune table or a decision record: a number (not a bool) in
    :data:`TIME_RANGE_US`."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and TIME_RANGE_US[0] <= t <= TIME_RANGE_US[1]


def shown(x, width: int = 40) -> str:
    """``repr(x)`` for a message, cut to ``width`` characters (a 400-digit int stays readable)."""
    r = repr(x)
    return r if len(r) <= width else r[:width - 3] + "..."


def window_side(x: int) -> int:
    """One side of a window as the kernels and the reference read it: any negative value is -1 (unbounded), and a
    side wider than any sequence is cut to ``2**31 - 2`` (the kernels' i32; every length is below ``2**31``, so the
    mask is the same)."""
    return -1 if x < 0 else min(int(x), WINDOW_MAX)


__all__ = ["shown", "window_side", "scale_problem", "softcap_problem", "dropout_problem", "max_len_problem",
           "MAX_LEN_HINT", "is_time", "FP32_MAX",
           "FP32_TINY", "LOG2E", "SCALAR_MAX", "INT64_MAX", "WINDOW_MAX", "TIME_RANGE_US", "COUNT_MAX", "is_int",
           "as_float", "usable_scale", "usable_softcap"]
