"""``where`` clauses: a small, safe expression language over key fields.

An expression is compiled once into a tree of Python closures (never ``eval``): names resolve to key
fields (``hdim_q``, ``tile_m0``, ``pipeline``, ``arch`` ...), bare words that are known values
(``qs``, ``causal``) are string literals, and only comparisons, ``in``, ``and/or/not`` and integer
arithmetic exist.  Unknown names and type mismatches are located errors.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable

from . import vocab as V
from .ast import Expr, Where
from .errors import ParseError, did_you_mean, error
from .rules.base import FACTORY, Rule

_TILE_DIMS = {f"tile_{n}": f"tile{i}" for i, n in enumerate(V.TILE_NAMES)}
_TILE_DIMS.update({f"wave_{n}": f"wave{i}" for i, n in enumerate(V.WAVE_NAMES)})
_TILE_DIMS.update({f"warp_{n}": f"warp{i}" for i, n in enumerate(V.WAVE_NAMES)})
_TILE_DIMS.update({"block_per_cu": "block_per_cu", "max_seq_len_q": "max_seq_len_q"})

_BOOL = {"lse", "dropout", "logits", "paged_kv", "fp8_static_quant", "skip", "sink", "dbias", "store_randval",
         "deterministic", "trload", "kv64"}
_STR = {"family", "dtype", "mode", "vlayout", "mask", "bias", "qscale", "rope", "pipeline", "kv_layout",
        "kv_lookup", "arch", "factory"}
_INT = {"hdim_q", "hdim_v", "page_size", "pad_s", "pad_sk", "pad_d", "pad_dv"} | set(_TILE_DIMS)

NAMES = sorted(_BOOL | _STR | _INT)
_KNOWN_WORDS = set()
for _tbl in V.ALIASES.values():
    _KNOWN_WORDS.update(_tbl.values())
_KNOWN_WORDS.update(V.ARCHS)
_KNOWN_WORDS.update(FACTORY.values())   # `factory == gfx9`, bare as the docs allow


def _field_of(name: str) -> str:
    if name in ("hdim_q", "hdim_v"):
        return "hdim"
    if name in _TILE_DIMS:
        return "tile"
    return name


def _getter(name: str) -> Callable[[dict], Any]:
    if name == "hdim_q":
        return lambda b: b["hdim"][0]
    if name == "hdim_v":
        return lambda b: b["hdim"][1]
    if name in _TILE_DIMS:
        key = _TILE_DIMS[name]
        return lambda b: b["tile"].dim(key)
    return lambda b: b[name]


def _type_of(name: str) -> str:
    return "bool" if name in _BOOL else "str" if name in _STR else "int"


@dataclass(frozen=True)
class Compiled:
    fn: Callable[[dict], Any]
    type: str                 # int | str | bool | tuple
    deps: frozenset
    items: tuple = ()         # a tuple's: each item's type


_CMP = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
        ">=": operator.ge}
_BIN = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _canon_word(word: str, field: str | None = None) -> str:
    """A value word in its canonical spelling: by the compared field's alias table when known (``rope ==
    "none"`` is rope's ``none``, not the mask alias), else by the first table that knows it."""
    if field in V.ALIASES:
        return V.ALIASES[field].get(word, word)
    for tbl in V.ALIASES.values():
        if word in tbl:
            return tbl[word]
    return word


def _enum_field(e: Expr) -> str | None:
    """The field a name node reads, when that field takes names from a known list (dtype, mask, pipeline, arch ...)."""
    if e.op == "name" and _known_values(e.args[0]):
        return e.args[0]
    return None


def _known_values(field: str | None) -> tuple[str, ...]:
    """Every spelling ``field`` takes (its aliases included); empty when it is not a field of named values."""
    if field in V.ALIASES:
        return tuple(V.ALIASES[field])
    if field == "arch":
        return tuple(V.ARCHS)
    if field == "factory":
        return tuple(sorted(set(FACTORY.values())))
    return ()


def _value(word: str, field: str | None, e: Expr) -> str:
    """``word`` compared with ``field``: its canonical spelling, or a located error when the field never takes it (a
    typo like ``pipeline != "qrasync"`` would otherwise keep or drop every kernel without a word)."""
    known = _known_values(field)
    if known and word not in known:
        canon = sorted(set(V.ALIASES[field].values())) if field in V.ALIASES else list(known)
        raise error("where.unknown-value", f"`{word}` is not {_a(field)} value", e.span,
                    did_you_mean(word, list(known)) or f"{field} is one of: {', '.join(canon)}", cls=ParseError)
    return _canon_word(word, field)


