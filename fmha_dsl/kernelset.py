"""The Python entry point: ``fmha_dsl.load(path)`` -> :class:`KernelSet` -> keys / registry."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable, Optional, Union

from pydantic import BaseModel, ConfigDict

from . import vocab as V
from .declare import Declaration, resolve
from .errors import Diagnostic, ParseError, Span, UsageError, did_you_mean, error
from .expand import Report, expand
from .parse import parse_file, parse_text
from .registry import Registry

ArchArg = Union[str, Iterable[str], None]
if TYPE_CHECKING:
    from .keys import KernelKey


def _archs(arch: ArchArg) -> Optional[tuple[str, ...]]:
    if arch is None:
        return None
    if not isinstance(arch, (str, Iterable)):
        raise error("usage.arch", f"arch must be a name like 'gfx942', a comma-separated list or a list of names, got "
                    f"{type(arch).__name__} {arch!r}", None, f"one of: {', '.join(V.ARCHS)}", cls=UsageError)
    items = [arch] if isinstance(arch, str) else list(arch)
    out, bad = [], []
    for a in items:
        for part in str(a).split(","):
            part = part.strip()
            if not part:
                continue
            if part == "*":
                return None
            if part not in V.ARCHS:  # every unknown arch is reported, not only the first
                bad.append(Diagnostic("usage.arch", f"unknown arch `{part}`", None,
                                      did_you_mean(part, V.ARCHS) or f"one of: {', '.join(V.ARCHS)}"))
            out.append(part)
    if bad:
        raise UsageError(bad)
    if not out:  # `--arch ""` (an unset $ARCH): not every target, which `*` or no --arch asks for
        raise error("usage.arch", f"arch names no target: got {arch!r}", None,
                    f"name one or more ({', '.join(V.ARCHS)}), or `*` for every target the set declares",
                    cls=UsageError)
    return tuple(dict.fromkeys(out))


def _profile(profile) -> Optional[str]:
    if profile is None:
        return None
    p = str(profile)
    if by_receipt := V.receipt_profile(p):
        return by_receipt
    if p in V.PROFILES:
        return p
    raise error("usage.profile", f"unknown profile `{p}`", None,
                did_you_mean(p, V.PROFILES) or "profiles: " + ", ".join(f"{k} ({v})" for k, v in V.PROFILES.items()),
                cls=UsageError)


def _backend(backend) -> Optional[str]:
    if backend is None:
        return None
    if backend not in V.BACKENDS:
        raise error("usage.backend", f"unknown backend `{backend}`", None,
                    did_you_mean(str(backend), V.BACKENDS) or f"one of: {', '.join(V.BACKENDS)}", cls=UsageError)
    return backend


class KernelSet(BaseModel):
    """All declarations of a ``.fmha`` file and the files it includes."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    path: Optional[str] = None
    sets: tuple[str, ...]
    declarations: tuple[Declaration, ...]
    files: tuple[str, ...] = ()

    def expand_report(self, arch: ArchArg = None, profile=None, backend: str | None = None,
                      keep_going: bool = False) -> Report:
        """What expansion keeps and drops; ``keep_going``: errors go to ``Report.errors`` instead of raising."""
        return expand(self.declarations, _archs(arch), _profile(profile), _backend(backend), keep_going)

    def expand(self, arch: ArchArg = None, profile=None, backend: str | None = None) -> list[KernelKey]:
        """Every kernel key the declarations allow, deduplicated, in a deterministic order."""
        return [e.key for e in self.registry(arch, profile, backend=backend)]

    def registry(self, arch: ArchArg = None, profile=None, report: Report | None = None,
                 backend: str | None = None) -> Registry:
        rep = report or self.expand_report(arch, profile, backend)
        profiles = sorted({d.profile.values[0] for d in self.declarations}) if profile is None else [_profile(profile)]
        return Registry.from_kernels(rep.kernels, name=self.name, profiles=profiles,
                                     sources=self.source_names())

    def source_names(self) -> list[str]:
        """The files the declarations come from, as the registry's ``metadata.sources`` lists them: the top-level
        file's name and included files relative to its folder (as each kernel's ``source`` names them)."""
        return sorted({_display(f, self.path) for f in self.files})


