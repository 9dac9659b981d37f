"""[expand] Declarations -> kernel keys, under the arch rules.

For each declaration, arch and family, the engine walks the family's fields depth-first
(:func:`fmha_dsl.rules.base.search`): a wildcard takes every value of the family's domain, an
explicit setter its listed values, an unset field its default.  Every rule is checked as soon as
the fields it reads are bound.  When a rule fails on values the user asked for explicitly, that is
an error located at the setter; when a wildcard produced the value, the branch is dropped and
counted per rule (``fmha-dsl explain``).  Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from . import arch as arch_table
from . import vocab as V
from .declare import Declaration
from .errors import Diagnostic, RuleError, Span
from .expand_hints import (backend_note, loosened, nine_value_tile, nonempty_without_profile, nothing_to_build,
                           unsupported_hint, unused_alternatives)
from .expand_tiles import _explicit_tiles, _missed_tiles_hint, _tile_candidates
from .expr import where_rule
from .fields import ALG_KEYS, SIG_KEYS
from .keyfields import KeyFields
from .knobs import max_kernels
from .rules import family_rules
from .rules.base import FACTORY, Rule, Tile, TooMany, schedule, search
from .rules.ck_common import common_rules

ALL_ARCHS = {b: arch_table.backend_archs(b) for b in V.BACKENDS}   # what `arch(*)` means per backend
_DEFAULTS = {**V.SIG_DEFAULTS, **V.ALG_DEFAULTS}


class Kernel(KeyFields):
    """One expanded kernel: its key fields, CK instance name and where it was declared."""

    __slots__ = ("name", "source", "decl", "backend")

    def __init__(self, sig: dict, alg: dict, arch: str, name: str, source: str, decl: str, backend: str = "ck"):
        super().__init__(sig, alg, arch)
        self.name, self.source, self.decl, self.backend = name, source, decl, backend

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {self.arch})"


@dataclass
class Report:
    """What expansion did, for ``explain`` and ``--verbose``."""

    kernels: list[Kernel] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)          # rule id -> pruned candidates
    per_decl: dict = field(default_factory=dict)               # decl label -> {arch: count}
    notes: list[Diagnostic] = field(default_factory=list)      # warnings (unsupported family on an arch ...)
    rule_text: dict = field(default_factory=dict)              # rule id -> a sample message
    decl_dropped: dict = field(default_factory=dict)           # decl label -> {rule id: pruned candidates}
    errors: list[Diagnostic] = field(default_factory=list)     # with keep_going: what expansion would raise


class _Expander:
    def __init__(self, decl: Declaration, report: Report, archs, profile, backend=None, max_errors=20):
        self.decl = decl
        self.backend = backend or decl.backend
        self.report = report
        self.archs = archs
        self.profile = profile
        self.errors: list[Diagnostic] = []
        self.seen_err: set = set()
        self.max_errors = max_errors
        self.where = tuple(where_rule(w, i) for i, w in enumerate(decl.wheres))
        self.explicit_tiles = None if decl.tile.wild else _explicit_tiles(decl)
        self._explicit_rules: dict = {}
        self.missed_tiles: dict = {}  # (arch, hdim) -> what the tile table offers for the declared dims
        self.most: int | None = None  # kernels past which the walk stops (None: FMHA_DSL_MAX_KERNELS)
        self.made: set = set()        # identifiers expanded so far (two mask values of one kernel give one key)

    # which dependencies of a failing rule were asked for explicitly
    def _is_explicit(self, dep: str) -> bool:
        if dep == "tile":
            return not self.decl.tile.wild
        if dep in ("arch", "factory"):
            return self.decl.archs.values is not None
        if dep in ("receipt", "mask_impl"):
            return True
        fs = self.decl.fields.get(dep)
        return fs is None or fs.values is not None

    def _span_for(self, rule: Rule) -> Span:
        env = [d for d in rule.deps if d in ("arch", "factory")]
        order = ([rule.blame] if rule.blame else []) + [d for d in reversed(rule.deps) if d not in env] + env
        for dep in order:
            if dep == "tile":
                sp = next((s for s in self.decl.tile.spans.values() if s is not None), None)
                if sp:
                    return sp
                continue
            if dep in ("arch", "factory"):
                if self.decl.archs.explicit:
                    return self.decl.archs.span
                continue
            fs = self.decl.fields.get(dep)
            if fs is not None and fs.span is not None:
                return fs.span
        return self.decl.span

    def on_fail(self, rule: Rule, b: dict, fld: str):
        self.report.dropped[rule.id] += 1
        if rule.id not in self.report.rule_text:
            self.report.rule_text[rule.id] = _safe_text(rule, b)
        if rule.filter or len(self.errors) >= self.max_errors:
            return
        explicit = self._explicit_rules.get(rule)
        if explicit is None:  # a property of the declaration and the rule, not of the values
            explicit = self._explicit_rules[rule] = all(self._is_explicit(d) for d in rule.deps)
        if explicit:
            sp = self._span_for(rule)
            text = _safe_text(rule, b)
            key = (rule.id, sp.line if sp else 0, sp.column if sp else 0, text)
            if key in self.seen_err:
                return
            self.seen_err.add(key)
            notes = (f"while expanding `{self.decl.label}` for {b.get('arch')}, family {b.get('family')}",)
            self.errors.append(Diagnostic(rule.id, text, sp, rule.help(b), notes))

    def run(self) -> list[Kernel]:
        d = self.decl
        fam_spec = d.fields.get("family")
        families = fam_spec.values if fam_spec and fam_spec.values is not None else (
            tuple(f for f in V.FAMILIES if family_rules(f, self.backend)) if fam_spec else ("fwd",))
        archs = self.archs
        receipt = V.PROFILES[self.profile]
        out: list[Kernel] = []
        counts: dict = {}
        unsupported: list[str] = []
        no_backend: list[str] = []  # families this backend does not implement (no arch helps)
        tried = 0
        before = Counter(self.report.dropped)
        for arch in archs:
            n_arch = 0
            for family in families:
                fr = family_rules(family, self.backend)
                reason = (fr.supported(arch) if fr is not None else
                          f"{family} has no {self.backend} kernels (the {self.backend} backend implements "
                          f"{', '.join(f for f in V.FAMILIES if family_rules(f, self.backend))})")
                if reason:
                    unsupported.append(reason)
                    if fr is None:
                        no_backend.append(family)
                    continue
                tried += 1
                try:
                    n_arch += self._expand_one(fr, arch, receipt, out)
                except TooManyKernels:  # explain's row shows what was counted before the walk stopped
                    self.report.per_decl[d.label] = dict(counts, **{arch: n_arch})
                    raise
            counts[arch] = n_arch
        self.report.per_decl[d.label] = counts
        for reason in dict.fromkeys(unsupported):
            self.report.notes.append(Diagnostic("arch.family-unsupported", reason, d.span, None, (), "warning"))
        if self.errors:
            raise RuleError(self.errors)
        if not out:
            if tried == 0:
                # every requested (arch, family) is unsupported: an error only if both were named
                # explicitly; with `arch(*)` or a narrowing --arch it stays a warning
                if d.archs.values is not None and self.archs == d.archs.values:
                    msg = f"declaration `{d.label}` expands to no kernel: " + "; ".join(dict.fromkeys(unsupported))
                    raise RuleError(Diagnostic("decl.unsupported", msg, d.span, unsupported_hint(self, no_backend)))
                return out
            mine = self.report.dropped - before
            if any(rid.startswith("receipt.") for rid in mine) and nonempty_without_profile(self):
                # the profile leaves nothing of this declaration (upstream lists nothing either)
                self.report.notes.append(Diagnostic(
                    "profile.empty", f"profile {self.profile} leaves no kernel of `{d.label}`", d.span,
                    None, (), "warning"))
                return out
            top = [r for r, _ in mine.most_common(3)]
            loose = loosened(self) if self.most is None else []   # (not in a probe: they would recurse)
            hint = ((f"it gives kernels with {' or with '.join(loose)}; " if loose else "")
                    + "the rules that dropped most: " + ", ".join(f"`{r}`" for r in top)
                    + f"; `fmha-dsl explain {d.display or d.path or 'FILE'}` counts what each rule dropped"
                    ) if top else "check the declaration's fields"
            if not top and self.missed_tiles:
                hint = _missed_tiles_hint(self.missed_tiles)
            raise RuleError(Diagnostic("decl.empty", f"declaration `{d.label}` expands to no kernel", d.span, hint))
        return out

    def gives_kernels(self, decl: Declaration, profile: str | None = None) -> bool:
        """Whether ``decl`` (this declaration, changed) gives a kernel on these archs under ``profile`` (None: this
        expansion's): a walk that stops at the first kernel, and looks for no hint of its own if it finds none."""
        probe = _Expander(decl, Report(), self.archs, profile or self.profile, self.backend)
        probe.most = 0
        try:
            return bool(probe.run())
        except TooManyKernels:
            return True
        except RuleError:
            return False

    def _expand_one(self, fr, arch, receipt, out) -> int:
        d = self.decl
        env = {"arch": arch, "factory": FACTORY[arch], "receipt": receipt, "mask_impl": d.mask_impl,
               "family": fr.family, "backend": self.backend}
        fixed_rules: list[Rule] = []
        # fields the family does not vary: its fixed value or CK's default; an explicit request for
        # another value is an error
        free = tuple(f for f in FREE_FIELDS if f in d.fields and f not in fr.fields)
        for name in _SIG_AND_ALG_FIELDS:
            if name in fr.fields or name in free:
                continue
            value = fr.fixed.get(name, _DEFAULTS.get(name))
            env[name] = value
            fs = d.fields.get(name)
            if fs is not None and fs.values is not None and fs.values != (value,):
                fixed_rules.append(_fixed_rule(fr.family, name, value, fs.values))
        tile_c = _tile_candidates(d, self.explicit_tiles, self.missed_tiles)
        if d.tile.tile_len == 9 and fr.family != "bwd_dq_dk_dv" and "tile" in fr.fields:
            nine_value_tile(self, fr.family)
            return 0

        def candidates(f, b):
            if f == "tile":
                return tile_c(fr, b)
            fs = d.fields.get(f)
            if fs is None:
                if f in fr.defaults:
                    return (fr.defaults[f],)
                return (_DEFAULTS[f],) if f in _DEFAULTS else fr.domain(f, b)
            if fs.values is None:
                dom = fr.domain(f, b)
                return [v for v in dom if fs.match(v)] if fs.match else dom
            return fs.values

        ck_only = common_rules(fr.family, fr.fields) if self.backend == "ck" else ()
        rules = tuple(fixed_rules) + fr.rules + ck_only + self.where
        fields = fr.fields + free
        plan = schedule(fields, rules)
        n = 0
        src = f"{d.display or d.path or '<input>'}:{d.span.line}"
        label = d.label
        most = max_kernels() if self.most is None else self.most
        too_many = TooManyKernels(Diagnostic(
            "decl.too-many", f"declaration `{label}` expands to more than {most:,} kernels ({arch}, "
            f"{fr.family}, {self.backend} backend, and counting)", d.span,
            "narrow its wildcards (a tile, a pipeline, padding), name fewer targets with --arch, or raise "
            "FMHA_DSL_MAX_KERNELS"))
        try:  # (the walk stops past the limit: a runaway wildcard costs a bounded time and memory; the bindings of
            # one kernel -- the mask values its name does not tell apart, at most 3 -- are counted once below)
            found = search(fields, candidates, plan, env, self.on_fail, 3 * (most - len(out)))
        except TooMany:
            raise too_many from None
        for b in found:
            name = fr.ck_name(b)
            if b.get("mask") not in (None, "no", "top_left") and fr.ck_name({**b, "mask": "top_left"}) == name:
                b["mask"] = "top_left"   # one compiled kernel serves every corner its name does: one key
            sig, alg = _fields(b)  # rewrites b's tile entry: name it first
            k = Kernel(sig, alg, arch, name, src, label, self.backend)
            if k.identifier not in self.made:
                self.made.add(k.identifier)
                out.append(k)
                n += 1
        if len(out) > most:
            raise too_many
        return n


class TooManyKernels(RuleError):
    """A declaration expands to more kernels than the limit (``decl.too-many``)."""


_SIG_AND_ALG_FIELDS = tuple(V.SIG_DEFAULTS) + tuple(V.ALG_DEFAULTS) + ("tile",)
# Dispatcher hints every family accepts with any value: they change selection, not the kernel code.
FREE_FIELDS = ("hdim_q_alignment", "hdim_v_alignment", "num_wave_groups", "max_splits_log2", "selection_rank",
               "constraint")


def _fixed_rule(family, name, value, asked) -> Rule:
    shown = ", ".join(str(a) for a in asked)
    return Rule(id="family.fixed-field", deps=(),
                check=lambda b: False,
                message=lambda b, m=f"{family} kernels have no `{name}` choice: it is always {value!r} "
                f"(asked for {shown})": m,
                hint=f"drop `{name}(...)` from this declaration, or use `*`", blame=name)


def _safe_text(rule: Rule, b: dict) -> str:
    try:
        return rule.text(b)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError):
        return rule.id