_PADS = ("pad_s", "pad_sk", "pad_d", "pad_dv")


def _is_pad(*nodes: Expr) -> bool:
    """Padding fields are numbers (0, 1, 8) that setters also take as false/true: `pad_s == true` is fine."""
    return any(n.op == "name" and n.args[0] in _PADS for n in nodes)


def _mismatch_hint(a: Expr, ta: str, b: Expr, tb: str) -> str:
    field, ftype = (a, ta) if a.op == "name" and a.args[0] in NAMES else (b, tb)
    name = field.args[0] if field.op == "name" else None
    if ftype == "bool" and name:
        return f"`{name}` is true or false: write `{name} == true` (or just `{name}`)"
    if ftype == "int" and name:
        return f"`{name}` is a number: compare it with one, e.g. `{name} == 128`"
    if ftype == "str" and name:
        return f"`{name}` is a name: compare it with one, quoted, e.g. `{name} == \"{_example(name)}\"`"
    return "quote names of values, e.g. pipeline == \"qr\""


def _a(type_name: str) -> str:
    return ("an " if type_name[0] in "aeiou" else "a ") + type_name


def _example(name: str) -> str:
    known = {"pipeline": "qr_async", "arch": "gfx942", "factory": "gfx9", "dtype": "bf16", "mask": "top_left"}
    table = V.ALIASES.get(name)
    return known.get(name) or (sorted(set(table.values()))[0] if table else "...")


def _fields_of_setter(name: str) -> list[str]:
    """The where names a setter of several values sets (``hdim`` -> hdim_q, hdim_v; ``padding`` -> pad_s ...), or
    [] for a name that is no such setter."""
    spec = V.SETTERS.get(name)
    if spec is None or len(spec.params) < 2:
        return []
    prefix = {"padding": "pad", "kv_cache": "kv"}.get(name, name)
    out = []
    for p in spec.params:   # (kv_cache's page_size is a field of its own name)
        w = next((w for w in (f"{prefix}_{p}", p) if w in NAMES), None)
        if w is not None:
            out.append(w)
    return out


