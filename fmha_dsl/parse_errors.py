"""[parse] Where a parse fails, said as the user wrote it: Lark's errors as located
:class:`~fmha_dsl.errors.ParseError` values in the user's spelling (``}`` rather than ``RBRACE``), the spans of
source lines (:class:`Lines`), and the place of a byte that is not UTF-8.  Used by :mod:`fmha_dsl.parse`.
"""

from __future__ import annotations

import re

from .errors import ParseError, Span, error

# Terminal names -> how a user writes them.
_TOKEN_WORDS = {
    "LBRACE": "`{`", "RBRACE": "`}`", "LPAR": "`(`", "RPAR": "`)`", "LSQB": "`[`", "RSQB": "`]`",
    "COMMA": "`,`", "VBAR": "`|`", "STAR": "`*`", "DOT": "`.`", "EQUAL": "`=`", "_SEMI": "`;`",
    "SEMICOLON": "`;`", "MINUS": "`-`", "NAME": "a name", "INT": "an integer", "STRING": "a string",
    "CMP_OP": "a comparison", "ADD_OP": "`+` or `-`", "MUL_OP": "`*`, `/` or `%`",
    "SIG_CTOR": "`FmhaSignature`", "ALGO_CTOR": "`FmhaAlgorithm`", "$END": "end of file",
    "KERNEL_SET": "`kernel_set`", "KERNEL": "`kernel`", "SIGNATURE": "`signature`",
    "ALGORITHM": "`algorithm`", "WHERE": "`where`", "INCLUDE": "`include`", "ADD": "`add`",
    "TRUE": "`true`", "FALSE": "`false`", "AND": "`and`", "OR": "`or`", "NOT": "`not`", "IN": "`in`",
}


# ---- spans ---------------------------------------------------------------------------------
class Lines:
    def __init__(self, text: str, path: str | None):
        self.lines = text.split("\n")
        self.path = path

    def span(self, line: int, col: int, end_line: int | None = None, end_col: int | None = None) -> Span:
        src = self.lines[line - 1] if 0 < line <= len(self.lines) else None
        return Span(self.path, line, col, end_line, end_col, src)

    def of_meta(self, meta) -> Span:
        return self.span(meta.line, meta.column, meta.end_line, meta.end_column)

    def of_token(self, tok) -> Span:
        return self.span(tok.line, tok.column, tok.end_line, tok.end_column)


# ---- Lark errors -> diagnostics -----------------------------------------------------------------
def expected_words(expected) -> str:
    words = sorted({_TOKEN_WORDS.get(e, f"`{e.lower()}`") for e in expected})
    if len(words) > 8:
        words = words[:8] + ["..."]
    return ", ".join(words)


def translate(exc, lines: Lines) -> ParseError:
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    if isinstance(exc, UnexpectedCharacters):
        sp = lines.span(exc.line, exc.column)
        ch = lines.lines[exc.line - 1][exc.column - 1: exc.column] if exc.line <= len(lines.lines) else ""
        if ch in ('"', "'"):
            return error("syntax.unterminated-string", "unterminated string", sp,
                         "close the string on the same line", cls=ParseError)
        if ch and (ch == "\ufeff" or not ch.isprintable()):  # a BOM mid-text, a NUL: shown as nothing
            return error("syntax.unexpected-character", f"unexpected invisible character U+{ord(ch):04X}", sp,
                         "delete it (invisible characters often come with pasted text)", cls=ParseError)
        hint = None
        allowed = getattr(exc, "allowed", None) or set()
        if allowed:
            hint = f"expected {expected_words(allowed)}"
        return error("syntax.unexpected-character", f"unexpected character `{ch}`", sp, hint, cls=ParseError)
    if isinstance(exc, UnexpectedEOF):
        last = len(lines.lines)
        while last > 1 and not lines.lines[last - 1].strip():
            last -= 1
        col = len(lines.lines[last - 1]) + 1 if lines.lines else 1
        return error("syntax.unexpected-eof", "unexpected end of file", lines.span(last, col),
                     f"expected {expected_words(exc.expected)}; is a `}}` or `)` missing?", cls=ParseError)
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            last = len(lines.lines)
            while last > 1 and not lines.lines[last - 1].strip():
                last -= 1
            col = len(lines.lines[last - 1]) + 1
            return error("syntax.unexpected-eof", "unexpected end of file", lines.span(last, col),
                         f"expected {expected_words(exc.expected)}; is a `}}` or `)` missing?", cls=ParseError)
        sp = lines.span(tok.line, tok.column, tok.end_line, tok.end_column)
        shown = str(tok)
        text = lines.lines[tok.line - 1]
        at = {"/": tok.column, "*": tok.column - 1}.get(shown)   # `/*` never closed: `/` (or `*` after a `/`)
        if at and text[at - 1: at + 1] == "/*":
            return error("syntax.unterminated-comment", "unterminated comment: no `*/` after this `/*`",
                         lines.span(tok.line, at, tok.line, at + 2),
                         "close it with `*/` (or comment lines out with `#` or `//`)", cls=ParseError)
        number = _odd_number(text, tok, lines)
        if number:
            return number
        hint = f"expected {expected_words(exc.expected)}"
        at = _algorithm_without_comma(lines, tok)
        if at is not None:
            return error("syntax.unexpected-token", "`FmhaAlgorithm()` follows the signature with no `,` before it",
                         lines.span(at[0], at[1], at[0], at[1] + len("FmhaAlgorithm")),
                         "write `.add(FmhaSignature()..., FmhaAlgorithm()...)`: a comma between the two",
                         cls=ParseError)
        joined = _where_without_and(lines, tok, exc.expected)
        if joined is not None:
            return joined
        after = text[tok.column:tok.column + 1]   # (the character after the token)
        if tok.type == "EQUAL" and "CMP_OP" in exc.expected and after and after in "<>!":   # `where tile_m0 => 64`
            hint = f"write `{after}=`"
        elif tok.type == "EQUAL" and "CMP_OP" in exc.expected:  # `where pipeline = "qr"`
            hint = "to compare, write `==` (`=` only names a setter's argument, as in `hdim(q=128)`)"
        elif tok.type == "NAME" and "LPAR" in exc.expected:
            hint += f"; setters are calls: write `{shown}(...)`"
        elif tok.type == "NAME" and "LPAR" not in exc.expected and exc.expected & {"RBRACE", "NAME", "DOT"}:
            hint = f"setters are calls: write `{shown}(...)`; " + hint
        return error("syntax.unexpected-token", f"unexpected `{shown}`", sp, hint, cls=ParseError)
    raise exc