_SIG_ORDER = tuple(sorted(SIG_KEYS))   # field dicts are built in sorted order: JSON needs no re-sorting
_ALG_ORDER = tuple(sorted(ALG_KEYS))


def _fields(b: dict) -> tuple[dict, dict]:
    """Signature and algorithm fields of one binding.  Every field is bound (varied, fixed or
    default), so keys are later built without re-validation; tests re-validate samples."""
    t: Tile = b["tile"]
    hq, hv = b["hdim"]
    b["hdim_q"], b["hdim_v"] = hq, hv
    b["wave"], b["warp"], b["block_per_cu"], b["max_seq_len_q"] = t.wave, t.warp, t.block_per_cu, t.max_seq_len_q
    b["tile"] = t.tile
    alg = {k: b[k] for k in _ALG_ORDER}
    # CK's auto_fill: an unset (<= 0) head-dim alignment is the tile's k0max (the padded head dim it loads); a
    # 1-d stage's tile (the backward's dot_do_o / convert_dq on Triton: (m0, n0)) has none: 0, as CK's zeros
    k0max = t.tile[5] if len(t.tile) > 5 else 0
    if alg["hdim_q_alignment"] <= 0:
        alg["hdim_q_alignment"] = k0max
    if alg["hdim_v_alignment"] <= 0:
        alg["hdim_v_alignment"] = k0max
    return {k: b[k] for k in _SIG_ORDER}, alg


