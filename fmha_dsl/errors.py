"""Diagnostics and the one exception root of fmha-dsl, split by whose fault it is.

Every error fmha-dsl raises on purpose is an :class:`FmhaError`.  An error carries one or more
:class:`Diagnostic` values; each names the rule that fired, the place (path, line, column,
with the source line for a caret), what was expected and a hint.  Diagnostics are plain data:
:mod:`fmha_dsl.cli` renders them as text or JSON, library code never prints.

The class says whose fault it is (``fault``) and the CLI's exit code (``exit_code``)::

    FmhaError                      fault            exit
    ├── InputError                 "input"          2   the user's input: text, arguments, files, environment
    │   ├── ParseError                                  not valid .fmha (syntax, setters, ``where``)
    │   ├── UsageError                                  bad API/CLI arguments, a missing optional dependency
    │   ├── RegistryError                               a registry file that is malformed or off-schema
    │   └── RuleError                               1   well-formed, but asks for what the arch rules forbid
    ├── BuildError                 "build"          1   the toolchain (Triton, a compiler) failed on valid input
    ├── DispatchError              "dispatch"       1   at run time: no kernel serves the problem, a binary is
    │                                                   missing or stale, the driver refuses a load or launch
    └── InternalError              "internal"       70  fmha-dsl's own bug

:func:`error` picks the class from the rule's namespace (``dispatch.*`` -> :class:`DispatchError` ...,
:data:`CLASS_OF_RULE`) unless ``cls=`` names one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Span:
    """A place in a source file: 1-based line and column, end exclusive."""

    path: str | None
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None
    source_line: str | None = None  # the text of `line`, kept for caret rendering

    def width(self) -> int:
        if self.end_line == self.line and self.end_column and self.end_column > self.column:
            return self.end_column - self.column
        return 1


def _cells(text: str) -> int:
    """Terminal cells ``text`` takes: two for each wide (East Asian) character, so that a caret stays under what it
    points at on a line with CJK text before it."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


@dataclass(frozen=True)
class Diagnostic:
    rule: str
    message: str
    span: Span | None = None
    hint: str | None = None
    notes: tuple[str, ...] = ()
    severity: str = "error"

    # ---- rendering -------------------------------------------------------------------
    def location(self) -> str:
        s = self.span
        if s is None:
            return ""
        return f"{s.path or '<input>'}:{s.line}:{s.column}"

    def render(self) -> str:
        """rustc-style text with GNU ``file:line:col`` prefix."""
        loc = self.location()
        head = f"{loc}: " if loc else ""
        out = [f"{head}{self.severity}[{self.rule}]: {self.message}"]
        s = self.span
        if s is not None and s.source_line is not None:
            text = s.source_line.rstrip("\n").replace("\t", " ")
            num = str(s.line)
            pad = " " * len(num)
            out.append(f"{pad} |")
            out.append(f"{num} | {text}")
            start = max(s.column, 1) - 1
            under = text[start:start + max(1, min(s.width(), max(1, len(text) - start)))] or " "
            caret = " " * _cells(text[:start]) + "^" * max(1, _cells(under))
            out.append(f"{pad} | {caret}")
        for n in self.notes:
            out.append(f"  = note: {n}")
        if self.hint:
            out.append(f"  = help: {self.hint}")
        return "\n".join(out)

    def to_dict(self) -> dict:
        s = self.span
        return {
            "severity": self.severity,
            "rule": self.rule,
            "message": self.message,
            "path": s.path if s else None,
            "line": s.line if s else None,
            "column": s.column if s else None,
            "hint": self.hint,
            "notes": list(self.notes),
        }


