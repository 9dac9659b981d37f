"""The per-device table of first-use decisions: their keys, the table file, the tables shipped with the package.

A compiling dispatcher (``Dispatcher(None, builder=...)``, what :func:`fmha_dsl.attention` uses without a registry)
decides once per *decision key* -- the problem class (every field that selects a kernel, the head dims, whether
the arguments keep the 16-byte promise, the GQA group size's octave, a sliding window's octave where it is below
the key length's: :func:`window_octave`) plus the octave of ``max_seqlen_q``, of
``max_seqlen_k`` and of ``batch x nhead_q`` and whether the lengths are multiples of 128 (:func:`key`) -- and
records what it measured (:func:`record_of`) in a :class:`TunedTable`.  Later processes on the same device read the
record and compile (or load from the artifact cache) only the winner (a shipped decision with close runners-up is
timed again first, once per device).

Records live in ``<cache>/tuned/<arch>__<device>.json`` (:func:`fmha_dsl.cache.cache_base`), written atomically
and merged under a file lock, so concurrent processes never lose each other's records.  Tables shipped with the
package (``fmha_dsl/data/tuned/*.json``, measured on named devices, with date and provenance: :func:`shipped`) are
read after the user's own; a shipped decision's close runners-up (:func:`close_runners_up`) are timed again on the
user's machine (:mod:`fmha_dsl.runtime.autotune`).  This module measures and compiles nothing.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

from fmha_dsl import knobs
from fmha_dsl.errors import FmhaError
from fmha_dsl.numeric import is_time
from fmha_dsl.seqtune import seq_aligned

VERSION = 2
_FIELDS = ("family", "dtype", "mode", "vlayout", "bias", "lse", "dropout", "logits", "sink")


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
    w = window_octave(p.window_left, p.window_right, sk) if p.mask != "no" else 0
    if w:
        parts.append("w%d" % w)
    oq, ok, obh, aq, ak = buckets(sq, sk, p.batch * p.nhead_q, p.mode == "group")
    parts += ["q%d%s" % (oq, "a" if aq else ""), "k%d%s" % (ok, "a" if ak else ""), "bh%d" % obh]
    return ".".join(parts)


def window_octave(window_left: int, window_right: int, sk: int | None = None) -> int:
    """The octave of a sliding window's span (``left + right + 1`` keys a row sees), 0 when either side is unbounded
    (a causal mask alone) or, given the key length ``sk``, when the span's octave is not below ``sk``'s (the window
    then leaves most keys visible).  Part of a decision key: a window much shorter than the sequence makes each
    program visit a few key blocks, and smaller tiles win (``fmha_dsl.costmodel.window_blocks``).  With ``sk`` the
    value is the same for every key length of one octave (the torch fast path serves a recipe over that span)."""
    if window_left < 0 or window_right < 0:
        return 0
    w = octave(window_left + window_right + 1)
    return w if sk is None or w < octave(sk) else 0


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

    def is_shipped(self, k: str) -> bool:
        """Whether the decision for ``k`` comes from a table shipped with the package (this device has none of its
        own for ``k``)."""
        with self._lock:
            self._load()
            return k not in self._own and k in self._shipped

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
    except (OSError, ValueError, RecursionError):   # (ValueError: bad JSON, or an int of too many digits)
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
    """A decision record's shape: key fields as objects, the winner's name a string, times (when given) an object."""
    return (isinstance(rec, dict) and isinstance(rec.get("sig"), dict) and isinstance(rec.get("alg"), dict)
            and isinstance(rec.get("kernel", ""), str)
            and all(isinstance(rec.get(t, {}), dict) for t in ("times_us", "sustained_us")))


def _merge_write(path: str, arch: str, device: str | None, new: dict) -> str | None:
    """Add ``new`` to the table file under an exclusive lock (other processes' records are kept), written
    atomically (:func:`fmha_dsl.atomic_file.write_atomic`).  Returns None, or why nothing was written."""
    from fmha_dsl.atomic_file import write_atomic

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
    return shipped_tables(arch).get(device, {})


def shipped_tables(arch: str) -> dict:
    """``{device name: decisions}`` of every table shipped with the package for ``arch``; none with
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
        except (OSError, ValueError, RecursionError):
            continue
        dev = doc.get("device") if isinstance(doc, dict) else None
        if dev is not None and not isinstance(dev, str):  # a damaged table: left out, like one that does not parse
            continue
        if isinstance(doc, dict) and doc.get("version") == VERSION and doc.get("arch") == arch:
            decided = doc.get("decisions") if isinstance(doc.get("decisions"), dict) else {}
            out.setdefault(dev, {}).update({k: v for k, v in decided.items() if _valid(v)})
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


CONFIRM_SPREAD = 1.06  # a shipped decision's runners-up this close to its winner are timed again on first use
CONFIRM_MAX = 4        # ... at most this many of them (the closest)


def close_runners_up(rec: dict | None) -> list[str]:
    """The names of a recorded decision's runners-up within :data:`CONFIRM_SPREAD` of its winner, closest first (at
    most :data:`CONFIRM_MAX`), by the times that decided it: the finalists' sustained ones when it has them, else
    every candidate's.  Empty for a record without times."""
    if not isinstance(rec, dict):
        return []
    times = rec.get("sustained_us") or rec.get("times_us")
    win = rec.get("kernel")
    if not isinstance(times, dict) or not isinstance(win, str) or not is_time(times.get(win)):
        return []
    limit = CONFIRM_SPREAD * times[win]
    close = sorted((t, n) for n, t in times.items() if n != win and is_time(t) and t <= limit)
    return [n for _, n in close[:CONFIRM_MAX]]


__all__ = ["VERSION", "octave", "buckets", "key", "gqa_octave", "device_slug", "TunedTable", "shipped",
           "shipped_tables", "record_of", "close_runners_up", "CONFIRM_SPREAD", "CONFIRM_MAX"]
