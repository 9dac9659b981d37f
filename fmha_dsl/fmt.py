"""[fmt] The canonical formatter: ``fmha-dsl fmt``.

Canonical form: 4-space indents, one setter per line, no leading dots, ``, `` between arguments,
`` | `` between alternatives, the C++ ``.add(...)`` form rewritten as a ``kernel { }`` block, and
every comment kept (attached to the statement after it, or trailing on its line).  Formatting is
idempotent: ``fmt(fmt(x)) == fmt(x)``, and the result parses to the same declarations.
"""

from __future__ import annotations

import bisect

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


_KEYWORDS = frozenset({"kernel_set", "kernel", "signature", "algorithm", "where", "include", "add", "true", "false",
                       "and", "or", "not", "in"})


def _setter(s: A.Setter) -> str:
    args = ", ".join((f"{a.name}={_alt(a.alt)}" if a.name else _alt(a.alt)) for a in s.args)
    # a keyword as a setter's name (`.where(...)` in an .add chain: an unknown setter) keeps its dot, which makes it
    # a setter in a block too -- without it, the line would be a where clause
    return f"{'.' if s.name in _KEYWORDS else ''}{s.name}({args})"


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


class _Anchor:
    """Something printed on a line of its own -- a setter, a where clause, an include, a header (``kernel_set x {``,
    ``kernel {``, ``signature {``) or a closing brace -- with its source extent (``start``/``end``: (line, column)),
    whether the source had a blank line right before it, and the comments that go with it."""

    __slots__ = ("start", "end", "leaf", "lead", "trail", "blank")

    def __init__(self, start, end, leaf=False):
        self.start, self.end, self.leaf = start, end, leaf
        self.lead: list[tuple[str, bool]] = []   # own-line comments before it (text, blank line before it)
        self.trail: list[str] = []               # comments after it on its (last) line, or inside it
        self.blank = False


def _anchors(src: A.SourceFile) -> dict:
    """Every anchor of the file by the AST node (or ``(node, role)``) it stands for."""
    out: dict = {}

    def leaf(node):
        sp = node.span
        out[id(node)] = _Anchor((sp.line, sp.column), (sp.end_line or sp.line, sp.end_column or sp.column), True)

    def point(key, line, col):
        out[key] = _Anchor((line, col), (line, col))

    for item in src.items:
        if isinstance(item, A.Include):
            leaf(item)
            continue
        point((id(item), "open"), item.span.line, item.span.column)
        for n in item.setters + item.wheres:
            leaf(n)
        for k in item.kernels:
            sp = k.span
            if k.form == "add":   # one statement: a comment after it on its last line (or inside) trails `kernel {`
                out[(id(k), "open")] = _Anchor((sp.line, sp.column), (sp.end_line, sp.end_column), True)
            else:
                point((id(k), "open"), sp.line, sp.column)
                point((id(k), "close"), sp.end_line, sp.end_column - 1)
            for kind, bs in k.blocks:
                point((id(k), kind), bs.line, bs.column)
                point((id(k), kind + "}"), bs.end_line, bs.end_column - 1)
            for n in k.signature + k.algorithm + k.setters + k.wheres:
                leaf(n)
        point((id(item), "close"), item.span.end_line, item.span.end_column - 1)
    return out


