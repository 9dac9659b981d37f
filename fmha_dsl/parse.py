"""[parse] ``.fmha`` text -> :class:`fmha_dsl.ast.SourceFile`.

The grammar ``fmha.lark`` ships inside the package (``fmha_dsl.grammar``) and is loaded on first
use, never at import.  Lark's errors are translated at this boundary (:mod:`fmha_dsl.parse_errors`) into located
:class:`~fmha_dsl.errors.ParseError` values that speak the user's spelling (``}`` rather than ``RBRACE``).
"""

from __future__ import annotations

import functools
import os
import stat
import threading

from . import ast as A
from .errors import ParseError, Span, error
from .locate import folder
from .parse_errors import Lines, byte_span, translate



def grammar_text() -> str:
    return folder("grammar").joinpath("fmha.lark").read_text(encoding="utf-8")


_PARSE_LOCK = threading.Lock()


class _CommentSink:
    """Collects comments during one parse (the formatter keeps them); reset per parse."""

    items: list = []

    @classmethod
    def add(cls, tok):
        cls.items.append((tok.line, tok.column, str(tok).rstrip()))
        return tok


_CALLBACKS = {"COMMENT": _CommentSink.add, "BLOCK_COMMENT": _CommentSink.add}


def _tag(x):
    """Lark's serialized tables -> JSON-safe data (int-keyed dicts and tuples are tagged)."""
    if isinstance(x, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in x):
            return {k: _tag(v) for k, v in x.items()}
        return {"__d": [[_tag(k), _tag(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"__t": [_tag(v) for v in x]}
    if isinstance(x, list):
        return [_tag(v) for v in x]
    return x


def _untag(x):
    if isinstance(x, dict):
        if "__d" in x:
            return {_untag(k): _untag(v) for k, v in x["__d"]}
        if "__t" in x:
            return tuple(_untag(v) for v in x["__t"])
        return {k: _untag(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_untag(v) for v in x]
    return x


def _cache_file(text: str) -> str | None:
    """Content-addressed location of the parse tables: grammar text + Lark version."""
    import hashlib

    import lark

    from .cache import cache_base

    root = cache_base()
    digest = hashlib.sha256(f"{lark.__version__}\0{text}".encode()).hexdigest()[:32]
    return os.path.join(root, "parser", f"fmha-lalr-{digest}.json")


@functools.lru_cache(maxsize=1)
def _parser():
    """The LALR parser; its tables are cached as JSON (never pickle) and rebuilt if anything is off."""
    import json

    from lark import Lark
    from lark.grammar import Rule
    from lark.lexer import TerminalDef

    text = grammar_text()
    path = _cache_file(text)
    try:
        with open(path, encoding="utf-8") as f:
            return Lark.__new__(Lark)._load(_untag(json.load(f)), lexer_callbacks=_CALLBACKS)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # missing, stale or unreadable: build it
    parser = Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=True,
                  lexer_callbacks=_CALLBACKS)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        data, memo = parser.memo_serialize([TerminalDef, Rule])
        data["options"] = {k: v for k, v in data["options"].items() if k != "lexer_callbacks"}
        doc = json.dumps(_tag({"data": data, "memo": memo}))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(doc)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        pass  # a read-only home, or tables this Lark cannot serialise: parse without the cache
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return parser


def _unquote(s: str) -> str:
    body = s[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            # \n, \t, \\, \" and \' as in C; any other escape keeps its backslash (a Windows path stays one)
            out.append({"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}.get(nxt, "\\" + nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


# ---- tree -> AST -----------------------------------------------------------------------------
class _Builder:
    def __init__(self, lines: Lines):
        self.L = lines

    def build(self, tree) -> A.SourceFile:
        includes, sets, items = [], [], []
        for ch in tree.children:
            if ch.data == "include":
                inc = A.Include(_unquote(str(ch.children[0])), self.L.of_meta(ch.meta))
                includes.append(inc)
                items.append(inc)
            else:
                ks = self.kernel_set(ch)
                sets.append(ks)
                items.append(ks)
        return A.SourceFile(self.L.path, tuple(includes), tuple(sets), tuple(items))

    def kernel_set(self, t) -> A.KernelSetDecl:
        name_tok = t.children[0]
        setters, kernels, wheres = [], [], []
        for ch in t.children[1:]:
            if ch.data == "setter":
                setters.append(self.setter(ch))
            elif ch.data == "kernel":
                kernels.append(self.kernel(ch))
            elif ch.data == "add":
                kernels.append(self.add(ch))
            elif ch.data == "where":
                wheres.append(self.where(ch))
        return A.KernelSetDecl(str(name_tok), tuple(setters), tuple(kernels), tuple(wheres),
                               self.L.of_meta(t.meta), self.L.of_token(name_tok))

    def kernel(self, t) -> A.KernelDecl:
        name = str(t.children[0]) if t.children[0] is not None else None
        sig, alg, setters, wheres, blocks = [], [], [], [], []
        for ch in t.children[1:]:
            if ch.data in ("signature", "algorithm"):
                (sig if ch.data == "signature" else alg).extend(self.setter(s) for s in ch.children)
                blocks.append((str(ch.data), self.L.of_meta(ch.meta)))
            elif ch.data == "setter":
                setters.append(self.setter(ch))
            elif ch.data == "where":
                wheres.append(self.where(ch))
        return A.KernelDecl(name, tuple(sig), tuple(alg), tuple(setters), tuple(wheres), self.L.of_meta(t.meta),
                            blocks=tuple(blocks))

    def add(self, t) -> A.KernelDecl:
        _dot, sig_chain, algo_chain, arch_atom = t.children
        sig = tuple(self.setter(s) for s in sig_chain.children[1:])
        alg = tuple(self.setter(s) for s in algo_chain.children[1:])
        setters: tuple[A.Setter, ...] = ()
        if arch_atom is not None:
            v = self.atom(arch_atom)
            alt = A.Alt((v,), v.span)
            setters = (A.Setter("arch", (A.Arg(None, alt, v.span),), v.span, v.span),)
        return A.KernelDecl(None, sig, alg, setters, (), self.L.of_meta(t.meta), form="add")

    def setter(self, t) -> A.Setter:
        dot, name_tok, *args = t.children
        parsed = tuple(self.arg(a) for a in args if a is not None)
        return A.Setter(str(name_tok), parsed, self.L.of_meta(t.meta), self.L.of_token(name_tok), dot is not None)

    def arg(self, t) -> A.Arg:
        name_tok, alt = t.children
        # (Lark nests an alternative and a value per level, and the leaf's own)
        if _depth(alt, _lark_children) > 2 * MAX_VALUE_DEPTH + 2:
            raise error("value.too-deep", f"this argument nests lists or tuples more than {MAX_VALUE_DEPTH} deep",
                        self.L.of_meta(t.meta), "a setter takes values, tuples of values (a tile, a head-dim pair) "
                        "and lists of those: `hdim([(128, 128), (192, 128)])`", cls=ParseError)
        return A.Arg(str(name_tok) if name_tok is not None else None, self.alt(alt), self.L.of_meta(t.meta))

    def alt(self, t) -> A.Alt:
        return A.Alt(tuple(self.atom(c) for c in t.children), self.L.of_meta(t.meta))

    def atom(self, t) -> A.Value:
        from lark import Token

        if isinstance(t, Token):  # an atom given directly (the arch of .add(...))
            sp = self.L.of_token(t)
            if t.type == "STRING":
                return A.Value("str", _unquote(str(t)), sp)
            if t.type == "INT":
                return A.Value("int", _int(t, sp), sp)
            return A.Value("name", str(t), sp)
        sp = self.L.of_meta(t.meta)
        d = t.data
        if d == "int_":
            return A.Value("int", _int(t.children[0], sp), sp)
        if d == "neg_int":
            return A.Value("int", -_int(t.children[0], sp), sp)
        if d == "string":
            return A.Value("str", _unquote(str(t.children[0])), sp)
        if d == "name":
            return A.Value("name", str(t.children[0]), sp)
        if d == "wildcard":
            return A.Value("wild", "*", sp)
        if d == "true":
            return A.Value("bool", True, sp)
        if d == "false":
            return A.Value("bool", False, sp)
        if d in ("tuple", "list"):
            return A.Value(d, tuple(self.alt(c) for c in t.children if c is not None), sp)
        raise error("internal.parse", f"unknown atom {d}")  # grammar and builder out of sync: our bug

    # -- expressions
    def where(self, t) -> A.Where:
        sp = self.L.of_meta(t.meta)
        try:
            e = self.expr(t.children[0])
        except RecursionError:
            e = None
        if e is None or _depth(e, _expr_children) - 1 > MAX_WHERE_DEPTH:   # (operators: the leaves are not)
            raise error("where.too-deep", f"this where clause nests more than {MAX_WHERE_DEPTH} operators deep", sp,
                        "split it into several `where` clauses (a kernel must pass each), or list alternatives with "
                        "`field in [a, b, ...]`", cls=ParseError)
        return A.Where(e, sp)

    def expr(self, t) -> A.Expr:
        from lark import Token

        if isinstance(t, Token):
            raise error("internal.parse", "bare token in expression")
        sp = self.L.of_meta(t.meta)
        d, ch = t.data, t.children
        if d == "e_name":
            return A.Expr("name", (str(ch[0]),), sp)
        if d == "e_int":
            return A.Expr("int", (_int(ch[0], sp),), sp)
        if d == "e_str":
            return A.Expr("str", (_unquote(str(ch[0])),), sp)
        if d == "e_true":
            return A.Expr("bool", (True,), sp)
        if d == "e_false":
            return A.Expr("bool", (False,), sp)
        if d == "e_tuple":
            return A.Expr("tuple", tuple(self.expr(c) for c in ch if c is not None), sp)
        if d in ("or_", "and_"):
            return A.Expr(d[:-1], (self.expr(ch[0]), self.expr(ch[1])), sp)
        if d == "not_":
            return A.Expr("not", (self.expr(ch[0]),), sp)
        if d == "neg":
            return A.Expr("neg", (self.expr(ch[0]),), sp)
        if d == "compare":
            return A.Expr("cmp", (str(ch[1]), self.expr(ch[0]), self.expr(ch[2])), sp)
        if d == "binop":
            return A.Expr("bin", (str(ch[1]), self.expr(ch[0]), self.expr(ch[2])), sp)
        if d == "in_":
            return A.Expr("in", (self.expr(ch[0]), self.expr(ch[1])), sp)
        if d == "not_in":
            return A.Expr("notin", (self.expr(ch[0]), self.expr(ch[1])), sp)
        raise error("internal.parse", f"unknown expression node {d}")


# The deepest where clause read: its checks, its evaluation and `fmha-dsl fmt` each walk it recursively, a frame or
# two per level, within Python's default limit of 1,000 frames (a chain of `or`s is one level per operator)
MAX_WHERE_DEPTH = 300
MAX_SOURCE_BYTES = 16 << 20   # a .fmha file (CK's largest receipt declares itself in a few KB)
MAX_VALUE_DEPTH = 16   # lists and tuples in one setter argument (CK's deepest: a list of pairs, 2)


def _depth(node, children) -> int:
    """Nesting depth of a tree (``children(node)``: a node's subtrees), counted without recursion."""
    best, todo = 0, [(node, 1)]
    while todo:
        n, d = todo.pop()
        best = max(best, d)
        todo.extend((c, d + 1) for c in children(n))
    return best


def _lark_children(t):
    return [c for c in getattr(t, "children", ()) if hasattr(c, "children")]


def _expr_children(e: A.Expr):
    return [c for c in e.args if isinstance(c, A.Expr)]


def _int(text, span) -> int:
    """An integer literal; a located error past Python's conversion limit (4,300 digits), not a ValueError."""
    try:
        return int(text)
    except ValueError:
        raise error("value.range", f"an integer literal of {len(str(text))} digits", span,
                    "values are tile sizes, head dims, counts: a few digits", cls=ParseError) from None




def parse_text(text: str, path: str | None = None) -> A.SourceFile:
    """Parse ``.fmha`` source text.  Raises :class:`ParseError` with a location."""
    from lark.exceptions import UnexpectedInput

    if not isinstance(text, str):
        raise error("input.not-text", f"expected .fmha source text, got {type(text).__name__}", cls=ParseError)
    text = text.removeprefix("\ufeff")  # a byte-order mark read as text (open(p).read() of such a file)
    lines = Lines(text, path)
    parser = _parser()
    with _PARSE_LOCK:  # the comment collector is shared by the one parser: one parse at a time
        _CommentSink.items = []
        try:
            tree = parser.parse(text)
        except UnexpectedInput as exc:
            raise translate(exc, lines) from None
        finally:
            comments = tuple(_CommentSink.items)
            _CommentSink.items = []
    src = _Builder(lines).build(tree)
    return A.SourceFile(src.path, src.includes, src.sets, src.items, comments)


def read_source(path: str | os.PathLike, span: Span | None = None) -> str:
    p = os.fspath(path)
    try:
        st = os.stat(p)
        # an include names a file: not a device or a pipe (before open: a FIFO would block); the file given on the
        # command line may be one (`fmha-dsl fmt /dev/stdin` as an editor's filter)
        if span is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            raise error("input.unreadable", f"`{p}` is not a regular file (a device, pipe or socket)", span,
                        "include .fmha files", cls=ParseError)
        with open(p, encoding="utf-8-sig") as f:  # (a byte-order mark some editors write is not text)
            text = f.read(MAX_SOURCE_BYTES + 1)
        if len(text) > MAX_SOURCE_BYTES:
            raise error("input.too-large", f"`{p}` holds more than {MAX_SOURCE_BYTES >> 20} MiB of text; a .fmha "
                        "file is a few KB", span, "is this the file you meant to read?", cls=ParseError)
        return text
    except FileNotFoundError:
        raise error("input.file-not-found", f"no such file: `{p}`", span,
                    "check the path; relative includes are resolved from the including file's folder" if span
                    else "check the path (the shipped sets, such as `ck_receipt0`, are named without one)",
                    cls=ParseError) from None
    except IsADirectoryError:
        raise error("input.is-directory", f"`{p}` is a directory, not a .fmha file", span,
                    "name a .fmha file in it (a build directory is read by `report` and `tune`, not here)",
                    cls=ParseError) from None
    except UnicodeDecodeError as exc:
        raise error("input.not-utf8", f"`{p}` is not UTF-8 text: a byte {exc.object[exc.start]:#04x} here",
                    byte_span(p, exc.object, exc.start), "save the file as UTF-8", cls=ParseError) from None
    except OSError as exc:
        raise error("input.unreadable", f"cannot read `{p}`: {exc.strerror}", span,
                    "check the path and its permissions (a symlink loop reads as too many levels)",
                    cls=ParseError) from None


def parse_file(path: str | os.PathLike, text: str | None = None) -> list[A.SourceFile]:
    """Parse a file and, depth-first, every file it includes (each once).

    Returns the files in dependency order (included files first).  An include cycle is an
    error that names the chain.  ``text``: the top file's contents when already in hand (it is
    not read from ``path`` then; includes are resolved from ``path``'s folder).
    """
    out: list[A.SourceFile] = []
    done: set[str] = set()

    def visit(p: str, stack: list[str], span: Span | None):
        real = os.path.realpath(p)
        if real in stack:
            chain = " -> ".join(os.path.basename(s) for s in stack[stack.index(real):] + [real])
            raise error("include.cycle", f"include cycle: {chain}", span,
                        "remove one of the includes in the chain", cls=ParseError)
        if real in done:
            return
        src = parse_text(text if span is None and text is not None else read_source(p, span), p)
        stack.append(real)
        for inc in src.includes:
            target = inc.path if os.path.isabs(inc.path) else os.path.join(os.path.dirname(p), inc.path)
            visit(target, stack, inc.span)
        stack.pop()
        done.add(real)
        out.append(src)

    visit(os.fspath(path), [], None)
    return out


__all__ = ["parse_text", "parse_file", "grammar_text", "read_source"]
