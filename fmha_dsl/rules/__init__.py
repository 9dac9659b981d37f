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


@functools.lru_cache(maxsize=None)
def family_rules(family: str) -> FamilyRules:
    mod = importlib.import_module(f"{__name__}.{FAMILY_MODULES[family]}")
    return mod.FAMILIES[family]


__all__ = ["FamilyRules", "Rule", "Tile", "FACTORY", "FAMILY_MODULES", "family_rules"]