def _attach(anchors: dict, comments, lines: list[str]) -> list[tuple[str, bool]]:
    """Give each comment to an anchor: after an anchor on its line (the last to end before it), or inside a setter,
    where clause or ``.add(...)`` that spans lines -- trailing; else before the next anchor -- leading.  Returns the
    comments after the last anchor.  Marks the anchors and comments the source had a blank line before (only the
    first thing on a line: statements that shared a line get none between them)."""
    order = sorted(anchors.values(), key=lambda a: a.start)
    starts = [a.start for a in order]
    ending: dict[int, list] = {}
    for a in order:
        ending.setdefault(a.end[0], []).append(a)
    spanning = [a for a in order if a.leaf and a.end[0] > a.start[0]]   # multi-line leaves: few
    firsts = {}
    for pos in starts + [(ln, col) for ln, col, _t in comments]:
        firsts[pos[0]] = min(firsts.get(pos[0], pos), pos)
    rest = []
    for line, col, text in sorted(comments):
        pos, text = (line, col), text.replace("\r\n", "\n")
        blank = firsts[line] == pos and _blank_before(lines, line)
        on_line = [a for a in ending.get(line, ()) if a.end <= pos]
        inside = [a for a in spanning if a.start < pos < a.end]
        host = (max(on_line, key=lambda a: a.end) if on_line else inside[-1]) if on_line or inside else None
        if host is not None and _fits_after(host.trail, text):
            host.trail.append(text)
            continue
        i = bisect.bisect_right(starts, pos)
        if i == len(order):
            rest.append((text, blank))
        else:
            order[i].lead.append((text, blank))
    for a in order:
        a.blank = firsts[a.start[0]] == a.start and _blank_before(lines, a.start[0])
    return rest


def _fits_after(trail: list[str], text: str) -> bool:
    """Whether ``text`` can join a line that ends with the comments ``trail``: nothing follows a block comment over
    several lines (it would land on that comment's last line, where nothing anchors it), and no comment over several
    lines follows a line comment (its first line would be swallowed, its last read as code).  Such a comment goes on
    a line of its own instead."""
    if trail and "\n" in trail[-1]:
        return False
    return not ("\n" in text and any(t.startswith(("#", "//")) for t in trail))


def _blank_before(lines: list[str], line: int) -> bool:
    """Whether the source line before ``line`` is blank (``lines``: split on newlines only, as the parser counts)."""
    return line >= 2 and not lines[line - 2].strip()


class _Printer:
    def __init__(self, anchors: dict):
        self.anchors = anchors
        self.out: list[str] = []
        self.opened = False   # the last line printed opens a block

    def _blank(self):
        """One blank line, where the source had one (never two, never right after an opening brace)."""
        if self.out and self.out[-1] != "" and not self.opened:
            self.out.append("")

    def emit(self, indent: int, text: str, key=None):
        pad = "    " * indent
        a = self.anchors.get(key) if key is not None else None
        if a is not None:
            self.comments(pad, a.lead)
            if a.blank:   # (after its comments too: a blank line between them and it stays)
                self._blank()
        self._line(pad, text, a.trail if a is not None else (), "    " if text.endswith("{") else "")
        self.opened = text.endswith("{")

    def _line(self, pad: str, text: str, trail, deeper: str):
        """``text`` with the comments that trail it: on its line up to the first line comment (nothing can follow
        one there), each later one on a line of its own, indented as the next statement is (``deeper`` after an
        opening brace), where it reads back as that statement's leading comment."""
        cut = next((i + 1 for i, t in enumerate(trail) if t.startswith(("#", "//"))), len(trail))
        self.out.append(pad + text + ("  " + " ".join(trail[:cut]) if cut else ""))
        self.out.extend(pad + deeper + t for t in trail[cut:])

    def comments(self, pad: str, items):
        for c, blank in items:
            if blank:
                self._blank()
            self.out.append(pad + c)
            self.opened = False

    def close(self, indent: int, key):
        """A closing brace: the comments before it (inside the block), then ``}``."""
        a = self.anchors.get(key)
        self.comments("    " * (indent + 1), a.lead if a else ())
        self._line("    " * indent, "}", a.trail if a else (), "")
        self.opened = False

    def kernel(self, k: A.KernelDecl, indent: int, ks: A.KernelSetDecl):
        self.emit(indent, f"kernel {k.name} {{" if k.name else "kernel {", (id(k), "open"))
        extra = _add_defaults(k, ks)
        for block, setters in (("signature", k.signature), ("algorithm", k.algorithm)):
            if not setters and not (block == "algorithm" and extra) and (id(k), block) not in self.anchors:
                continue
            self.emit(indent + 1, block + " {", (id(k), block))
            for st in setters:
                self.emit(indent + 2, _setter(st), id(st))
            if block == "algorithm" and extra:
                self.out.extend("    " * (indent + 2) + text for text in extra)
                self.opened = False
            self.close(indent + 1, (id(k), block + "}"))
        for _l, _c, node in _in_order(k.setters, k.wheres):
            self.emit(indent + 1, _item_text(node), id(node))
        self.close(indent, (id(k), "close"))

    def kernel_set(self, ks: A.KernelSetDecl):
        self.emit(0, f"kernel_set {ks.name} {{", (id(ks), "open"))
        for _l, _c, node in _in_order(ks.setters, ks.wheres):
            self.emit(1, _item_text(node), id(node))
        for i, k in enumerate(ks.kernels):
            if i or ks.setters or ks.wheres:
                self._blank()
            self.kernel(k, 1, ks)
        self.close(0, (id(ks), "close"))


