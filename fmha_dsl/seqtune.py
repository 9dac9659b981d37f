"""[seqtune] Measured per-sequence-length kernel selection: the table and its lookup (the cost model that ranks what
was not measured: :mod:`fmha_dsl.costmodel`, re-exported here).

Pure Python (no torch / triton at import).  The table lives in ``registry.json`` under ``"seqtune"`` (registry
``schema_version`` 2; the format is described in ``docs/registry.md``)::

    "seqtune": {"device": {"name", "arch", "driver", "triton", "torch", "compute_units"}, "shapes": "default",
                "classes": [{"class": {...signature class...}, "points": [{"seqlen_q", "seqlen_k", "batch",
                             "nhead_q", "nhead_k", "times_us": {kernel id: us}, "failed": {kernel id: why}}]}]}

A signature class is :data:`CLASS_FIELDS`; a serving class (a paged KV cache: ``fmha_dsl.paged_attention``) adds
:data:`PAGED_FIELDS`, so a table measured for one cache ranks only that cache's problems, and an FP8 one
:data:`SCALE_FIELDS` (per-tensor, per-page or per-token descales: other kernels).

Prediction of a kernel's time for a problem from the table (:func:`predict`, documented there): the kernel's
measured points of the problem's signature class, in rows of equal seqlen_q; interpolation in log seqlen_k inside
the rows around the problem's seqlen_q, then in log seqlen_q across them (a power law between neighbours); every
point carried to the problem's batch x heads by wave quantisation (``waves = ceil(programs / (CUs x occupancy))``, ``programs =
ceil(seqlen_q / m0) * nhead_q * batch``), and beyond the measured range by waves and key-loop length
``ceil(seqlen_k / n0)``.

Kernels with no data (or all kernels, with no usable table) are ranked by :func:`cost` (documented there).
Measured kernels always rank before unmeasured ones; ties go to the dispatcher's static preference.
"""

from __future__ import annotations

import bisect
import json
import math
import warnings
from typing import Iterable

from .costmodel import _cdiv, compute_units, cost, occupancy, programs, split_limit, splits_at, waves
from .kernels.fwd_abi import SEQ_ALIGN

CLASS_FIELDS = ("family", "dtype", "mode", "vlayout", "hdim_q", "hdim_v", "mask", "bias", "lse", "dropout",
                "logits", "sink")
# what a paged (serving) class adds: the cache's layout, table form and page size are compiled into the kernels, so a
# table measured for one never ranks the candidates of another (absent from the other classes, whose keys stay as
# they were)
PAGED_FIELDS = ("kv_layout", "kv_lookup", "page_size")
# what an FP8 class adds (its descales' granularity, CK's qscale: pertensor, kv_blockscale or per_token_head); absent
# elsewhere
SCALE_FIELDS = ("qscale",)
POINT_FIELDS = ("seqlen_q", "seqlen_k", "batch", "nhead_q", "nhead_k")


class SeqtuneDeviceWarning(UserWarning):
    """A seqtune table measured on another device (name or arch) than the current one: it is ignored."""


# ---------------------------------------------------------------------------------------------------------
# signature classes
# ---------------------------------------------------------------------------------------------------------
def _mask_class(m: str) -> str:
    return "no" if m == "no" else "causal"


def class_of_problem(p) -> dict:
    """The signature class of a problem (its own head dims; any causal/window mask is ``causal``); a problem over a
    paged KV cache (``paged_kv``: ``fmha_dsl.paged_attention``'s) adds :data:`PAGED_FIELDS`."""
    cls = {"family": p.family, "dtype": p.dtype, "mode": p.mode, "vlayout": p.vlayout, "hdim_q": int(p.hdim_q),
           "hdim_v": int(p.hdim_v), "mask": _mask_class(p.mask), "bias": p.bias, "lse": bool(p.lse),
           "dropout": bool(p.dropout), "logits": bool(p.logits), "sink": bool(p.sink)}
    if p.paged_kv:
        cls.update(kv_layout=p.kv_layout, kv_lookup=p.kv_lookup, page_size=int(p.page_size))
    if p.qscale != "no":
        cls["qscale"] = p.qscale
    return cls


def class_key(cls: dict) -> tuple:
    """The key of a class dict: :data:`CLASS_FIELDS`, then :data:`PAGED_FIELDS` and :data:`SCALE_FIELDS` (None where
    a class has none)."""
    return tuple(cls[f] for f in CLASS_FIELDS) + tuple(cls.get(f) for f in PAGED_FIELDS + SCALE_FIELDS)