def compile_expr(e: Expr, field: str | None = None) -> Compiled:
    """Compile ``e``; ``field`` is the enum field a literal here is compared with (for its aliases)."""
    op = e.op
    if op == "int":
        v = e.args[0]
        return Compiled(lambda b: v, "int", frozenset())
    if op == "str":
        v = _value(e.args[0], field, e)
        return Compiled(lambda b: v, "str", frozenset())
    if op == "bool":
        v = e.args[0]
        return Compiled(lambda b: v, "bool", frozenset())
    if op == "name":
        n = e.args[0]
        if n in NAMES:
            return Compiled(_getter(n), _type_of(n), frozenset({_field_of(n)}))
        if n in _KNOWN_WORDS or _canon_word(n) != n:
            v = _value(n, field, e)
            return Compiled(lambda b: v, "str", frozenset())
        parts = _fields_of_setter(n)
        raise error("where.unknown-name", f"unknown name `{n}` in where clause", e.span,
                    f"`{n}(...)` sets {', '.join(f'`{x}`' for x in parts)}: name one of them" if len(parts) > 1 else
                    did_you_mean(n, NAMES + sorted(_KNOWN_WORDS)) or "names: " + ", ".join(NAMES), cls=ParseError)
    if op == "tuple":
        items = [compile_expr(a, field) for a in e.args]
        fns = [i.fn for i in items]
        return Compiled(lambda b: tuple(f(b) for f in fns), "tuple",
                        frozenset().union(*(i.deps for i in items)) if items else frozenset(),
                        tuple(i.type for i in items))
    if op in ("and", "or"):
        l, r = compile_expr(e.args[0]), compile_expr(e.args[1])
        for side, node in ((l, e.args[0]), (r, e.args[1])):
            if side.type != "bool":
                raise error("where.type", f"`{op}` needs true/false on both sides, got {_a(side.type)}", node.span,
                            "compare the field, e.g. `hdim_q == 128`", cls=ParseError)
        lf, rf = l.fn, r.fn
        fn = (lambda b: lf(b) and rf(b)) if op == "and" else (lambda b: lf(b) or rf(b))
        return Compiled(fn, "bool", l.deps | r.deps)
    if op == "not":
        a = compile_expr(e.args[0])
        if a.type != "bool":
            raise error("where.type", f"`not` needs true/false, got {_a(a.type)}", e.span,
                        "negate a condition, e.g. `not lse` or `not (hdim_q == 128)`", cls=ParseError)
        f = a.fn
        return Compiled(lambda b: not f(b), "bool", a.deps)
    if op == "neg":
        a = compile_expr(e.args[0])
        if a.type != "int":
            raise error("where.type", f"`-` needs an integer, got {_a(a.type)}", e.span,
                        "arithmetic works on numeric fields (hdim_q, tile_m0, ...) and numbers", cls=ParseError)
        f = a.fn
        return Compiled(lambda b: -f(b), "int", a.deps)
    if op == "bin":
        sym, l, r = e.args[0], compile_expr(e.args[1]), compile_expr(e.args[2])
        if l.type != "int" or r.type != "int":
            raise error("where.type", f"`{sym}` needs integers on both sides", e.span,
                        "arithmetic works on numeric fields (hdim_q, tile_m0, ...) and numbers", cls=ParseError)
        lf, rf = l.fn, r.fn
        if sym in ("/", "%"):
            def fn(b, lf=lf, rf=rf, sym=sym):
                d = rf(b)
                if d == 0:
                    return 0
                return lf(b) // d if sym == "/" else lf(b) % d
        else:
            f2 = _BIN[sym]
            fn = lambda b: f2(lf(b), rf(b))  # noqa: E731
        return Compiled(fn, "int", l.deps | r.deps)
    if op == "cmp":
        sym = e.args[0]
        l = compile_expr(e.args[1], _enum_field(e.args[2]))
        r = compile_expr(e.args[2], _enum_field(e.args[1]))
        if l.type != r.type and not ({l.type, r.type} == {"int", "bool"} and _is_pad(e.args[1], e.args[2])):
            raise error("where.type", f"cannot compare {_a(l.type)} with {_a(r.type)}", e.span,
                        _mismatch_hint(e.args[1], l.type, e.args[2], r.type), cls=ParseError)
        if sym not in ("==", "!=") and l.type != "int":
            raise error("where.type", f"`{sym}` compares integers only", e.span,
                        "names and true/false compare with `==` and `!=` only", cls=ParseError)
        cmpf, lf, rf = _CMP[sym], l.fn, r.fn
        return Compiled(lambda b: cmpf(lf(b), rf(b)), "bool", l.deps | r.deps)
    if op in ("in", "notin"):
        l, r = compile_expr(e.args[0]), compile_expr(e.args[1], _enum_field(e.args[0]))
        if r.type != "tuple":
            raise error("where.type", "`in` needs a list on the right, e.g. `hdim_q in [64, 128]`",
                        e.args[1].span, cls=ParseError)
        for item, t in zip(e.args[1].args, r.items):   # each item of the field's type
            if t != l.type and not ({l.type, t} == {"int", "bool"} and _is_pad(e.args[0], item)):
                left = f"`{e.args[0].args[0]}`" if e.args[0].op == "name" else "the left side"
                raise error("where.type", f"this list holds {_a(t)} where {left} is {_a(l.type)}",
                            item.span, _mismatch_hint(e.args[0], l.type, item, t), cls=ParseError)
        lf, rf = l.fn, r.fn
        if op == "in":
            return Compiled(lambda b: lf(b) in rf(b), "bool", l.deps | r.deps)
        return Compiled(lambda b: lf(b) not in rf(b), "bool", l.deps | r.deps)
    raise AssertionError(f"unknown expression node {op}")


@functools.lru_cache(maxsize=1024)
def where_rule(w: Where, index: int) -> Rule:
    """A where clause as a silent filter rule over the fields it reads (compiled once: reading the file checks it,
    and each expansion of its declaration -- an empty one's probes too -- takes the same rule)."""
    c = compile_expr(w.expr)
    if c.type != "bool":
        raise error("where.type", f"a where clause must be true or false, got {_a(c.type)}", w.span,
                    "e.g. `where hdim_q == 128 and pipeline != \"qs\"`", cls=ParseError)
    sp = w.span
    if not sp.source_line:
        src = "where"
    elif sp.end_line == sp.line and sp.end_column:   # the clause itself, not the whole line it is on
        src = sp.source_line[sp.column - 1:sp.end_column - 1].strip()
    else:   # (a clause over several lines: its first line)
        src = sp.source_line[sp.column - 1:].strip() + " ..."
    deps = tuple(sorted(c.deps))
    return Rule(id=f"where#{index}", deps=deps, check=c.fn, message=lambda b, m=f"filtered by `{src}`": m, filter=True,
                blame=None)


__all__ = ["compile_expr", "where_rule", "NAMES"]
