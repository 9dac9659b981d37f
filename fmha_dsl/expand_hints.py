"""[expand] What an expansion that gives nothing says: the hints of ``decl.unsupported`` (another backend or arch),
``decl.empty`` (which written value to loosen, found by probing the declaration with it made ``*``),
``arch.not-declared`` and ``build.empty``.  Used by :mod:`fmha_dsl.expand` only when it has an error to raise."""

from __future__ import annotations

import dataclasses

from . import arch as arch_table
from . import vocab as V
from .declare import FieldSpec
from .errors import Diagnostic, RuleError
from .rules import family_rules


def _archs_of(backend: str) -> tuple[str, ...]:
    return arch_table.backend_archs(backend)


def unsupported_hint(ex, no_backend: list[str]) -> str:
    """``decl.unsupported``'s hint: the backend that has the families, or the arch's own backend."""
    if no_backend:  # the backend is the cause, not the arch
        has = [f for f in V.FAMILIES if family_rules(f, ex.backend)]
        others = [b for b in V.BACKENDS if b != ex.backend  # one that has them on one of these archs
                  and all(family_rules(f, b) and any(family_rules(f, b).supported(a) is None for a in ex.archs)
                          for f in dict.fromkeys(no_backend))]
        alt = f", or backend({others[0]}) for {', '.join(dict.fromkeys(no_backend))}" if others else ""
        return (f"the {ex.backend} backend implements {', '.join(has)} only: use family("
                f"{' | '.join(has)}){alt}")
    foreign = [a for a in ex.archs if a not in _archs_of(ex.backend)]
    other = next((b for b in V.BACKENDS if b != ex.backend and foreign
                  and all(a in _archs_of(b) for a in foreign)), None)
    if other:   # the arch is not the backend's at all (CK on an NVIDIA arch)
        return f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not a {ex.backend} target: add " \
               f"`backend({other})`, or pick one of {', '.join(_archs_of(ex.backend))}"
    return "pick an arch that supports this family, or use `arch(*)`"


def loosened(ex) -> list[str]:
    """What leaves this (empty) declaration empty: each setter value it names (but its family) made `*`, and
    each where clause dropped, that alone would give it kernels -- e.g. ``[`qscale(*)`]``.  (The walks stop at
    the first kernel: a few milliseconds each.)"""
    d = ex.decl
    tries = [(f"`{name}(*)`", dataclasses.replace(d, fields={**d.fields, name: FieldSpec(None, fs.span,
                                                                                       explicit=False)}))
             for name, fs in sorted(d.fields.items()) if name != "family" and fs.values is not None and fs.explicit]
    tries += [(f"no `where` on line {w.span.line}", dataclasses.replace(d, wheres=d.wheres[:i] + d.wheres[i + 1:]))
              for i, w in enumerate(d.wheres)]
    return [what for what, loose in tries[:12] if ex.gives_kernels(loose)]


def nonempty_without_profile(ex) -> bool:
    """Would this declaration give kernels if no receipt filtered them?  (Only asked when empty: the walk stops
    at the first kernel.)"""
    return ex.gives_kernels(ex.decl, "all")


def backend_note(archs, backend: str) -> str:
    """`; sm90 has no ck kernels: ...` when some of ``archs`` are not targets of ``backend``."""
    foreign = [a for a in archs if a not in _archs_of(backend)]
    if not foreign:
        return ""
    other = next((b for b in V.BACKENDS if b != backend and all(a in _archs_of(b) for a in foreign)), None)
    return (f"; {', '.join(foreign)} {'has' if len(foreign) == 1 else 'have'} no {backend} kernels"
            + (f": add `backend({other})` too" if other else ""))


def nothing_to_build(kernel_set, report, archs) -> RuleError:
    """The error of a build that expands to no kernel (no registry is written: an empty one would dispatch
    nothing, silently).  The warnings that explain why (a family an arch lacks, a profile that leaves
    nothing) become its notes."""
    where = f" for {', '.join(archs)}" if archs else ""
    notes = [d.message for d in report.notes]
    return RuleError(Diagnostic(
        "build.empty", f"nothing to build: kernel set `{kernel_set.name}` expands to no kernel{where}", None,
        ("the notes say why; " if notes else "") + f"`fmha-dsl explain {kernel_set.path or 'FILE'}` shows what "
        "each rule dropped; "
        "another --arch, --profile or declaration may give kernels", tuple(dict.fromkeys(notes))))


__all__ = ["unsupported_hint", "loosened", "nonempty_without_profile", "backend_note", "nothing_to_build"]