def _class_dict(cls: dict) -> dict:
    """``cls`` reduced to its key fields (the paged and scale ones only where present)."""
    return {f: cls[f] for f in CLASS_FIELDS + PAGED_FIELDS + SCALE_FIELDS if f in cls}


def _class_sort(cls: dict) -> str:
    return json.dumps(cls, sort_keys=True)


# ---------------------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------------------
class Table:
    """The seqtune table: device, shape-matrix name, and per class ``{point tuple: {"times_us", "failed"}}``."""

    def __init__(self, device: dict | None = None, shapes: str = "default"):
        self.device = dict(device or {})
        self.shapes = shapes
        self.classes: dict[tuple, tuple[dict, dict]] = {}   # class key -> (class dict, {point: record})

    # -- building
    def _cls(self, cls: dict) -> dict:
        k = class_key(cls)
        got = self.classes.get(k)
        if got is None:
            got = self.classes[k] = (_class_dict(cls), {})
        return got[1]

    def record(self, cls: dict, point: tuple, kernel: str, time_us: float | None = None,
               failed: str | None = None) -> None:
        """Store one measurement (``time_us``) or failure (``failed``: the reason) of ``kernel`` at ``point``."""
        pts = self._cls(cls)
        rec = pts.setdefault(tuple(int(x) for x in point), {"times_us": {}, "failed": {}})
        if failed is not None:
            rec["failed"][kernel] = str(failed)
            rec["times_us"].pop(kernel, None)
        else:
            rec["times_us"][kernel] = round(float(time_us), 4)
            rec["failed"].pop(kernel, None)

    def has(self, cls: dict, point: tuple, kernel: str) -> bool:
        got = self.classes.get(class_key(cls))
        if got is None:
            return False
        rec = got[1].get(tuple(point))
        return rec is not None and (kernel in rec["times_us"] or kernel in rec["failed"])

    def failed(self, cls: dict, kernel: str) -> str | None:
        """The reason ``kernel`` failed on any point of ``cls`` (a wrong result or crash excludes it), or None."""
        got = self.classes.get(class_key(cls))
        if got is None:
            return None
        for pt in sorted(got[1]):
            why = got[1][pt]["failed"].get(kernel)
            if why is not None:
                return why
        return None

    def merge(self, other: "Table") -> "Table":
        """Add ``other``'s measurements (``other`` wins on the same point and kernel); returns self."""
        for cls, pts in other.classes.values():
            for pt, rec in pts.items():
                for kid, t in rec["times_us"].items():
                    self.record(cls, pt, kid, t)
                for kid, why in rec["failed"].items():
                    self.record(cls, pt, kid, failed=why)
        return self

    def points(self, cls: dict) -> dict:
        got = self.classes.get(class_key(cls))
        return got[1] if got else {}

    def __len__(self) -> int:
        return sum(len(p) for _, p in self.classes.values())

    # -- JSON form
    def to_dict(self) -> dict:
        classes = []
        for cls, pts in sorted(self.classes.values(), key=lambda cp: _class_sort(cp[0])):
            plist = []
            for pt in sorted(pts):
                rec = pts[pt]
                d = dict(zip(POINT_FIELDS, pt))
                d["times_us"] = dict(sorted(rec["times_us"].items()))
                if rec["failed"]:
                    d["failed"] = dict(sorted(rec["failed"].items()))
                plist.append(d)
            classes.append({"class": dict(sorted(cls.items())), "points": plist})
        return {"classes": classes, "device": dict(sorted(self.device.items())), "shapes": self.shapes}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Table | None":
        if not d:
            return None
        t = cls(d.get("device") or {}, d.get("shapes", "default"))
        for c in d.get("classes", ()):
            for p in c.get("points", ()):
                pt = tuple(int(p[f]) for f in POINT_FIELDS)
                for kid, us in (p.get("times_us") or {}).items():
                    t.record(c["class"], pt, kid, us)
                for kid, why in (p.get("failed") or {}).items():
                    t.record(c["class"], pt, kid, failed=why)
            t._cls(c["class"])
        return t

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    # -- the registry
    @classmethod
    def of(cls, registry) -> "Table | None":
        return cls.from_dict(getattr(registry, "seqtune", None))

    def store(self, registry) -> None:
        registry.seqtune = self.to_dict()


def device_mismatch(table: Table, arch: str | None, device_name: str | None) -> str | None:
    """Why ``table`` may not be used on (``arch``, ``device_name``), or None.  Unknown values are not compared."""
    tarch, tname = table.device.get("arch"), table.device.get("name")
    if arch and tarch and tarch != arch:
        return f"the seqtune table was measured on {tarch} ({tname or 'unknown device'}), this is {arch}"
    if device_name and tname and tname != device_name:
        return f"the seqtune table was measured on {tname!r}, this device is {device_name!r}"
    return None