_NOT_CODE = re.compile(r'#[^\n]*|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def _code_before(lines: Lines, line: int, col: int) -> str:
    """The source up to (1-based) ``line``:``col``, its comments and strings blanked out, offsets kept."""
    before = "\n".join(lines.lines[:line - 1] + [lines.lines[line - 1][:col - 1]])
    return _NOT_CODE.sub(lambda m: " " * len(m.group()), before)


def _algorithm_without_comma(lines: Lines, tok):
    """``(line, column)`` of an ``FmhaAlgorithm`` that follows the last ``FmhaSignature`` before the token the parser
    stopped at with no comma between them outside parentheses -- a pasted ``.add(...)`` missing its comma, which
    the parser reads as one more setter of the signature -- else None.  Comments and strings do not count."""
    code = _code_before(lines, tok.line, tok.column)
    sig = code.rfind("FmhaSignature")
    if sig < 0:
        return None
    depth = 0
    for i in range(sig, len(code)):
        c = code[i]
        depth += (c == "(") - (c == ")")
        if depth < 0 or (depth == 0 and c == ","):
            return None
        if depth == 0 and code.startswith("FmhaAlgorithm", i):
            return code.count("\n", 0, i) + 1, i - (code.rfind("\n", 0, i) + 1) + 1
    return None


def _where_without_and(lines: Lines, tok, expected):
    """A ``where`` clause's next condition written with no ``and`` / ``or`` before it (``where tile_m0 >= 64
    tile_n0 == 128``): the parser ends the clause at the condition's name and reads that name as a setter, so it
    stops at the operator after it.  The error points at the name, with the fix; None when that is not what
    happened."""
    if "LPAR" not in expected or tok.type not in ("CMP_OP", "ADD_OP", "MUL_OP", "EQUAL", "IN", "NOT"):
        return None
    text = lines.lines[tok.line - 1]
    name = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", text[:tok.column - 1])
    if name is None:
        return None
    code = _code_before(lines, tok.line, name.start(1) + 1)
    where = [m.end() for m in re.finditer(r"\bwhere\b", code)]
    if not where or re.search(r"[{};]", code[where[-1]:]) or not code[where[-1]:].strip():
        return None
    word, op = name.group(1), "==" if tok.type == "EQUAL" else str(tok)
    return error("syntax.unexpected-token", f"`{word}` starts a new condition with no `and` or `or` before it",
                 lines.span(tok.line, name.start(1) + 1, tok.line, name.end(1) + 1),
                 f"join a `where` clause's conditions with `and` or `or`: `... and {word} {op} ...`",
                 cls=ParseError)


def _odd_number(text: str, tok, lines: Lines):
    """A number written as other languages allow (``1e3``, ``0x80``, ``1.5``, ``1_000``): an integer followed,
    with no space, by the token the parser stopped at.  None when that is not what happened."""
    start = tok.column - 1
    digits = start
    while digits > 0 and text[digits - 1].isdigit():
        digits -= 1
    if digits == start or not (text[start:start + 1].isalnum() or text[start:start + 1] in ("_", ".")) or \
            (digits > 0 and (text[digits - 1].isalnum() or text[digits - 1] == "_")):
        return None
    end = start
    while end < len(text) and (text[end].isalnum() or text[end] in "._" or
                               (text[end] in "+-" and text[end - 1] in "eE" and not text[digits:end].startswith("0x"))):
        end += 1
    written = text[digits:end]
    try:
        value = int(written, 0) if written[:2].lower() in ("0x", "0o", "0b") else float(written.replace("_", ""))
    except ValueError:
        return None
    if isinstance(value, float) and not (value.is_integer() and abs(value) < 1e18):
        hint = "values are integers, names or strings here"
    else:
        hint = f"write `{int(value)}`"
    return error("syntax.number", f"`{written}` is not a number in .fmha: numbers are decimal integers",
                 lines.span(tok.line, digits + 1, tok.line, end + 1), hint, cls=ParseError)


def byte_span(path: str, data: bytes, at: int) -> Span:
    """Where byte ``at`` of a file's ``data`` is: line, column (in characters before it) and the line's text."""
    start = data.rfind(b"\n", 0, at) + 1
    end = data.find(b"\n", at)
    line = data[start:end if end >= 0 else len(data)].decode("utf-8", errors="replace")
    col = len(data[start:at].decode("utf-8", errors="replace")) + 1
    return Span(path, data.count(b"\n", 0, at) + 1, col, source_line=line)


__all__ = ["Lines", "translate", "expected_words", "byte_span"]
