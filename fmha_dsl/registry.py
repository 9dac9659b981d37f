"""[registry] An arch-aware set of kernels with a deterministic JSON form.

The JSON is a superset of CK's dispatcher export (``metadata``, ``statistics`` by family / dtype /
pipeline / arch, ``kernels`` with ``name``, ``identifier``, ``family``, ``dtype``, ``pipeline``,
``gfx_arch``) plus ``schema_version``, each kernel's full ``signature`` / ``algorithm`` and the
``source`` (file:line) that declared it.  Kernels are sorted and keys are sorted, one kernel per
line, so the same registry always gives the same bytes and ``save(load(p))`` reproduces ``p``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

from .atomic_file import write_atomic
from .errors import Diagnostic, RegistryError, Span, UsageError, error
from .keyfields import KeyFields
from .registry_checks import build_problem, check_summary, check_table, own_measurements

if TYPE_CHECKING:
    from .keys import KernelKey

SCHEMA_VERSION = 2          # 2 adds the optional "seqtune" table; a registry without one is written as version 1
READABLE_VERSIONS = (1, 2)


class Entry(KeyFields):
    """One registered kernel: key fields, CK name, declaring source, and build results."""

    __slots__ = ("name", "source", "build")

    def __init__(self, key: KernelKey | None, name: str, source: str = "", build: Optional[dict] = None, *,
                 sig: dict | None = None, alg: dict | None = None, arch: str | None = None, ident: str | None = None):
        if key is not None:
            sig = dict(sorted(key.signature.__dict__.items()))
            alg = dict(sorted(key.algorithm.__dict__.items()))
            arch = key.arch
        super().__init__(sig, alg, arch, key, ident)
        self.name, self.source, self.build = name, source, build

    @property
    def family(self) -> str:
        return self.sig["family"]

    def __eq__(self, other) -> bool:
        return isinstance(other, Entry) and (self.identifier, self.name, self.source, self.build) == (
            other.identifier, other.name, other.source, other.build)

    def __hash__(self) -> int:
        return hash(self.identifier)

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, {self.arch})"


def _sort_key(e: Entry):
    return (e.arch, e.sig["family"], e.name, e.identifier)


class Registry:
    """Kernels by identifier (first registration wins), with arch-aware lookup and filtering."""

    def __init__(self, name: str = "default", entries: Iterable[Entry] = (), profiles: Iterable[str] = (),
                 sources: Iterable[str] = ()):
        self.name = name
        self.path: str | None = None          # the file it was loaded from (binaries are relative to its folder)
        self._by_id: dict[str, Entry] = {}
        self.profiles = sorted(set(profiles))
        self.sources = sorted(set(sources))
        self.seqtune: dict | None = None      # the measured table (fmha_dsl.seqtune owns its format)
        for e in entries:
            self.add(e)

    # -- building
    def add(self, entry: "Entry | KernelKey", name: str | None = None, source: str = "") -> bool:
        if not isinstance(entry, Entry):  # a KernelKey
            entry = Entry(entry, name or entry.identifier, source)
        ident = entry.identifier
        if ident in self._by_id:
            return False
        self._by_id[ident] = entry
        return True

    @classmethod
    def from_kernels(cls, kernels, name="default", profiles=(), sources=()) -> "Registry":
        reg = cls(name, profiles=profiles, sources=sources)
        for k in kernels:
            reg.add(Entry(None, k.name, k.source, sig=k.sig, alg=k.alg, arch=k.arch, ident=k.identifier))
        return reg

    # -- queries
    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._by_id.values(), key=_sort_key))

    def __contains__(self, identifier: str) -> bool:
        return identifier in self._by_id

    def lookup(self, identifier: str) -> Entry | None:
        return self._by_id.get(identifier)

    def by_name(self, name: str, arch: str | None = None) -> list[Entry]:
        return [e for e in self if e.name == name and (arch is None or e.arch == arch)]

    def filter(self, predicate: Callable[[Entry], bool] | None = None, *, arch: str | None = None,
               family: str | None = None, dtype: str | None = None, pipeline: str | None = None) -> "Registry":
        def ok(e: Entry) -> bool:
            s = e.sig
            return ((arch is None or e.arch == arch) and (family is None or s["family"] == family)
                    and (dtype is None or s["dtype"] == dtype)
                    and (pipeline is None or e.alg["pipeline"] == pipeline)
                    and (predicate is None or predicate(e)))

        out = Registry(self.name, (e for e in self._by_id.values() if ok(e)), self.profiles, self.sources)
        out.path, out.seqtune = self.path, self.seqtune  # binaries and the table stay reachable
        return out

    def for_arch(self, arch: str) -> "Registry":
        return self.filter(arch=arch)

    @property
    def archs(self) -> list[str]:
        return sorted({e.arch for e in self._by_id.values()})

    def statistics(self) -> dict[str, dict[str, int]]:
        return statistics(stat_row(e) for e in self._by_id.values())

    # -- JSON
    def to_json(self) -> str:
        lines = [entry_line(e) for e in self]
        return document(self.name, self.archs, self.profiles, self.sources, self.statistics(), lines,
                        self.saved_table())

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file + rename): a killed write never leaves a torn registry."""
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise error("usage.type", f"Registry.save() takes a file path, got {path!r}", None,
                        "e.g. reg.save('build/registry.json')", cls=UsageError)
        lines = [entry_line(e) for e in self]
        write_atomic(path, document_chunks(self.name, self.archs, self.profiles, self.sources, self.statistics(),
                                           lines, self.saved_table()))

    def saved_table(self) -> dict | None:
        """The seqtune table as this registry writes it: the measurements of its own kernels (a filtered copy keeps
        the whole table in memory, for lookups; a file holds what it can be read back with)."""
        return own_measurements(self.seqtune, self._by_id)

    @classmethod
    def from_json(cls, text: str, path: str | None = None) -> "Registry":
        from pydantic import ValidationError

        from .keys import KernelKey
        from .registry_schema import RegistryModel

        if not isinstance(text, (str, bytes, bytearray)):
            raise error("usage.type", f"Registry.from_json() takes the JSON text, got {type(text).__name__}", None,
                        "Registry.load(path) reads a file", cls=UsageError)
        if not isinstance(text, str):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RegistryError(Diagnostic("registry.unreadable", f"the registry is not UTF-8 text (byte "
                                               f"{exc.start}): {exc.reason}", Span(path, 1, 1),
                                               "registry files are JSON in UTF-8")) from None

        doc = loads(text, path)
        if isinstance(doc, dict) and not readable_version(doc):
            raise RegistryError(Diagnostic(
                "registry.schema-version", f"registry schema_version {doc.get('schema_version')!r} is not "
                f"supported (this fmha-dsl reads versions {', '.join(map(str, READABLE_VERSIONS))})",
                Span(path, 1, 1),
                "rebuild the registry with this version: `fmha-dsl build`"))
        try:
            model = RegistryModel.model_validate_json(text)
        except ValidationError as exc:
            raise RegistryError(_schema_diags(exc, text, path)) from None
        reg = cls(model.metadata.registry_name, profiles=model.metadata.profiles, sources=model.metadata.sources)
        if isinstance(doc, dict) and doc.get("seqtune") is not None:
            if model.schema_version < 2:
                raise RegistryError(Diagnostic("registry.schema-version", "a `seqtune` table needs schema_version 2",
                                               Span(path, 1, 1), "re-run `fmha-dsl tune` to rewrite the file"))
            reg.seqtune = doc["seqtune"]
        names: set[tuple[str, str]] = set()
        for i, k in enumerate(model.kernels):
            key = KernelKey(signature=k.signature, algorithm=k.algorithm, arch=k.gfx_arch)
            if key.identifier != k.identifier:
                raise RegistryError(_at(text, path, i, "registry.identifier",
                                        f"kernel {k.name!r}: identifier does not match its signature/algorithm",
                                        "the entry was edited by hand; rebuild the registry"))
            flat = [(f, got, want) for f, got, want in (("family", k.family, k.signature.family),
                                                         ("dtype", k.dtype, k.signature.dtype),
                                                         ("pipeline", k.pipeline, k.algorithm.pipeline))
                    if got != want]
            if flat:  # CK's flat copies of three fields: a hand edit of one side only
                f, got, want = flat[0]
                raise RegistryError(_at(text, path, i, "registry.flat-field",
                                        f"kernel {k.name!r}: `{f}` is {got!r} but its "
                                        f"{'algorithm' if f == 'pipeline' else 'signature'} says {want!r}",
                                        "the entry was edited by hand; rebuild the registry"))
            ent = Entry(key, k.name, k.source, doc["kernels"][i].get("build"))
            why = build_problem(ent)
            if why:
                raise RegistryError(_at(text, path, i, "registry.build", f"kernel {k.name!r}: {why}",
                                        "the entry was edited by hand; rebuild the registry"))
            named = (k.gfx_arch, k.name)   # (a binary is kernels/<arch>/<name>.*: one name per arch)
            if named in names or not reg.add(ent):
                raise RegistryError(_at(text, path, i, "registry.duplicate",
                                        f"kernel {k.name!r} appears twice" + (
                                            "" if named not in names else f" for {k.gfx_arch} (two kernels of one "
                                            "name: the name is its binary's file name)"), "remove the duplicate entry"))
            names.add(named)
        if model.metadata.total_kernels != len(reg):
            raise RegistryError(Diagnostic(
                "registry.count", f"metadata.total_kernels is {model.metadata.total_kernels} but the file lists "
                f"{len(reg)} kernels", Span(path, 1, 1), "the file was truncated or edited; rebuild it"))
        check_summary(reg, doc, model.metadata, path)
        if reg.seqtune is not None:
            check_table(reg, path)
        return reg

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Registry":
        """The registry file at ``path``, or a build directory's (schema-checked)."""
        p = registry_path(path)
        reg = cls.from_json(read_text(p), p)
        reg.path = os.path.abspath(p)
        return reg