def warn_ignored(why: str) -> None:
    warnings.warn(f"{why}: it is ignored (re-run `fmha-dsl tune` on this device)", SeqtuneDeviceWarning,
                  stacklevel=4)


# ---------------------------------------------------------------------------------------------------------
# buckets (the dispatcher's cache granularity)
# ---------------------------------------------------------------------------------------------------------
def seq_aligned(sq: int, sk: int, group: bool = False) -> tuple[bool, bool]:
    """Whether batch-mode lengths are multiples of ``SEQ_ALIGN`` (group mode: never): such problems also have
    unpadded first-use candidates, so the first-use decision keys record it."""
    if group:
        return False, False
    return sq > 0 and sq % SEQ_ALIGN == 0, sk > 0 and sk % SEQ_ALIGN == 0


def bucket(n: int) -> int:
    """Eighth-of-an-octave bucket of a positive length: exact below 16, then 8 linear steps per power of two."""
    if n < 16:
        return n
    e = n.bit_length() - 4
    return (e << 3) + (n >> e)      # n >> e is in 8 .. 15


def bucket_rep(b: int) -> int:
    """The smallest length in bucket ``b`` (powers of two represent their own bucket)."""
    if b < 16:
        return b
    e, m = divmod(b, 8)
    e -= 1
    return (8 + m) << e


# ---------------------------------------------------------------------------------------------------------
# prediction from measurements
# ---------------------------------------------------------------------------------------------------------
def _log(x: float) -> float:
    return math.log(max(x, 1e-12))


def predict(pts: dict, kernel: str, m0: int, n0: int, p, cus: int, splits: int = 0,
            occ: int = 1) -> tuple[float | None, list]:
    """Predicted time (us) of ``kernel`` on problem ``p`` from a class's points, and the points used.

    The measured points form rows of equal ``seqlen_q``.  In each row the time is interpolated in log(seqlen_k)
    between the two measured key lengths around the problem's (a power law between them); across rows it is
    interpolated in log(seqlen_q) between the two rows around the problem's.  Outside the measured range the
    nearest row / point is carried to the problem by the kernel's work model: waves of programs over the device's
    compute units (``ceil(sq/m0) x nhead_q x batch`` programs) and key blocks (``ceil(sk/n0)``).  Every measured
    point used is first carried to the problem's batch x heads the same way (per (seqlen_q, seqlen_k) the point
    of the nearest batch x heads is used), so a measured point equal to the problem gives its measured time.
    A split-KV kernel (``splits`` > 0: its split count) runs ``splits_at(...)`` times the programs, each over that
    fraction of the key blocks.  ``occ``: programs resident per compute unit (:func:`occupancy`), so a wave is
    ``cus x occ`` programs.
    """
    mine = [(pt, rec["times_us"][kernel]) for pt, rec in pts.items() if kernel in rec["times_us"]]
    if not mine:
        return None, []
    sq = max(int(p.max_seqlen_q or p.seqlen_q), 1)
    sk = max(int(p.max_seqlen_k or p.seqlen_k), 1)
    bh = p.batch * p.nhead_q
    rows: dict[int, dict[int, tuple]] = {}
    for pt, t in mine:
        d = abs(_log(pt[2] * pt[3]) - _log(bh))
        cur = rows.setdefault(pt[0], {}).get(pt[1])
        if cur is None or (d, pt) < (cur[0], cur[1]):
            rows[pt[0]][pt[1]] = (d, pt, t)

    def work(s_q: int, s_k: int, batch: int, heads: int) -> int:
        """Waves x key blocks per program."""
        nprog = programs(s_q, m0, heads, batch)
        ns = splits_at(splits, s_k, n0, nprog, cus, occ)
        return waves(nprog * ns, cus * occ) * _cdiv(_cdiv(max(s_k, 1), n0), ns)

    def carried(pt: tuple, t: float, to_sq: int, to_sk: int) -> float:
        """``t`` measured at ``pt``, carried to (to_sq, to_sk) at the problem's batch x heads."""
        return t * work(to_sq, to_sk, p.batch, p.nhead_q) / work(pt[0], pt[1], pt[2], pt[3])

    def between(xs: list, x: int, at) -> tuple[float, list]:
        """Interpolate ``at(x_i, x)`` (time, points) in log(x) over the sorted grid ``xs``."""
        i = bisect.bisect_left(xs, x)
        if i < len(xs) and xs[i] == x:
            return at(x, x)
        if i == 0 or i == len(xs):
            return at(xs[0] if i == 0 else xs[-1], x)
        lo, hi = xs[i - 1], xs[i]
        t0, p0 = at(lo, lo)
        t1, p1 = at(hi, hi)
        w = (_log(x) - _log(lo)) / (_log(hi) - _log(lo))
        return math.exp((1 - w) * _log(t0) + w * _log(t1)), p0 + p1

    def row(s_q: int, to_sq: int) -> tuple[float, list]:
        cells = rows[s_q]

        def cell(s_k: int, to_sk: int) -> tuple[float, list]:
            _, pt, t = cells[s_k]
            return carried(pt, t, to_sq, to_sk), [pt]

        return between(sorted(cells), sk, cell)

    return between(sorted(rows), sq, row)


