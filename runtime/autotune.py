"""Selection by measurement on first use, and the per-device table that remembers it.

A compiling dispatcher (``Dispatcher(None, builder=...)``, what :func:`fmha_dsl.attention` uses without a registry)
decides once per *decision key* -- the problem class (every field that selects a kernel, the head dims, whether
the arguments keep the 16-byte promise, the GQA group size's octave) plus the octave of ``max_seqlen_q``, of
``max_seqlen_k`` and of ``batch x nhead_q`` and whether the lengths are multiples of 128 (:func:`key`).  On the first call of a key it compiles the rule-checked candidates the cost
model ranks highest, times each on the caller's own arguments, keeps the fastest and records it here.  Later
processes on the same device read the record and compile (or load from the artifact cache) only the winner.

Records live in ``<cache>/tuned/<arch>__<device>.json`` (:func:`fmha_dsl.cache.cache_base`), written atomically
and merged under a file lock, so concurrent processes never lose each other's records.  Tables shipped with the
package (``fmha_dsl/data/tuned/*.json``, measured on named devices, with date and provenance) are read after the
user's own.  ``FMHA_DSL_AUTOTUNE=0`` turns measuring off (the cost model's first choice is compiled instead).

:class:`MeasuredSelection` is the dispatcher's half of it (the dispatcher inherits it): the builder it was handed
compiles, the caller's ``measure`` launches and times; this module imports no compiler and launches nothing itself.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import TYPE_CHECKING

from fmha_dsl import costmodel, knobs
from fmha_dsl.errors import FmhaError, error
from fmha_dsl.seqtune import seq_aligned

from .match import describe, mismatches, no_kernel_error
from .race import race

if TYPE_CHECKING:
    from fmha_dsl.registry import Entry

VERSION = 2
_FIELDS = ("family", "dtype", "mode", "vlayout", "bias", "lse", "dropout", "logits", "sink")


def enabled() -> bool:
    return knobs.autotune()


def use_shipped() -> bool:
    return knobs.tuned_shipped()


def octave(n: int) -> int:
    """``n``'s power-of-two bucket: 0 for 0, else its bit length (1 -> 1, 2..3 -> 2, 1024..2047 -> 11)."""
    return max(int(n), 0).bit_length()


def buckets(sq: int, sk: int, bh: int, group: bool = False) -> tuple:
    """The lengths' part of a decision key: octaves of ``sq``, ``sk`` and ``bh``, and (batch mode) whether ``sq`` and
    ``sk`` are multiples of ``SEQ_ALIGN`` (such problems also have unpadded candidates)."""
    return (octave(sq), octave(sk), octave(bh)) + seq_aligned(sq, sk, group)


def key(p, aligned: bool = True) -> str:
    """The decision key of problem ``p`` (a :class:`fmha_dsl.keys.Problem`), as a stable string."""
    fam = "fwd" if p.family == "fwd_splitkv" and p.num_splits <= 1 else p.family
    parts = [fam] + [str(getattr(p, f)).lower() for f in _FIELDS[1:]]
    if fam.startswith("bwd"):
        parts += ["dbias" if p.dbias else "ndbias", "det" if p.deterministic else "ndet"]
    if p.paged_kv:
        parts += [p.kv_layout, p.kv_lookup, f"p{p.page_size}"]
    if p.rope != "none":
        parts.append(f"rope{p.rope}")
    if p.qscale not in ("no", "pertensor"):  # (an FP8 dtype's descales are per tensor unless the key says so)
        parts.append(p.qscale)
    parts += [f"d{p.hdim_q}x{p.hdim_v}", "mask" if p.mask != "no" else "nmask", "a" if aligned else "u",
              "g%d" % gqa_octave(p.nhead_q, p.nhead_k)]
    sq, sk = p.max_seqlen_q or p.seqlen_q, p.max_seqlen_k or p.seqlen_k
    oq, ok, obh, aq, ak = buckets(sq, sk, p.batch * p.nhead_q, p.mode == "group")
    parts += ["q%d%s" % (oq, "a" if aq else ""), "k%d%s" % (ok, "a" if ak else ""), "bh%d" % obh]
    return ".".join(parts)


def gqa_octave(nhead_q: int, nhead_k: int) -> int:
    """The octave of the GQA group size (0 for MHA): GQA problems have GQA-packed candidates, and the best
    packing depends on the group size."""
    g = nhead_q // max(nhead_k, 1)
    return 0 if g <= 1 else octave(g)


