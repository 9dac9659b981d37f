"""Every fact about a target GPU, from one table: ``fmha_dsl/data/archs.json`` (each figure with its source).

    from fmha_dsl import arch
    arch.names()                  # ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201", "sm80", "sm90")
    arch.info("sm90")             # {"vendor": "nvidia", "warp_size": 32, "binary": "cubin", ...}
    arch.backend_archs("ck")      # what ``arch(*)`` means for a backend (CK is AMD only)
    arch.factories()["gfx942"]    # "gfx9": CK's arch trait, the unit upstream's tile tables are keyed by
    arch.of_capability(9)         # "sm90": the arch of an NVIDIA device of that compute-capability major

The table's fields are listed in its ``_fields`` entry.  Adding an arch means one entry there (plus, for the CK
backend, CK's own tile tables under ``data/ck_*.json``).  ``fmha_arch_specs.json`` is CK's upstream copy of its
per-arch pipeline lists and tile limits; only CK's rules read it.

The table is read on first use and cached; its values must not be modified (the dicts are shared).
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def _table() -> dict:
    from .data import load

    return load("archs")["archs"]


@functools.lru_cache(maxsize=None)
def names() -> tuple[str, ...]:
    """Every arch fmha-dsl knows, in the table's order (AMD first)."""
    return tuple(_table())


def info(arch: str) -> dict:
    """The facts of ``arch`` (``KeyError`` for an unknown arch; :func:`get` gives ``{}`` instead)."""
    return _table()[arch]


def get(arch: str | None) -> dict:
    """The facts of ``arch``, or ``{}`` when it is None or unknown."""
    return _table().get(arch, {}) if arch else {}


@functools.lru_cache(maxsize=None)
def backend_archs(backend: str) -> tuple[str, ...]:
    """The archs a backend's rules target (what ``arch(*)`` means under ``backend(...)``)."""
    return tuple(a for a, d in _table().items() if backend in d["backends"])


@functools.lru_cache(maxsize=None)
def vendor_archs(vendor: str) -> tuple[str, ...]:
    return tuple(a for a, d in _table().items() if d["vendor"] == vendor)


@functools.lru_cache(maxsize=None)
def factories() -> dict[str, str]:
    """arch -> CK factory (arch trait).  Treat as read-only."""
    return {a: d["ck_factory"] for a, d in _table().items()}


@functools.lru_cache(maxsize=None)
def by_capability() -> dict[int, str]:
    """NVIDIA compute-capability major -> arch.  Treat as read-only."""
    return {d["capability"]: a for a, d in _table().items() if "capability" in d}


def of_capability(major: int) -> str | None:
    return by_capability().get(int(major))


def warp_size(arch: str | None, default: int = 32) -> int:
    return int(get(arch).get("warp_size", default))


def compute_units(arch: str | None, default: int = 100) -> int:
    """The reference device's CUs/SMs (a measured seqtune table's own count wins where there is one)."""
    return int(get(arch).get("compute_units", default))


__all__ = ["names", "info", "get", "backend_archs", "vendor_archs", "factories", "by_capability", "of_capability",
           "warp_size", "compute_units"]