def rank(p, candidates: Iterable, table: Table | None = None, arch: str | None = None,
         cus: int | None = None) -> list[dict]:
    """Candidates (already matching, in static preference order) ranked fastest first.

    Each row: ``{"entry", "source": "seqtune" | "cost-model" | "static", "predicted_us" (seqtune) or "cost",
    "points" (measured points used), "detail"}``.  Kernels that failed in tuning are left out (see
    :func:`excluded_by_table`).  Measured kernels first (by predicted time), then the others by the cost model when
    every one of them has a build (resource usage), else in the given order.
    """
    cands = list(candidates)
    cus = cus or compute_units(arch, table)
    cls = class_of_problem(p)
    pts = table.points(cls) if table is not None else {}
    measured, rest = [], []
    for i, e in enumerate(cands):
        if table is not None and table.failed(cls, e.identifier):
            continue
        t, used = predict(pts, e.identifier, int(e.alg["tile"][0]), int(e.alg["tile"][1]), p, cus,
                          split_limit(e), occupancy(e, arch)) if pts else (None, [])
        if t is not None:
            measured.append((t, i, {"entry": e, "source": "seqtune", "predicted_us": t,
                                    "points": [dict(zip(POINT_FIELDS, pt)) for pt in used]}))
        else:
            rest.append((i, e))
    out = [row for _, _, row in sorted(measured, key=lambda r: (r[0], r[1]))]
    if rest and all(getattr(e, "build", None) for _, e in rest):
        scored = []
        for i, e in rest:
            c, detail = cost(e, p, arch, cus)
            scored.append((c, i, {"entry": e, "source": "cost-model", "cost": c, "detail": detail}))
        out += [row for _, _, row in sorted(scored, key=lambda r: (r[0], r[1]))]
    else:
        out += [{"entry": e, "source": "static"} for _, e in rest]
    return out


def excluded_by_table(p, candidates: Iterable, table: Table | None) -> list[tuple]:
    """``[(entry, reason)]`` for candidates the table records as failed (crash or wrong result)."""
    if table is None:
        return []
    cls = class_of_problem(p)
    out = []
    for e in candidates:
        why = table.failed(cls, e.identifier)
        if why:
            out.append((e, f"failed in tuning: {why}"))
    return out


# ---------------------------------------------------------------------------------------------------------
# CK's first-fit rule (reference section 5.2), for comparison only
# ---------------------------------------------------------------------------------------------------------
def ck_first_fit(p, candidates: Iterable):
    """CK ``select_first_fit``: score ``(category, selection_rank, m0)``, lowest wins, ties keep the earlier.

    Category: 0 if ``max_sq <= m0`` and aligned, 1 if ``m0 == 64``, 2 if ``m0`` is the largest ``m0`` among the
    candidates, 3 if aligned (``max_sq % m0 == 0``), else 4.
    """
    cands = list(candidates)
    if not cands:
        return None
    max_sq = int(p.max_seqlen_q or p.seqlen_q)
    max_m0 = max(int(e.alg["tile"][0]) for e in cands)
    best, best_score = None, None
    for e in cands:
        m0 = int(e.alg["tile"][0])
        aligned = m0 > 0 and max_sq > 0 and max_sq % m0 == 0
        if max_sq <= m0 and aligned:
            cat = 0
        elif m0 == 64:
            cat = 1
        elif m0 == max_m0:
            cat = 2
        elif aligned:
            cat = 3
        else:
            cat = 4
        score = (cat, int(e.alg["selection_rank"]), m0)
        if best_score is None or score < best_score:
            best, best_score = e, score
    return best


__all__ = ["Table", "SeqtuneDeviceWarning", "class_of_problem", "class_key",
           "device_mismatch", "bucket", "bucket_rep", "programs", "waves", "split_limit", "splits_at", "occupancy", "cost", "predict", "rank",
           "excluded_by_table", "ck_first_fit", "compute_units", "CLASS_FIELDS", "PAGED_FIELDS", "SCALE_FIELDS",
           "POINT_FIELDS"]
