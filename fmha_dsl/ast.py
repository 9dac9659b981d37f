"""Syntax tree of a ``.fmha`` file: frozen values mirroring the grammar, each with a span.

Produced by :mod:`fmha_dsl.parse`, consumed by :mod:`fmha_dsl.declare` (setters -> field
constraints) and :mod:`fmha_dsl.fmt` (canonical formatter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from .errors import Span


@dataclass(frozen=True)
class Value:
    """One atom of a setter argument.

    kind: ``int`` | ``str`` (quoted) | ``name`` (bare identifier) | ``bool`` | ``wild`` |
    ``tuple`` | ``list``.  For tuple/list, ``value`` is a tuple of :class:`Alt`.
    """

    kind: str
    value: Any
    span: Span


@dataclass(frozen=True)
class Alt:
    """Alternatives ``a | b | c`` (a single value is a one-element Alt)."""

    options: tuple[Value, ...]
    span: Span


@dataclass(frozen=True)
class Arg:
    name: str | None
    alt: Alt
    span: Span


@dataclass(frozen=True)
class Setter:
    name: str
    args: tuple[Arg, ...]
    span: Span           # the whole call
    name_span: Span      # just the setter name
    dotted: bool = False


# ---- where-clause expressions ---------------------------------------------------------------
@dataclass(frozen=True)
class Expr:
    op: str                    # name | int | str | bool | tuple | not | and | or | cmp | in | notin | neg | bin
    args: tuple[Any, ...]
    span: Span


@dataclass(frozen=True)
class Where:
    expr: Expr
    span: Span


@dataclass(frozen=True)
class KernelDecl:
    name: str | None
    signature: tuple[Setter, ...]
    algorithm: tuple[Setter, ...]
    setters: tuple[Setter, ...]      # declaration-level setters (arch override, profile, ...)
    wheres: tuple[Where, ...]
    span: Span
    form: str = "block"              # "block" or "add" (the C++ .add(...) form)
    blocks: tuple[tuple[str, Span], ...] = ()   # ("signature" | "algorithm", the block's span): for the formatter


@dataclass(frozen=True)
class KernelSetDecl:
    name: str
    setters: tuple[Setter, ...]      # set-level defaults
    kernels: tuple[KernelDecl, ...]
    wheres: tuple[Where, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True)
class Include:
    path: str
    span: Span


@dataclass(frozen=True)
class SourceFile:
    path: str | None
    includes: tuple[Include, ...]
    sets: tuple[KernelSetDecl, ...]
    items: tuple[Union[Include, KernelSetDecl], ...]   # in source order (for the formatter)
    comments: tuple[tuple[int, str], ...] = ()           # (line, text) kept for the formatter