class FmhaError(Exception):
    """Base class of every user-facing error.

    Attributes mirror the first diagnostic: ``rule``, ``path``, ``line``, ``column``,
    ``hint``; ``diagnostics`` holds all of them (a file may have several errors).  ``fault`` and
    ``exit_code`` are the class's (see the module docstring).
    """

    fault = "failure"
    exit_code = 1

    def __init__(self, diagnostics: Diagnostic | Iterable[Diagnostic]):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = (diagnostics,)
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        if not self.diagnostics:
            raise ValueError("FmhaError needs at least one diagnostic")
        first = self.diagnostics[0]
        self.rule = first.rule
        self.hint = first.hint
        self.span = first.span
        self.path = first.span.path if first.span else None
        self.line = first.span.line if first.span else None
        self.column = first.span.column if first.span else None
        super().__init__(first.message)

    @property
    def message(self) -> str:
        return self.diagnostics[0].message

    def render(self) -> str:
        return "\n\n".join(d.render() for d in self.diagnostics)

    def __str__(self) -> str:  # a useful one-liner in tracebacks and logs
        d = self.diagnostics[0]
        loc = d.location()
        extra = f" (+{len(self.diagnostics) - 1} more)" if len(self.diagnostics) > 1 else ""
        hint = f" (hint: {d.hint})" if d.hint else ""
        return f"{loc + ': ' if loc else ''}[{d.rule}] {d.message}{hint}{extra}"

    def __reduce__(self):  # survive process pools
        return (self.__class__, (self.diagnostics,))


class InputError(FmhaError):
    """The user's input is wrong (the base of the input errors below)."""

    fault = "input"
    exit_code = 2


class ParseError(InputError):
    """The text is not valid ``.fmha`` syntax (or a setter is unknown / malformed)."""


class UsageError(InputError):
    """Bad arguments to the API or CLI that are not tied to a source file."""


class RegistryError(InputError):
    """A registry JSON file is malformed or does not match the schema."""


class RuleError(InputError):
    """A declaration names a combination the arch rules forbid, or expands to nothing (a failure: exit 1)."""

    exit_code = 1


class BuildError(FmhaError):
    """A compiler or Triton failed on a valid kernel (not the user's input; the message carries the tool's words)."""

    fault = "build"


class DispatchError(FmhaError):
    """At run time: no kernel serves the problem, a binary is missing or stale, the driver refuses it."""

    fault = "dispatch"


class InternalError(FmhaError):
    """fmha-dsl's own bug: a state the code should never reach."""

    fault = "internal"
    exit_code = 70


# a rule's namespace (or the whole rule) -> its class, for error() without cls=; the longest match wins
CLASS_OF_RULE: dict[str, type[FmhaError]] = {
    "syntax": ParseError, "where": ParseError, "include": ParseError, "set": ParseError, "value": ParseError,
    "input": UsageError, "usage": UsageError, "registry": RegistryError, "decl": RuleError,
    "build": BuildError, "runtime.jit": BuildError,
    "dispatch": DispatchError, "runtime": DispatchError,
    "report": UsageError, "internal": InternalError,
}


def class_of_rule(rule: str) -> type[FmhaError]:
    """The error class :func:`error` uses for ``rule`` when no ``cls`` is given."""
    parts = rule.split(".")
    for n in range(len(parts), 0, -1):
        cls = CLASS_OF_RULE.get(".".join(parts[:n]))
        if cls is not None:
            return cls
    return FmhaError


def error(rule: str, message: str, span: Span | None = None, hint: str | None = None,
          notes: Iterable[str] = (), cls: type[FmhaError] | None = None) -> FmhaError:
    """Shorthand: build an exception holding one diagnostic (``cls`` None: :func:`class_of_rule`)."""
    return (cls or class_of_rule(rule))(Diagnostic(rule, message, span, hint, tuple(notes)))


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A "did you mean X?" hint for a misspelt name, or None."""
    import difflib

    by_lower: dict[str, str] = {}
    for c in choices:  # case-insensitive: `GFX942` and `SM90` find `gfx942` and `sm90`
        by_lower.setdefault(str(c).lower(), str(c))
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    if close:
        return f"did you mean `{by_lower[close[0]]}`?"
    return None


__all__ = [
    "Span",
    "Diagnostic",
    "FmhaError",
    "InputError",
    "ParseError",
    "RuleError",
    "RegistryError",
    "UsageError",
    "BuildError",
    "DispatchError",
    "InternalError",
    "CLASS_OF_RULE",
    "class_of_rule",
    "error",
    "did_you_mean",
]
