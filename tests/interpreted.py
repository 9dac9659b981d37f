"""Triton's CPU interpreter for the tests (imported by test modules; not a test module): a script run in a fresh
process, for the end-to-end tests of the torch path, and the worker process the kernel harnesses run in."""

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import subprocess
import sys

import pytest


def run_interpreted(script: str, marker: str, timeout: int = 600) -> str:
    """Run ``script`` with ``TRITON_INTERPRET=1`` in a fresh interpreter (skipped without torch or triton); it must
    exit 0 and print ``marker``.  Returns its stdout."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert marker in out.stdout, out.stdout[-3000:]
    return out.stdout


# a harness test that also runs with the unreadable page before each input (a read before an input's start faults)
both_guard_sides = pytest.mark.parametrize("interp", ("end", "start"), indirect=True)


def _nothing():
    return None


def _e4m3_nan_widens_to_nan():
    """Make the worker's Triton interpreter widen e4m3 ("fn") NaN bytes (0x7F, 0xFF) to NaN, as the GPU does: its
    ``_convert_float`` has no NaN case for that format and gives +-480 (Triton 3.6 and 3.9), so a harness test that
    puts NaN bytes in the slots no sequence reads would otherwise test large finite values there, and a kernel
    that multiplied such a slot by a zero probability instead of dropping it would pass."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float

    def widen(input, input_dtype, output_dtype, rounding_mode):
        out = convert(input, input_dtype, output_dtype, rounding_mode)
        if input_dtype == tl.float8e4nv and output_dtype.primitive_bitwidth > 8:
            bits = np.frombuffer(input.tobytes(), dtype=np.uint8).reshape(out.shape)
            nan = (bits & 0x7F) == 0x7F
            if nan.any():
                w, m = output_dtype.primitive_bitwidth, output_dtype.fp_mantissa_width
                quiet = (((1 << (w - 1 - m)) - 1) << m) | (1 << (m - 1))   # exponent all ones, top mantissa bit
                sign = (bits.astype(out.dtype) >> 7) << (w - 1)
                out = np.where(nan, sign | np.array(quiet, dtype=out.dtype), out)
        return out

    interpreter._convert_float = widen


@contextlib.contextmanager
def interpreter_worker():
    """A one-process pool whose worker runs with ``TRITON_INTERPRET=1`` (the flag must be set before triton is
    imported, and the test process keeps a compiling triton for the ahead-of-time checks)."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # inherited by the worker spawned on the first submit
    try:
        ex = cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                    initializer=_e4m3_nan_widens_to_nan)
        ex.submit(_nothing).result()
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    try:
        yield ex
    finally:
        ex.shutdown()


def harness_runner(ex, request, harness):
    """``run(*args, **kw)``: ``harness(*args, **kw)`` in worker ``ex``, its read-only inputs guarded on the side a
    test asks for (:data:`both_guard_sides`: the ``interp`` fixture parametrized indirectly), else on the side
    ``FMHA_TEST_GUARD_SIDE`` names (``start`` runs every harness test with the unreadable page before each input),
    else after their end."""
    from fmha_dsl.kernels.fwd_interpret import run_guarded

    side = getattr(request, "param", None) or os.environ.get("FMHA_TEST_GUARD_SIDE", "end")

    def run(*args, **kw):
        return ex.submit(run_guarded, side, harness, *args, **kw).result()

    return run
