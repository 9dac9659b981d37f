"""[rules] Arch rules: one module per CK operation, each defining :class:`FamilyRules` objects.

Modules are imported on first use (no work at import time).  ``family_rules(name)`` returns the
rules of one kernel family; ``FAMILY_MODULES`` says where each lives.
"""

from __future__ import annotations

import functools
import importlib

from .base import FACTORY, FamilyRules, Rule, Tile

FAMILY_MODULES = {
    "fwd": "ck_fwd",
    "fwd_splitkv": "ck_splitkv",
    "fwd_splitkv_combine": "ck_splitkv",
    "fwd_appendkv": "ck_appendkv",
    "fwd_pagedkv": "ck_pagedkv",
    "batch_prefill": "ck_batch_prefill",
    "bwd_dot_do_o": "ck_bwd",
    "bwd_dq_dk_dv": "ck_bwd",
    "bwd_convert_dq": "ck_bwd",
}


# the Triton backend implements the forward, backward and serving families (templates in fmha_dsl/kernels/)
TRITON_MODULES = {"fwd": "triton_fwd", "fwd_splitkv": "triton_fwd", "bwd_dq_dk_dv": "triton_bwd",
                  "bwd_dot_do_o": "triton_bwd", "bwd_convert_dq": "triton_bwd", "batch_prefill": "triton_paged",
                  "fwd_pagedkv": "triton_paged", "fwd_appendkv": "triton_paged"}


def backend_modules(backend: str) -> dict:
    return TRITON_MODULES if backend == "triton" else FAMILY_MODULES


@functools.lru_cache(maxsize=None)
def family_rules(family: str, backend: str = "ck") -> FamilyRules | None:
    """Rules of one family for one backend, or None if that backend has no such family."""
    mod = backend_modules(backend).get(family)
    if mod is None:
        return None
    return importlib.import_module(f"{__name__}.{mod}").FAMILIES[family]


__all__ = ["FamilyRules", "Rule", "Tile", "FACTORY", "FAMILY_MODULES", "TRITON_MODULES", "backend_modules", "family_rules"]