def resolve_archs(decl: Declaration, override: tuple[str, ...] | None, backend: str | None = None) -> tuple[str, ...]:
    """The archs one declaration expands for (the set's list, narrowed by ``--arch``)."""
    declared = decl.archs.values
    if declared is None:
        declared = ALL_ARCHS[backend or decl.backend]
    if override is None:
        return declared
    return tuple(a for a in override if a in declared)


@dataclass
class DeclResult:
    """What one declaration expanded to (a unit of work a process pool can run)."""

    report: Report
    errors: list
    skipped: bool


def expand_decl(decl: Declaration, archs: tuple[str, ...] | None, profile: str | None,
                backend: str | None = None) -> DeclResult:
    report = Report()
    mine = resolve_archs(decl, archs, backend)
    if not mine:  # --arch names none of this declaration's archs: not asked for here
        report.per_decl[decl.label] = {}
        return DeclResult(report, [], True)
    try:
        report.kernels.extend(_Expander(decl, report, mine, profile or decl.profile.values[0], backend).run())
    except RuleError as exc:
        return DeclResult(report, list(exc.diagnostics), False)
    if set(mine) == set(resolve_archs(decl, None, backend)):   # (with --arch narrowing, another arch may use it)
        report.notes.extend(unused_alternatives(decl, report.kernels))
    return DeclResult(report, [], False)


