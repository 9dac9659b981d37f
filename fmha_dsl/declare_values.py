"""[declare] Setter arguments -> canonical values (aliases resolved, types and ranges checked), with every
problem collected as a located diagnostic (:class:`_Collector`) so one run reports all of a file's errors.
"""

from __future__ import annotations

from . import ast as A
from . import vocab as V
from .declaration import WILD
from .errors import Diagnostic, ParseError, did_you_mean

class _Collector:
    """Collects diagnostics so one run reports every setter error of a file."""

    def __init__(self):
        self.diags: list[Diagnostic] = []

    _DEFAULT_HINTS = {
        "value.range": "see `fmha-dsl schema setters` for what each setter takes",
        "value.type": "see `fmha-dsl schema setters` for what each setter takes",
        "value.wild-mixed": "write either `*` or a list of values, not both",
        "setter.keyword": "see `fmha-dsl schema setters` for the parameter names",
        "setter.arity": "see `fmha-dsl schema setters` for the parameters",
        "set.empty": "add `kernel { signature { ... } algorithm { ... } }` or `.add(...)`",
    }

    def err(self, rule, msg, span, hint=None):
        self.diags.append(Diagnostic(rule, msg, span, hint or self._DEFAULT_HINTS.get(rule)))

    def raise_if_any(self):
        if self.diags:
            raise ParseError(self.diags)


# ---- values ------------------------------------------------------------------------------------
def _enum_value(c: _Collector, fld: str, v: A.Value):
    if v.kind == "wild":
        return WILD
    if v.kind not in ("name", "str"):
        c.err("value.type", f"`{fld}` takes a name, got {_show(v)}", v.span,
              f"one of: {', '.join(sorted(set(V.ALIASES[fld].values())))}")
        return None
    table = V.ALIASES[fld]
    key = str(v.value)
    if key in table:
        return table[key]
    low = key.lower()
    if low in table:
        return table[low]
    hint = did_you_mean(key, table.keys()) or f"one of: {', '.join(sorted(set(table.values())))}"
    c.err("value.unknown", f"unknown {fld} `{key}`", v.span, hint)
    return None


def _bool_value(c, fld, v: A.Value):
    if v.kind == "wild":
        return WILD
    if v.kind == "bool":
        return v.value
    if v.kind == "int" and v.value in (0, 1):
        return bool(v.value)
    if v.kind in ("name", "str") and str(v.value).lower() in ("t", "f", "true", "false", "yes", "no", "on", "off"):
        return str(v.value).lower() in ("t", "true", "yes", "on")
    c.err("value.type", f"`{fld}` takes true or false, got {_show(v)}", v.span, "write true, false or *")
    return None


def _pad_value(c, fld, v: A.Value):
    if v.kind == "int" and v.value in (0, 1, 8):
        return v.value
    b = _bool_value(c, fld, v) if not (v.kind == "int") else None
    if v.kind == "int":
        c.err("value.range", f"`{fld}` takes true, false or 8 (pad to a multiple of 8), got {v.value}", v.span,
              "write true, false, 8 or *")
        return None
    if b is None or b == WILD:
        return b
    return 1 if b else 0


def _int_value(c, fld, v: A.Value, lo=None):
    if v.kind == "wild":
        return WILD
    if v.kind != "int":
        c.err("value.type", f"`{fld}` takes an integer, got {_show(v)}", v.span)
        return None
    if lo is not None and v.value < lo:
        c.err("value.range", f"`{fld}` must be >= {lo}, got {v.value}", v.span)
        return None
    if not -(1 << 31) <= v.value < 1 << 31:  # every integer field is a 32-bit one in the kernels and CK's tables
        c.err("value.range", f"`{fld}` must fit in 32 bits (-2,147,483,648 to 2,147,483,647), got {v.value}", v.span)
        return None
    return v.value


def _show(v: A.Value) -> str:
    """A value as the user wrote it (the .fmha spelling: `true`, `(a, b)`, `[a, b]`)."""
    if v.kind == "str":
        return f'"{v.value}"'
    if v.kind == "bool":
        return "`true`" if v.value else "`false`"
    if v.kind in ("tuple", "list"):
        text = _spelling(v)
        return f"the {v.kind} `{text}`" if len(text) <= 60 else f"a {v.kind}"
    return f"`{v.value}`"


def _spelling(v: A.Value) -> str:
    """A value as .fmha text, nested values included (no quoting around the whole)."""
    if v.kind == "str":
        return '"' + str(v.value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if v.kind == "bool":
        return "true" if v.value else "false"
    if v.kind == "wild":
        return "*"
    if v.kind in ("tuple", "list"):
        inner = ", ".join(" | ".join(_spelling(o) for o in a.options) for a in v.value)
        return f"({inner})" if v.kind == "tuple" else f"[{inner}]"
    return str(v.value)


def _flatten(alt: A.Alt) -> list[A.Value]:
    """`a | [b, c]` -> [a, b, c] (lists are alternatives too); tuples stay whole."""
    out = []
    for v in alt.options:
        if v.kind == "list":
            for sub in v.value:
                out.extend(_flatten(sub))
        else:
            out.append(v)
    return out


def _empty_lists(alt: A.Alt) -> list[A.Value]:
    """The empty lists ``[]`` among ``alt``'s alternatives (nested lists included)."""
    out, todo = [], list(alt.options)
    while todo:
        v = todo.pop()
        if v.kind == "list":
            if not v.value:
                out.append(v)
            todo.extend(o for sub in v.value for o in sub.options)
    return out


def _values(c, alt: A.Alt, conv) -> tuple | None | bool:
    """Alternatives -> tuple of canonical values, None for a wildcard, False on error."""
    vals, wild, bad = [], False, False
    for v in _flatten(alt):
        if v.kind == "wild":
            wild = True
            continue
        r = conv(v)
        if r is None:
            bad = True
        elif r == WILD:
            wild = True
        else:
            if r not in vals:
                vals.append(r)
    if bad:
        return False
    if wild:
        if vals:
            c.err("value.wild-mixed", "`*` already means every value; drop the other alternatives", alt.span)
            return False
        return None
    return tuple(vals)