# ---- registry files: this module is the one place that opens them -------------------------------
REGISTRY_FILE = "registry.json"


def registry_path(path: str | os.PathLike) -> str:
    """A build directory's ``registry.json``, or ``path`` itself when it is not a directory."""
    p = os.fspath(path)
    if os.path.isdir(p) and os.path.basename(os.path.normpath(p)) != REGISTRY_FILE:
        return os.path.join(p, REGISTRY_FILE)
    return p   # (a directory named registry.json is said to be one by whoever opens it)


MAX_REGISTRY_BYTES = 1 << 30   # 1 GiB: far past any registry a build writes (one line of JSON a kernel)


def read_text(path: str | os.PathLike) -> str:
    """The text of a registry file; :class:`RegistryError` ``registry.missing`` / ``registry.unreadable``."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):   # (a folder: the message below)
            raise RegistryError(Diagnostic("registry.unreadable", f"`{p}` is not a regular file (a device, FIFO or "
                                           "socket)", None, "pass a registry.json file or a build directory"))
        if st.st_size > MAX_REGISTRY_BYTES:
            raise RegistryError(Diagnostic("registry.unreadable", f"`{p}` is {st.st_size:,} bytes, more than a "
                                           f"registry of {MAX_REGISTRY_BYTES:,} this reader takes", None,
                                           "pass a registry.json file that `fmha-dsl build` wrote"))
        with open(p, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise RegistryError(Diagnostic("registry.missing", f"no registry at `{p}`", None,
                                       "build one with `fmha-dsl build SET.fmha -o DIR`")) from None
    except IsADirectoryError:
        raise RegistryError(Diagnostic("registry.unreadable", f"`{p}` is a directory, not a registry file", None,
                                       "pass a build directory (holding registry.json) or a registry.json file")) \
            from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise RegistryError(Diagnostic("registry.unreadable", f"`{p}` is not UTF-8 text (byte {exc.start}, line "
                                       f"{line}): {exc.reason}", Span(p, line, 1),
                                       "registry files are JSON in UTF-8, as `fmha-dsl build` writes them")) from None
    except OSError as exc:
        raise RegistryError(Diagnostic("registry.unreadable", f"cannot read `{p}`: {exc.strerror or exc}", None,
                                       "check the path and its permissions")) from None


def loads(text: str, path: str | None = None):
    """JSON text of a registry file (or a seqtune table) parsed; :class:`RegistryError` ``registry.json``, located,
    when it is not JSON -- or nests too deeply, or holds a number of more digits than Python converts."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise RegistryError(Diagnostic("registry.json", f"key {exc.args[0]!r} appears twice in one object (JSON "
                                       "readers keep the last: a hand edit that looks applied is not)",
                                       Span(path, 1, 1), "keep one of the two")) from None
    except json.JSONDecodeError as exc:
        lines = text.split("\n")
        src = lines[exc.lineno - 1] if 0 < exc.lineno <= len(lines) else None
        raise RegistryError(Diagnostic("registry.json", f"not valid JSON: {exc.msg}",
                                       Span(path, exc.lineno, exc.colno, source_line=src),
                                       "was the file truncated or edited by hand?")) from None
    except RecursionError:
        why = "its arrays or objects nest too deeply"
    except ValueError as exc:   # an integer literal of more digits than int() converts
        digits = re.search(r"has (\d+) digits", str(exc))
        why = f"it holds a number of {digits.group(1)} digits" if digits else str(exc).splitlines()[0]
    raise RegistryError(Diagnostic("registry.json", f"not valid registry JSON: {why}", Span(path, 1, 1),
                                   "was the file truncated or edited by hand?")) from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return d


