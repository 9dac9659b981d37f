"""[fmt] The canonical formatter: ``fmha-dsl fmt``.

Canonical form: 4-space indents, one setter per line, no leading dots, ``, `` between arguments,
`` | `` between alternatives, the C++ ``.add(...)`` form rewritten as a ``kernel { }`` block, and
every comment kept (attached to the statement after it, or trailing on its line).  Formatting is
idempotent: ``fmt(fmt(x)) == fmt(x)``, and the result parses to the same declarations.
"""

from __future__ import annotations

from . import ast as A
from . import vocab as V
from .parse import parse_text

_PREC = {"or": 1, "and": 2, "not": 3, "cmp": 4, "in": 4, "notin": 4, "bin+": 5, "bin*": 6, "neg": 7}


def _quote(s: str) -> str:
    """A string literal the parser reads back as ``s`` (the inverse of parse._unquote)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def _value(v: A.Value) -> str:
    if v.kind == "int":
        return str(v.value)
    if v.kind == "str":
        return _quote(v.value)
    if v.kind == "bool":
        return "true" if v.value else "false"
    if v.kind == "wild":
        return "*"
    if v.kind == "name":
        return v.value
    if v.kind == "tuple":
        return "(" + ", ".join(_alt(a) for a in v.value) + ")"
    if v.kind == "list":
        return "[" + ", ".join(_alt(a) for a in v.value) + "]"
    raise AssertionError(v.kind)


def _alt(a: A.Alt) -> str:
    return " | ".join(_value(v) for v in a.options)


def _setter(s: A.Setter) -> str:
    args = ", ".join((f"{a.name}={_alt(a.alt)}" if a.name else _alt(a.alt)) for a in s.args)
    return f"{s.name}({args})"


def _prec(e: A.Expr) -> int:
    if e.op == "bin":
        return _PREC["bin+"] if e.args[0] in "+-" else _PREC["bin*"]
    return _PREC.get(e.op, 9)


def _expr(e: A.Expr, parent: int = 0) -> str:
    op = e.op
    if op == "name":
        s = e.args[0]
    elif op == "int":
        s = str(e.args[0])
    elif op == "str":
        s = _quote(e.args[0])
    elif op == "bool":
        s = "true" if e.args[0] else "false"
    elif op == "tuple":
        s = "[" + ", ".join(_expr(a) for a in e.args) + "]"
    elif op in ("and", "or"):
        p = _PREC[op]
        s = f"{_expr(e.args[0], p)} {op} {_expr(e.args[1], p + 1)}"
    elif op == "not":
        s = f"not {_expr(e.args[0], _PREC['not'])}"
    elif op == "neg":
        s = f"-{_expr(e.args[0], _PREC['neg'])}"
    elif op == "cmp":
        p = _PREC["cmp"]
        s = f"{_expr(e.args[1], p + 1)} {e.args[0]} {_expr(e.args[2], p + 1)}"
    elif op in ("in", "notin"):
        p = _PREC["in"]
        word = "in" if op == "in" else "not in"
        s = f"{_expr(e.args[0], p + 1)} {word} {_expr(e.args[1], p + 1)}"
    elif op == "bin":
        p = _prec(e)
        s = f"{_expr(e.args[1], p)} {e.args[0]} {_expr(e.args[2], p + 1)}"
    else:
        raise AssertionError(op)
    if _prec(e) < parent:
        return f"({s})"
    return s


class _Printer:
    def __init__(self, comments):
        self.comments = sorted(comments)      # (line, col, text)
        self.out: list[str] = []
        self.last_line = 0

    def _gap(self, first: int):
        """Keep one blank line where the source had one or more."""
        if self.last_line and first > self.last_line + 1 and self.out and self.out[-1] != "" \
                and not self.out[-1].endswith("{"):
            self.out.append("")

    def _take_on(self, line: int) -> str:
        got = [c for c in self.comments if c[0] == line]
        self.comments = [c for c in self.comments if c[0] != line]
        return ("  " + " ".join(c[2] for c in got)) if got else ""

    def emit(self, indent: int, text: str, span=None):
        pad = "    " * indent
        if span is not None:
            before = [c for c in self.comments if c[0] < span.line]
            self._gap(min([c[0] for c in before] + [span.line]))
            for line, _col, c in before:
                self._gap(line)
                self.out.append(pad + c)
                self.last_line = line + c.count("\n")
            self.comments = [c for c in self.comments if c[0] >= span.line]
            self._gap(span.line)
        trail = self._take_on(span.end_line or span.line) if span is not None else ""
        self.out.append(pad + text + trail)
        if span is not None:
            self.last_line = span.end_line or span.line

    def close(self, indent: int, end_line: int | None):
        if end_line is not None:
            for line, _col, c in [c for c in self.comments if c[0] < end_line + 1]:
                self._gap(line)
                self.out.append("    " * (indent + 1) + c)
                self.last_line = line
            self.comments = [c for c in self.comments if c[0] >= end_line + 1]
        self.out.append("    " * indent + "}")
        if end_line is not None:
            self.last_line = end_line

    def kernel(self, k: A.KernelDecl, indent: int, ks: A.KernelSetDecl):
        head = f"kernel {k.name} {{" if k.name else "kernel {"
        self.emit(indent, head, _first_line(k.span))
        extra = _add_defaults(k, ks)
        for block, setters in (("signature", k.signature), ("algorithm", k.algorithm)):
            if not setters and not (block == "algorithm" and extra):
                continue
            self.out.append("    " * (indent + 1) + block + " {")
            for st in setters:
                self.emit(indent + 2, _setter(st), st.span)
            if block == "algorithm":
                self.out.extend("    " * (indent + 2) + text for text in extra)
            self.out.append("    " * (indent + 1) + "}")
            self.last_line += 1  # the closing brace takes a line of its own
        self._items(indent + 1, k.setters, k.wheres)
        self.close(indent, k.span.end_line)

    def _items(self, indent, setters, wheres):
        items = sorted([(s.span.line, s.span.column, "s", s) for s in setters]
                       + [(w.span.line, w.span.column, "w", w) for w in wheres], key=lambda t: t[:2])
        for _l, _c, kind, node in items:
            text = _setter(node) if kind == "s" else "where " + _expr(node.expr)
            self.emit(indent, text, node.span)

    def kernel_set(self, ks: A.KernelSetDecl):
        self.emit(0, f"kernel_set {ks.name} {{", _first_line(ks.span))
        self._items(1, ks.setters, ks.wheres)
        for k in ks.kernels:
            if self.out and self.out[-1] != "":
                self.out.append("")
            self.kernel(k, 1, ks)
        self.close(0, ks.span.end_line)


def _add_defaults(k: A.KernelDecl, ks: A.KernelSetDecl) -> list[str]:
    """Setters that keep a C++ ``.add(...)`` line's meaning once it is a ``kernel { }`` block: ``.add`` keeps CK's
    ``FmhaAlgorithm()`` defaults for an unset pipeline and tile, where a block means ``*`` (declare._rules_pick)."""
    if k.form != "add":
        return []
    names = {s.name for s in k.signature + k.algorithm + k.setters + ks.setters}
    out = []
    if "pipeline" not in names:
        out.append(f"pipeline({V.ALG_DEFAULTS['pipeline']})")
    if not any(n in ("tile", "wave", "warp", "block_per_cu", "max_seq_len_q") or n.startswith(("tile_", "wave_",
                                                                                                 "warp_"))
               for n in names):
        out.append(f"tile({', '.join(str(x) for x in V.TILE_DEFAULT)})")
    return out


def _first_line(span):
    from .errors import Span

    return Span(span.path, span.line, span.column, span.line, span.column)


def format_source(text: str, path: str | None = None) -> str:
    """Canonical text of a ``.fmha`` source (raises ParseError on bad input)."""
    src = parse_text(text, path)
    p = _Printer(src.comments)
    prev = None
    for item in src.items:
        if prev is not None and not (isinstance(prev, A.Include) and isinstance(item, A.Include)):
            p.out.append("")
        if isinstance(item, A.Include):
            p.emit(0, f"include {_quote(item.path)}", item.span)
        else:
            p.kernel_set(item)
        prev = item
    for c in p.comments:
        p.out.append(c[2])
    return "\n".join(p.out).strip("\n") + "\n"


__all__ = ["format_source"]
