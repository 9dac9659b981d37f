"""Run a registry entry's kernel on the CPU under Triton's interpreter (``Dispatcher(..., launcher="interpret")``).

For tests and debugging on machines without a GPU: the dispatcher selects an entry as it would for a GPU, the plan
packs the same arguments, and this launcher runs the entry's template function (from the family's ABI,
:mod:`fmha_dsl.kernels.abis`) with the entry's constexprs on torch CPU tensors.  ``TRITON_INTERPRET=1`` must be set
before triton is first imported.  bf16 dots are done in fp32 (the interpreter's bf16 ``tl.dot`` is broken,
triton-lang/triton#11584).
"""

from __future__ import annotations

import os
from importlib import import_module

from fmha_dsl.errors import UsageError, error
from fmha_dsl.kernels.abis import abi_of

# torch's names of the ABI's element types (a NULL pointer argument becomes a one-element tensor of its type)
TORCH_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "i32": "int32", "i64": "int64"}


class InterpretKernel:
    kind = "interpret"
    needs_objects = True  # plans pass the tensors themselves in the pointer slots

    def __init__(self, entry):
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise error("runtime.interpret", "launcher='interpret' needs TRITON_INTERPRET=1 before triton is imported",
                        None, "export TRITON_INTERPRET=1 (tests run this in a subprocess)", cls=UsageError)
        self.entry = entry
        kabi = abi_of(entry.sig["family"])
        tmpl = import_module(f"fmha_dsl.kernels.{kabi.template}")
        self._kernel = getattr(tmpl, kabi.function)
        self._const = tmpl.constexprs(entry.sig, entry.alg)
        if entry.sig["dtype"] == "bf16" and "UPCAST_DOT" in self._const:
            self._const["UPCAST_DOT"] = True
        if entry.sig["family"].startswith("bwd") and self._const.get("TMA"):
            self._const["TMA"] = 1  # descriptor loads; the interpreter has no descriptor reductions
        self._pointers = tuple((i, t[1:]) for i, t in enumerate(kabi.types(entry.sig["dtype"])) if t.startswith("*"))

    def launch(self, grid, args, stream=0) -> None:
        import torch

        args = list(args)
        for i, elem in self._pointers:
            if args[i] is None or isinstance(args[i], int):
                args[i] = torch.zeros(1, dtype=getattr(torch, TORCH_NAMES[elem]))
        self._kernel[tuple(grid)](*args, **self._const)


__all__ = ["InterpretKernel", "TORCH_NAMES"]