def readable_version(doc: dict) -> bool:
    """Whether this version reads a registry document's ``schema_version`` (none given: version 1; an int, not
    ``true`` or ``2.0``)."""
    v = doc.get("schema_version")
    return v is None or type(v) is int and v in READABLE_VERSIONS


def read_document(path: str | os.PathLike) -> dict:
    """A registry file as a raw JSON object, without the schema check (the report reads tables of registries this
    version's schema would refuse); :class:`RegistryError` when it is missing, unreadable or not a JSON object."""
    p = os.fspath(path)
    doc = loads(read_text(p), p)
    if not isinstance(doc, dict):
        raise RegistryError(Diagnostic("registry.json", f"registry `{p}` is not a JSON object", None))
    return doc


# ---- the JSON text, shared by Registry.to_json and the parallel build ----------------------------
def sort_key(e: Entry) -> tuple:
    return _sort_key(e)


def stat_row(e: Entry) -> tuple[str, str, str, str]:
    return (e.sig["family"], e.sig["dtype"], e.alg["pipeline"], e.arch)


def statistics(rows) -> dict[str, dict[str, int]]:
    """``by_family`` / ``by_dtype`` / ``by_pipeline`` / ``by_arch`` counts of (family, dtype, pipeline, arch) rows."""
    names = ("by_family", "by_dtype", "by_pipeline", "by_arch")
    c = {k: Counter() for k in names}
    for row in rows:
        for k, v in zip(names, row):
            c[k][v] += 1
    return {k: dict(sorted(v.items())) for k, v in c.items()}


