"""Run a registry entry's kernel on the CPU under Triton's interpreter (``Dispatcher(..., launcher="interpret")``).

For tests and debugging on machines without a GPU: the dispatcher selects an entry as it would for a GPU,
:class:`fmha_dsl.runtime.dispatch.Plan` packs the same arguments, and this launcher runs the template
(``fmha_dsl.kernels.triton_fwd.fmha_fwd``) with the entry's constexprs on torch CPU tensors.
``TRITON_INTERPRET=1`` must be set before triton is first imported.  bf16 dots are done in fp32 (the
interpreter's bf16 ``tl.dot`` is broken, triton-lang/triton#11584).
"""

from __future__ import annotations

import os

from fmha_dsl.errors import UsageError, error

# pointer slots of the ABI and the dtype of a placeholder for an unused (NULL) one
_SLOT_DTYPES = ("in", "in", "in", "in", "float32", "in", "float32", "int32", "int32")
_COMBINE_SLOT_DTYPES = ("float32", "float32", "in", "float32", "int32")


class InterpretKernel:
    kind = "interpret"
    needs_objects = True  # Plan passes the tensors themselves in the pointer slots

    def __init__(self, entry):
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise error("runtime.interpret", "launcher='interpret' needs TRITON_INTERPRET=1 before triton is imported",
                        None, "export TRITON_INTERPRET=1 (tests run this in a subprocess)", cls=UsageError)
        self.entry = entry
        if entry.sig["family"] == "fwd_splitkv_combine":
            from fmha_dsl.kernels import triton_combine as C

            self._kernel = C.fmha_fwd_combine
            self._const = C.constexprs(entry.sig)
            self._slots = _COMBINE_SLOT_DTYPES
            return
        from fmha_dsl.kernels import triton_fwd as T

        self._kernel = T.fmha_fwd
        self._const = T.constexprs(entry.sig, entry.alg)
        self._slots = _SLOT_DTYPES
        if entry.sig["dtype"] == "bf16":
            self._const["UPCAST_DOT"] = True

    def launch(self, grid, args, stream=0) -> None:
        import torch

        args = list(args)
        q = args[2] if self._slots is _COMBINE_SLOT_DTYPES else args[0]
        for i, kind in enumerate(self._slots):
            if args[i] is None:
                dt = q.dtype if kind == "in" else getattr(torch, kind)
                args[i] = torch.zeros(1, dtype=dt)
        self._kernel[tuple(grid)](*args, **self._const)


__all__ = ["InterpretKernel"]
