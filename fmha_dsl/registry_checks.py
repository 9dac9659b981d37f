"""[registry] What a registry file's parts must say about one another, past its schema (:mod:`.registry_schema`):
an entry's name and build record against its own fields, the head's counts and lists against the kernels, and a
seqtune table against the kernels it measures.  Each is a located :class:`~fmha_dsl.errors.RegistryError`: a
hand edit of one side only, which the schema alone lets through and a launch would act on."""

from __future__ import annotations

import os
import re

from . import vocab as V
from .errors import Diagnostic, RegistryError, Span

__all__ = ["build_problem", "check_summary", "check_table", "own_measurements"]


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def build_problem(e) -> str | None:
    """What is wrong with an entry's name and build record against its own fields: a name that is no safe file
    name (binaries are ``kernels/<arch>/<name>.<kind>``), a binary named for another kernel (two entries' names or
    builds swapped), or a block size other than the tile's (a launch grid from it would leave rows out)."""
    if not _SAFE_NAME.fullmatch(e.name) or ".." in e.name:
        return "its name is not a file name (letters, digits, `_`, `.`, `+`, `-`; no `..`)"
    b = e.build
    if not b:
        return None
    binary = b.get("binary")
    if binary and os.path.basename(binary).rsplit(".", 1)[0] != e.name:
        return f"its binary `{binary}` is named for another kernel (a kernel's binary is `<name>.<kind>`)"
    for field, at in (("block_m", 0), ("block_n", 1)):
        if field in b and b[field] != e.alg["tile"][at]:
            return f"build.{field} is {b[field]} but its tile's is {e.alg['tile'][at]}"
    return None


def check_summary(reg, doc: dict, metadata, path: str | None) -> None:
    """The head's counts and lists say what the kernels say (a hand edit of one side only)."""
    def wrong(what: str, got, want) -> RegistryError:
        return RegistryError(Diagnostic("registry.summary", f"{what} is {got} but the kernels give {want}",
                                        Span(path, 1, 1), "the file was edited by hand; rebuild it (or `Registry."
                                        "load(...).save(...)` writes the head from the kernels)"))

    stats = reg.statistics()
    if doc.get("statistics") != stats:
        bad = next(k for k in sorted(set(stats) | set(doc.get("statistics") or {}))
                   if (doc.get("statistics") or {}).get(k) != stats.get(k))
        raise wrong(f"statistics.{bad}", (doc.get("statistics") or {}).get(bad), stats.get(bad))
    if metadata.archs != reg.archs:
        raise wrong("metadata.archs", metadata.archs, reg.archs)
    unknown = [p for p in metadata.profiles if p not in V.PROFILES]
    if unknown:
        raise RegistryError(Diagnostic("registry.summary", f"metadata.profiles names {unknown[0]!r}, no profile",
                                       Span(path, 1, 1), f"profiles are {', '.join(V.PROFILES)}"))


def check_table(reg, path: str | None) -> None:
    """A seqtune table measures this registry's kernels, each class and point once (a second copy would win
    unseen)."""
    from .seqtune import POINT_FIELDS, class_key

    classes = set()
    for ci, c in enumerate(reg.seqtune.get("classes", [])):
        key = class_key(c["class"])
        where = f"seqtune.classes[{ci}]"
        if key in classes:
            raise RegistryError(Diagnostic("registry.seqtune", f"{where} measures a class listed before it",
                                           Span(path, 1, 1), "keep one entry per class (re-run `fmha-dsl tune`)"))
        classes.add(key)
        points = set()
        for pi, p in enumerate(c.get("points", [])):
            at = tuple(p[f] for f in POINT_FIELDS)
            if at in points:
                raise RegistryError(Diagnostic("registry.seqtune", f"{where}.points[{pi}] measures a point listed "
                                               "before it", Span(path, 1, 1), "keep one entry per point"))
            points.add(at)
            strange = [k for k in (*p.get("times_us", {}), *p.get("failed", {})) if k not in reg]
            if strange:
                raise RegistryError(Diagnostic("registry.seqtune", f"{where}.points[{pi}] times {strange[0]!r}, "
                                               "which is no kernel of this registry", Span(path, 1, 1),
                                               "a table names this registry's kernels by identifier"))


def own_measurements(t: dict | None, ids) -> dict | None:
    """Seqtune table ``t`` as a registry of the kernels ``ids`` writes it: without the measurements of kernels it
    does not hold (a point or class left with none goes too); unchanged, byte for byte, when it names only them (an
    empty table keeps its device, as `fmha-dsl tune` records one)."""
    if not t or all(k in ids for c in t.get("classes", []) for p in c.get("points", [])
                    for part in ("times_us", "failed") for k in p.get(part, {})):
        return t   # (nothing foreign: the table as it is, byte for byte; an empty one keeps its device)
    classes = []
    for c in t.get("classes", []):
        points = []
        for p in c.get("points", []):
            kept = {part: {k: v for k, v in p[part].items() if k in ids}
                    for part in ("times_us", "failed") if part in p}
            if any(kept.values()):
                points.append(dict(p, **kept))
        if points:
            classes.append(dict(c, points=points))
    return dict(t, classes=classes)