def entry_line(e: Entry, dumps=json.JSONEncoder(separators=(",", ":")).encode,
               dumps_sorted=json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode) -> str:
    """One kernel as one line of JSON, keys sorted (signature/algorithm dicts are built sorted)."""
    d = {"algorithm": e.alg}
    if e.build is not None:
        d["build"] = json.loads(dumps_sorted(e.build))
    d.update(dtype=e.sig["dtype"], family=e.sig["family"], gfx_arch=e.arch, identifier=e.identifier,
             name=e.name, pipeline=e.alg["pipeline"], signature=e.sig, source=e.source)
    return dumps(d)


def document_chunks(name: str, archs, profiles, sources, stats: dict, lines: list[str],
                    seqtune: dict | None = None) -> Iterator[str]:
    """The registry file, in pieces: a sorted, indented head, then ``kernels``, one kernel per line.

    With a ``seqtune`` table the head carries it and ``schema_version`` is 2; without one the file is version 1
    (byte for byte what earlier versions wrote)."""
    from . import __version__

    meta = {"archs": list(archs), "generator": f"fmha-dsl {__version__}", "profiles": list(profiles),
            "registry_name": name, "sources": list(sources), "total_kernels": len(lines)}
    doc = {"metadata": meta, "schema_version": 1 if seqtune is None else SCHEMA_VERSION, "statistics": stats}
    if seqtune is not None:
        doc["seqtune"] = seqtune
    head = json.dumps(doc, sort_keys=True, indent=1)
    # `kernels` goes last (after the sorted head) so the small part of the file stays at the top
    yield head[:-2] + ',\n "kernels": [\n'
    for i, line in enumerate(lines):
        yield line if i == 0 else ",\n" + line
    yield ("\n" if lines else "") + " ]\n}\n"


def document(name: str, archs, profiles, sources, stats: dict, lines: list[str], seqtune: dict | None = None) -> str:
    return "".join(document_chunks(name, archs, profiles, sources, stats, lines, seqtune))


def _kernel_line(text: str, index: int) -> int | None:
    """Line of the index-th kernel (kernels are written one per line after `"kernels": [`)."""
    lines = text.split("\n")
    for n, line in enumerate(lines):
        if line.strip().startswith('"kernels"'):
            target = n + 1 + index
            return target + 1 if target < len(lines) else None
    return None


def _at(text, path, index, rule, msg, hint) -> Diagnostic:
    line = _kernel_line(text, index)
    src = text.split("\n")[line - 1] if line else None
    return Diagnostic(rule, msg, Span(path, line or 1, 1, source_line=src), hint)


def _schema_diags(exc, text: str, path: str | None) -> list[Diagnostic]:
    out = []
    for err in exc.errors()[:10]:
        loc = err["loc"]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        line = None
        if len(loc) >= 2 and loc[0] == "kernels" and isinstance(loc[1], int):
            line = _kernel_line(text, loc[1])
        src = text.split("\n")[line - 1][:200] if line else None
        typ = err.get("type", "")
        hint = "unknown field: remove it or check the spelling" if typ == "extra_forbidden" else (
            "a required field is missing" if typ == "missing" else "rebuild the registry with `fmha-dsl build`")
        out.append(Diagnostic("registry.schema", f"{where or '<root>'}: {err['msg']}",
                              Span(path, line or 1, 1, source_line=src), hint))
    return out




def json_schema() -> dict:
    """JSON Schema of a registry file (``fmha-dsl schema registry``)."""
    from .registry_schema import json_schema as schema

    return schema()


__all__ = ["loads", "Registry", "Entry", "SCHEMA_VERSION", "json_schema"]