def _in_order(setters, wheres):
    items = [(s.span.line, s.span.column, s) for s in setters] + [(w.span.line, w.span.column, w) for w in wheres]
    return sorted(items, key=lambda t: t[:2])


def _item_text(node) -> str:
    return _setter(node) if isinstance(node, A.Setter) else "where " + _expr(node.expr)


def _add_defaults(k: A.KernelDecl, ks: A.KernelSetDecl) -> list[str]:
    """Setters that keep a C++ ``.add(...)`` line's meaning once it is a ``kernel { }`` block: ``.add`` keeps CK's
    ``FmhaAlgorithm()`` defaults for an unset pipeline and tile, where a block means ``*`` (declare._rules_pick)."""
    if k.form != "add":
        return []
    names = {s.name for s in k.signature + k.algorithm + k.setters + ks.setters}
    varies = _family_varies(k, ks)
    out = []
    if "pipeline" not in names and varies("pipeline"):
        out.append(f"pipeline({V.ALG_DEFAULTS['pipeline']})")
    if not any(n in ("tile", "wave", "warp", "block_per_cu", "max_seq_len_q") or n.startswith(("tile_", "wave_",
                                                                                                 "warp_"))
               for n in names) and varies("tile"):
        out.append(f"tile({', '.join(str(x) for x in V.TILE_DEFAULT)})")
    return out


def _family_varies(k: A.KernelDecl, ks: A.KernelSetDecl):
    """``varies(field)``: whether the family an ``.add`` line names has a choice of ``field`` (a family whose rules
    fix its pipeline -- append-KV's, the paged kernels' -- takes no ``pipeline(qr)``: the block would ask for
    another value than the fixed one).  True when the family is not one plain name (the expansion then says)."""
    from .rules import family_rules

    def one(name, setters):
        vals = [s.args[0].alt.options for s in setters if s.name == name and s.args]
        return str(vals[-1][0].value) if vals and len(vals[-1]) == 1 and vals[-1][0].kind in ("name", "str") \
            else None

    family = one("family", k.signature + k.setters) or one("family", ks.setters)
    backend = one("backend", k.setters) or one("backend", ks.setters) or "ck"
    # (an unknown family or backend has no rules: the check reports it, located)
    fr = family_rules(V.ALIASES.get("family", {}).get(family, family), backend) if family else None
    return lambda field: fr is None or (field in fr.fields and field not in fr.fixed)


def format_source(text: str, path: str | None = None) -> str:
    """Canonical text of a ``.fmha`` source (raises ParseError on bad input)."""
    src = parse_text(text, path)
    anchors = _anchors(src)
    rest = _attach(anchors, src.comments, text.removeprefix("\ufeff").split("\n"))
    p = _Printer(anchors)
    prev = None
    for item in src.items:
        if prev is not None and not (isinstance(prev, A.Include) and isinstance(item, A.Include)):
            p._blank()
        if isinstance(item, A.Include):
            p.emit(0, f"include {_quote(item.path)}", id(item))
        else:
            p.kernel_set(item)
        prev = item
    p.comments("", rest)
    return "\n".join(p.out).strip("\n") + "\n"


__all__ = ["format_source"]
