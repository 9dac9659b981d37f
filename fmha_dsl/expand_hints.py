"""[expand] What an expansion that gives nothing says: the hints of ``decl.unsupported`` (another backend or arch),
``decl.empty`` (which written value to loosen, found by probing the declaration with it made ``*``),
``arch.not-declared``, ``build.empty`` and ``tile.length`` (a nine-value tile on a family of six).  Used by
:mod:`fmha_dsl.expand` only when it has something to say."""

from __future__ import annotations

import dataclasses
import re

from . import arch as arch_table
from . import vocab as V
from .declare import FieldSpec
from .errors import Diagnostic, RuleError
from .rules import family_rules


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
    foreign = [a for a in ex.archs if a not in arch_table.backend_archs(ex.backend)]
    if foreign and ex.decl.backend != ex.backend:   # --backend overrode what the set declares
        return f"--backend {ex.backend} overrides the set's backend({ex.decl.backend}), and {', '.join(foreign)} " \
               f"{'is' if len(foreign) == 1 else 'are'} not a {ex.backend} target: drop --backend"
    other = foreign and _backend_of(foreign, ex.backend)
    if other:   # the arch is not the backend's at all (CK on an NVIDIA arch)
        return f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} not a {ex.backend} target: add " \
               f"`backend({other})`, or pick one of {', '.join(arch_table.backend_archs(ex.backend))}"
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


def nine_value_tile(ex, family: str) -> None:
    """A nine-value tile is bwd_dq_dk_dv's: for ``family`` (another) it is an error -- a warning when the
    declaration names bwd_dq_dk_dv too, nothing under ``family(*)`` (any wildcard's values a rule drops) --
    said once, at the seventh value."""
    d = ex.decl
    fams = d.fields.get("family")
    named = fams.values if fams is not None else ("fwd",)
    if named is None:
        return
    sp = d.tile.spans.get("tile6") or d.span
    beside = "bwd_dq_dk_dv" in named
    key = ("tile.length", family) if beside else ("tile.length", sp.line, sp.column)
    if key in ex.seen_err:
        return
    ex.seen_err.add(key)
    if beside:
        ex.report.notes.append(Diagnostic(
            "tile.length", f"{family} takes no tile of 9 values (only bwd_dq_dk_dv does): this declaration "
            "gives it no kernel", sp, "declare the other families with a tile of their own", (), "warning"))
    else:
        ex.errors.append(Diagnostic("tile.length", f"{family} tiles take 6 values (m0, n0, k0, n1, k1, k0max); "
                                      "9 are bwd_dq_dk_dv's", sp, "drop the last three values"))


def backend_note(archs, backend: str) -> str:
    """`; sm90 has no ck kernels: ...` when some of ``archs`` are not targets of ``backend``."""
    foreign = [a for a in archs if a not in arch_table.backend_archs(backend)]
    if not foreign:
        return ""
    other = _backend_of(foreign, backend)
    return (f"; {', '.join(foreign)} {'has' if len(foreign) == 1 else 'have'} no {backend} kernels"
            + (f": add `backend({other})` too" if other else ""))


def _backend_of(archs, besides: str) -> str | None:
    """The backend other than ``besides`` that targets every one of ``archs``, if one does."""
    return next((b for b in V.BACKENDS if b != besides and all(a in arch_table.backend_archs(b) for a in archs)),
                None)


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


def unused_alternatives(decl, kernels) -> list[Diagnostic]:
    """Warnings for values written among alternatives (``tile(32 | 64, ...)``, ``dtype(fp16 | bf16)``) that no kernel
    of the declaration has -- the rules, the tile tables or a where clause allow none with them -- so that a value
    the user wrote never vanishes unseen (a lone written value that gives nothing is ``decl.empty``).  The mask is
    left out (its aliases fold into one key when one kernel serves them), and so is the family (a family an arch or
    a tile's length leaves out has its own warning)."""
    if not kernels:
        return []
    out = []
    for name, fs in sorted(decl.fields.items()):
        if name in ("mask", "family") or not fs.explicit or fs.values is None or len(fs.values) < 2:
            continue
        if name in kernels[0].sig or name in kernels[0].alg:   # (a setter of several fields, e.g. hdim: skipped)
            have = {k.sig[name] if name in k.sig else k.alg[name] for k in kernels}
            out += [_unused(decl, f"`{name}` value {v!r}", fs.span) for v in fs.values if v not in have]
    for dim, values in sorted(decl.tile.dims.items()):   # tile0..., wave0..., warp0..., block_per_cu, ...
        if values is None or len(values) < 2:
            continue
        part, i = re.fullmatch(r"(\D+)(\d*)", dim).groups()
        have = {k.alg.get(part) for k in kernels} if not i else \
            {k.alg[part][int(i)] for k in kernels if int(i) < len(k.alg.get(part) or ())}
        out += [_unused(decl, f"{part}[{i}] = {v}" if i else f"`{part}` value {v!r}", decl.tile.spans.get(dim))
                for v in values if v not in have]
    return out


def _unused(decl, what: str, span) -> Diagnostic:
    return Diagnostic("decl.unused-value", f"`{decl.label}`: {what}, written as an alternative, gives no kernel",
                      span or decl.span, "the rules, the arch's tile tables or a where clause allow no kernel with "
                      "it (`fmha-dsl explain` lists what each rule dropped); drop it, or loosen what excludes it",
                      (), "warning")


__all__ = ["unsupported_hint", "loosened", "nine_value_tile", "nonempty_without_profile", "backend_note",
           "nothing_to_build", "unused_alternatives"]