def device_slug(name: str | None) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name or "unknown").strip("-").lower() or "unknown"


class TunedTable:
    """Recorded decisions for one arch and device: ``key -> {"sig", "alg", "times_us", "kernel", ...}``."""

    def __init__(self, arch: str, device: str | None, folder: str | None = None, shipped: dict | None = None):
        self.arch, self.device = arch, device
        self.path = None
        if folder is not None:
            self.path = os.path.join(folder, "tuned", f"{arch}__{device_slug(device)}.json")
        self._own: dict[str, dict] = {}
        self._shipped = dict(shipped or {})
        self._lock = threading.Lock()
        self._loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self.path is not None:
            self._own = _read(self.path, self.arch, self.device)

    def get(self, k: str) -> dict | None:
        with self._lock:
            self._load()
            return self._own.get(k) or self._shipped.get(k)

    def record(self, k: str, rec: dict) -> str | None:
        """Remember ``rec`` under ``k`` and persist it (merged with what other processes wrote).  Returns None, or
        why it could not be written (the decision still holds for this process)."""
        with self._lock:
            self._load()
            self._own[k] = rec
            if self.path is None:
                return None
            return _merge_write(self.path, self.arch, self.device, {k: rec})


def _document(path: str) -> dict | None:
    """A table file's JSON object; None when it is missing or damaged (then rewritten)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _conflict(doc: dict | None, arch: str, device: str | None) -> str | None:
    """Why a table document belongs to someone else (another format, arch or device), else None."""
    if doc is None:
        return None
    if doc.get("version") != VERSION:
        return f"written by another table format (version {doc.get('version')})"
    if doc.get("arch") != arch or (doc.get("device") and device and doc["device"] != device):
        return f"holds decisions for {doc.get('arch')} on {doc.get('device')}"
    return None


def _decisions(doc: dict | None, arch: str, device: str | None) -> dict:
    """The valid decisions of a table document made for ``arch`` and ``device`` (nothing otherwise)."""
    if doc is None or _conflict(doc, arch, device):
        return {}
    dec = doc.get("decisions")
    return {k: v for k, v in dec.items() if _valid(v)} if isinstance(dec, dict) else {}


def _read(path: str, arch: str, device: str | None) -> dict:
    return _decisions(_document(path), arch, device)


def _valid(rec) -> bool:
    return isinstance(rec, dict) and isinstance(rec.get("sig"), dict) and isinstance(rec.get("alg"), dict)


def _merge_write(path: str, arch: str, device: str | None, new: dict) -> str | None:
    """Add ``new`` to the table file under an exclusive lock (other processes' records are kept), written
    atomically (:func:`fmha_dsl.registry.write_atomic`).  Returns None, or why nothing was written."""
    from fmha_dsl.registry import write_atomic

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".lock", "a") as lock:
            try:
                import fcntl

                fcntl.flock(lock, fcntl.LOCK_EX)
            except (ImportError, OSError):  # pragma: no cover  (no flock: last writer wins per record set)
                pass
            doc = _document(path)
            other = _conflict(doc, arch, device)
            if other:
                return f"{path}: {other}; not overwritten"
            dec = dict(_decisions(doc, arch, device), **new)
            out = {"version": VERSION, "arch": arch, "device": device, "decisions": dict(sorted(dec.items()))}
            write_atomic(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    except FmhaError as exc:  # write_atomic's located write error
        return exc.message
    return None


def shipped(arch: str, device: str | None) -> dict:
    """Decisions shipped with the package for this arch and device name (exact name match); none with
    ``FMHA_DSL_TUNED_SHIPPED=0``."""
    from importlib import resources

    out: dict = {}
    if not use_shipped():
        return out
    try:
        folder = resources.files("fmha_dsl.data").joinpath("tuned")
        files = sorted(p for p in folder.iterdir() if p.name.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError, ModuleNotFoundError, OSError):
        return out
    for p in files:
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if doc.get("version") == VERSION and doc.get("arch") == arch and doc.get("device") == device:
            out.update({k: v for k, v in (doc.get("decisions") or {}).items() if _valid(v)})
    return out


def record_of(entry, times_us: dict, names: dict, sustained_us: dict | None = None) -> dict:
    """What a decision stores: the winner's key fields, its name, every candidate's time (by name) and, when the
    finalists were timed sustained (:func:`runtime.race.race`), theirs, which decided."""
    def by_name(times):
        return {names[i]: round(t, 3) for i, t in sorted(times.items(), key=lambda kv: kv[1])}

    rec = {"sig": dict(entry.sig), "alg": {k: list(v) if isinstance(v, tuple) else v for k, v in entry.alg.items()},
           "kernel": entry.name, "date": time.strftime("%Y-%m-%d"), "times_us": by_name(times_us)}
    if sustained_us:
        rec["sustained_us"] = by_name(sustained_us)
    return rec


# ---------------------------------------------------------------------------------------------------------------
# selection by measurement (the Dispatcher's first-use half)
# ---------------------------------------------------------------------------------------------------------------
class MeasuredSelection:
    """First-use selection for :class:`fmha_dsl.runtime.dispatch.Dispatcher` (which inherits it).  It uses the
    dispatcher's ``arch``, ``entries``, ``builder``, ``tuned``, ``compute_units``, ``registry``, ``_lock``,
    ``_decided``, ``measured``, ``add_many()`` and ``plan_for()``."""

    def _first_use(self, p, aligned: bool, measure) -> Entry:
        tk = key(p, aligned)
        e = self._decided.get(tk)  # decided keys never wait for another key's compile
        if e is not None:
            return e
        with self._lock:
            e = self._decided.get(tk)
            if e is not None:
                return e
            no_build = knobs.no_build()
            got = self._recorded(tk, p, aligned, cache_only=no_build)
            if got is not None:
                self._decided[tk] = got
                return got
            if no_build:
                raise no_kernel_error(p, self.arch, self.entries, self.registry.name, self.registry.archs, aligned)
            cands = self.builder.candidates(p, self.arch, aligned)
            if not cands:
                raise error("runtime.jit", f"the Triton rules allow no kernel for {describe(p)} on {self.arch}",
                            None, "the head dims, dtype or features exceed what the Triton template supports here")
            timed = measure is not None and enabled()
            if timed:
                built = self._serving(self._compile(cands, aligned), p, aligned)
            else:  # a few at a time, until one compiles without spilling (or none is left)
                built = []
                for i in range(0, len(cands), _UNTIMED):
                    built += self._serving(self._compile(cands[i:i + _UNTIMED], aligned), p, aligned)
                    if built and (len(_without_spills(built)) < len(built) or not any(_spills(x) for x in built)):
                        break
            if not built:
                raise error("runtime.jit", f"no candidate kernel for {describe(p)} on {self.arch} compiled", None,
                            "report this with the problem's shapes; meanwhile pass a registry built elsewhere")
            if timed and len(built) > 1:  # measured: a kernel whose resource report shows a stack frame (counted
                # as spills) may still be the fastest (sm90's (128, 64, 4) d128 tiles are), the timing decides
                e = self._measured(p, aligned, built, measure)
            else:  # the cost model: never a candidate that spills while one that does not exists
                e = self._cheapest(p, built)
            self._decided[tk] = e
            return e

    def _current(self, tk: str, p) -> dict | None:
        """The recorded decision for ``tk`` when it was measured under this builder's candidate space for ``p``'s
        family; None when there is none or it is stale (another template or candidate space: measured again)."""
        rec = self.tuned.get(tk) if self.tuned is not None else None
        if not isinstance(rec, dict) or rec.get("space") != getattr(self.builder, "fingerprint",
                                                                    lambda family: None)(p.family):
            return None
        return rec

    def decided_kernel(self, p, aligned: bool) -> str | None:
        """The name of the kernel first use would run for ``p`` without measuring anything: decided in this process
        or recorded under the current candidate space; None when it would be chosen afresh."""
        tk = key(p, aligned)
        e = self._decided.get(tk)
        if e is not None:
            return e.name
        rec = self._current(tk, p)
        return rec.get("kernel") if rec is not None else None

    def _recorded(self, tk: str, p, aligned: bool, cache_only: bool) -> Entry | None:
        """The recorded decision for ``tk`` (measured under this builder's candidate space), compiled or loaded from
        the artifact cache (only loaded with ``cache_only``); None when there is none or it cannot serve ``p``."""
        rec = self._current(tk, p)
        if rec is None:
            return None
        try:
            want = self.builder.entry_for(rec["sig"], rec["alg"], self.arch)
            got = self._compile([want], aligned, cache_only)
        except (KeyError, TypeError, ValueError, AttributeError):  # a damaged record: as if there were none
            return None
        return got[0] if got and not mismatches(got[0], p, aligned) else None

    def _serving(self, entries: list, p, aligned: bool) -> list:
        """The compiled entries that serve ``p`` (a split kernel serves a plain forward problem once its combine
        kernel is built; a ``num_splits`` request needs a split kernel that allows as many)."""
        return [e for e in entries if not mismatches(e, p, aligned)]

    def _cheapest(self, p, entries: list) -> Entry:
        if len(entries) == 1:  # nothing to rank (append-KV has one kernel per key)
            return entries[0]
        return min(_without_spills(entries),
                   key=lambda x: (costmodel.cost(x, p, self.arch, self.compute_units)[0], x.identifier))

    def _compile(self, entries, aligned: bool, cache_only: bool = False) -> list[Entry]:
        """Compile (or load) ``entries`` through the builder and add them; the ones that compiled, in order.
        ``cache_only``: load from the artifact cache, compile nothing (``FMHA_DSL_NO_BUILD``)."""
        have = {e.identifier: e for e in self.entries}
        out, new = [], []
        todo = [e for e in entries if e.identifier not in have]
        for res in (self.builder.compile(todo, aligned, cache_only=True) if cache_only else
                    self.builder.compile(todo, aligned)):
            e, bins = res
            if isinstance(bins, dict):
                new.append((e, bins))
                have[e.identifier] = e
        if new:
            self.add_many(new)
        for e in entries:
            if e.identifier in have and (have[e.identifier].build or {}):
                out.append(have[e.identifier])
        return out

    def _measured(self, p, aligned: bool, cands: list, measure) -> Entry:
        """Time every candidate on the caller's arguments (``measure``: :func:`runtime.race.race`), keep the
        winner and record the decision."""
        tk = key(p, aligned)
        if self.tuned is not None and self.builder is None:
            rec = self.tuned.get(tk)
            if rec is not None:
                for e in cands:
                    if e.name == rec.get("kernel") and dict(e.sig) == rec["sig"]:
                        return e
        by_id = {e.identifier: e for e in cands}
        got = race(measure, {e.identifier: self.plan_for(e, p) for e in cands})
        if got is None:  # nothing could be timed (e.g. no memory for the L2 flush): the cost model decides
            import warnings

            warnings.warn(f"fmha-dsl: no candidate for {describe(p)} could be timed; the cost model chose",
                          RuntimeWarning, stacklevel=3)
            return self._cheapest(p, cands)
        win_id, times, sustained = got
        win = by_id[win_id]
        names = {i: by_id[i].name for i in times}
        if self.tuned is not None:
            rec = record_of(win, times, names, sustained)
            if self.builder is not None:
                rec["space"] = self.builder.fingerprint(p.family)
            self.record_decision(tk, rec)
        self.measured[tk] = {names[i]: t for i, t in times.items()}
        return win

    def record_decision(self, tk: str, rec: dict) -> None:
        """Record a measured decision under key ``tk`` in the tuned table (persisted with the others); when it cannot
        be written the decision holds for this process, later ones measure again, and one warning says why."""
        why = self.tuned.record(tk, rec)
        if why and not self._write_warned:
            import warnings

            self._write_warned = True
            warnings.warn(f"fmha-dsl: first-use decisions cannot be recorded ({why}); set FMHA_DSL_CACHE_DIR "
                          "to a writable folder", RuntimeWarning, stacklevel=4)


_UNTIMED = 4   # candidates compiled when the choice is the cost model's (it weighs the builds' resource reports)
MAX_TIMED = 16  # registry candidates a first-use measurement times at most (the static order's first)


def _spills(e) -> int:
    return int(((e.build or {}).get("resources") or {}).get("spills") or 0)


def _without_spills(entries: list) -> list:
    """Never a candidate that spills while one that does not exists (the build's resource report)."""
    clean = [e for e in entries if not _spills(e)]
    return clean or entries


__all__ = ["enabled", "octave", "buckets", "key", "TunedTable", "shipped", "record_of", "device_slug",
           "MeasuredSelection", "MAX_TIMED"]