def _display(decl_path: str | None, top: str | None) -> str:
    """Where a declaration came from, independent of the machine and working directory: the
    top-level file's name, and included files relative to its folder."""
    if decl_path is None:
        return "<input>"
    if top is None:
        return os.path.basename(decl_path)
    rel = os.path.relpath(os.path.realpath(decl_path), os.path.dirname(os.path.realpath(top)))
    return rel.replace(os.sep, "/")


def _first_line(path: str | None, text: str | None) -> str:
    """Line 1 of the top-level file (for the caret of a file-level error)."""
    if text is None and path is not None:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.readline()
        except OSError:
            text = ""
    return (text or "").split("\n", 1)[0]


def _make(files, path, text: str | None = None) -> KernelSet:
    import dataclasses

    decls: list[Declaration] = []
    sets: list[str] = []
    for src in files:
        shown = _display(src.path, path)
        decls.extend(dataclasses.replace(d, display=shown) for d in resolve(src))
        sets.extend(s.name for s in src.sets)
    if not sets:  # an input error about the whole file: located at its start
        raise error("set.none", "no `kernel_set` in this file", Span(path, 1, 1, source_line=_first_line(path, text)),
                    "declare one: `kernel_set NAME { kernel { signature { ... } } }`", cls=ParseError)
    name = sets[-1] if len(sets) == 1 or path is None else os.path.splitext(os.path.basename(path))[0]
    return KernelSet(name=name, path=path, sets=tuple(sets), declarations=tuple(decls),
                     files=tuple(f.path for f in files if f.path))


def shipped_names() -> list[str]:
    """Names of the kernel sets shipped with the package (``ck_receipt0`` ...)."""
    from .locate import folder

    return sorted(p.name[:-5] for p in folder("kernelsets").iterdir() if p.name.endswith(".fmha"))


def shipped(name: str) -> str:
    """Path of a kernel set shipped with the package (``shipped("ck_receipt0")``); from a source checkout,
    the checkout's ``kernelsets/`` folder."""
    from .locate import folder

    base = name if name.endswith(".fmha") else name + ".fmha"
    ref = folder("kernelsets").joinpath(base)
    if not ref.is_file():
        avail = shipped_names()
        raise error("input.file-not-found", f"no such file or shipped kernel set: `{name}`", None,
                    did_you_mean(name, avail) or "give the path of a .fmha file, or one of the shipped sets: "
                    + ", ".join(avail), cls=UsageError)
    return str(ref)


def _path(func: str, path) -> str:
    """``path`` as a string, or a located error naming what was given (``os.fspath`` raises a bare TypeError)."""
    if not isinstance(path, (str, os.PathLike)):
        raise error("usage.type", f"{func}() takes the path of a .fmha file (str or os.PathLike), got "
                    f"{type(path).__name__}", None, "fmha_dsl.load('kernels.fmha'); text goes to fmha_dsl.loads(text)",
                    cls=UsageError)
    return os.fspath(path)


def resolve_set(path: str) -> str:
    """A path, or the name of a shipped kernel set: ``ck_receipt0`` (no folder, no ``.fmha``, not a file here).  A
    bare name that is neither is a ParseError naming both (a misspelt set's name gets a did-you-mean)."""
    if os.path.exists(path) or os.sep in path or "/" in path or path.endswith(".fmha"):
        return path
    names = shipped_names()
    if path in names:
        return shipped(path)
    raise error("input.file-not-found", f"no such file or shipped kernel set: `{path}`", None,
                did_you_mean(path, names) or "give the path of a .fmha file, or one of the shipped sets: "
                + ", ".join(names), cls=ParseError)


def load(path: str | os.PathLike) -> KernelSet:
    """Parse and resolve a ``.fmha`` file (and its includes), or a shipped set by name (``load("ck_receipt0")``).
    Raises :class:`fmha_dsl.FmhaError`."""
    p = resolve_set(_path("load", path))
    return _make(parse_file(p), p)


def loads(text: str, path: str | None = None) -> KernelSet:
    """Like :func:`load`, from text; with ``path``, includes are resolved from its folder (without a path,
    an include is an error)."""
    if path is not None:
        return _make(parse_file(path, text), path, text)
    src = parse_text(text, path)
    if src.includes:
        raise error("include.no-path", "`include` needs the including file's path", src.includes[0].span,
                    "use fmha_dsl.load(path), or fmha_dsl.loads(text, path=...)")
    return _make([src], path, text)


__all__ = ["KernelSet", "load", "loads", "shipped", "shipped_names"]