def merge(results: list[DeclResult], decls, archs, backend: str | None = None, keep_going: bool = False) -> Report:
    """Combine per-declaration results in declaration order; raise the errors they found (with ``keep_going``,
    keep them in ``Report.errors`` instead: ``explain`` shows the counts of a declaration that fails)."""
    report = Report()
    errors: list[Diagnostic] = []
    for r, d in zip(results, decls):
        report.kernels.extend(r.report.kernels)
        report.dropped.update(r.report.dropped)
        for label, counts in r.report.per_decl.items():
            if label in report.per_decl:  # two `kernel x` (or two sets `a` across includes): each its own row
                label = f"{label} ({d.display or d.path or '<input>'}:{d.span.line})"
            report.per_decl[label] = counts
            report.decl_dropped[label] = dict(sorted(r.report.dropped.items(), key=lambda t: (-t[1], t[0])))
        report.notes.extend(r.report.notes)
        for k, v in r.report.rule_text.items():
            report.rule_text.setdefault(k, v)
        errors.extend(r.errors)
    if results and all(r.skipped for r in results):
        d = decls[0]
        mine = ", ".join(resolve_archs(d, None, backend))
        why = (f"is declared for {mine}" if d.archs.explicit else
               f"declares no arch, so it is for {mine} only (the default)")
        wanted = " | ".join(archs)
        raise RuleError(Diagnostic(
            "arch.not-declared", f"no declaration is for {', '.join(archs)}: `{d.label}` {why}", d.archs.span,
            f"--arch only picks among the archs a set declares: add `arch({wanted})` to the set (or `arch(*)` for "
            "every arch of its backend)" + backend_note(archs, backend or d.backend)))
    declared = {a for d in decls for a in resolve_archs(d, None, backend)}
    missing = [a for a in (archs or ()) if a not in declared]
    if results and missing:   # (some of the archs asked for: each one no declaration is for is left out unseen)
        d = next(d for d in decls if d.archs.explicit) if any(d.archs.explicit for d in decls) else decls[0]
        raise RuleError(Diagnostic(
            "arch.not-declared", f"no declaration is for {', '.join(missing)} (of --arch {','.join(archs)}): the set "
            f"declares {', '.join(sorted(declared))}", d.archs.span,
            f"add `arch({' | '.join(missing)})` to the set (or `arch(*)` for every arch of its backend), or leave "
            f"{', '.join(missing)} out of --arch" + backend_note(missing, backend or d.backend)))
    if errors and keep_going:
        report.errors = errors
    elif errors:
        raise RuleError(errors)
    return report


def expand(decls, archs: tuple[str, ...] | None = None, profile: str | None = None,
           backend: str | None = None, keep_going: bool = False) -> Report:
    """Expand declarations into kernels.  Raises :class:`RuleError` for explicit invalid requests and empty
    declarations; with ``keep_going``, returns them in ``Report.errors`` with the counts of every declaration.

    ``backend`` overrides the declarations' own ``backend(...)`` (CLI ``--backend``).
    """
    return merge([expand_decl(d, archs, profile, backend) for d in decls], decls, archs, backend, keep_going)


__all__ = ["Kernel", "Report", "DeclResult", "expand", "expand_decl", "merge", "resolve_archs",
           "ALL_ARCHS", "nothing_to_build"]
