"""[report] What a report shows, as data: the seqtune table read from a registry, throughput numbers, short kernel
labels and the model of one class panel (:func:`_class_model`).  Drawing is :mod:`fmha_dsl.report_scene`'s;
the page and the image are :mod:`fmha_dsl.report`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import os

from .errors import FmhaError, RegistryError, UsageError, error
from .numeric import COUNT_MAX, TIME_RANGE_US, is_time, shown
from .registry import READABLE_VERSIONS, read_document, readable_version, registry_path

RULE = "report.no-table"
HINT = "run fmha-dsl tune DIR first"

Chooser = Callable[[dict, dict], "str | None"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd")


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def _fail(message: str, path: str | None = None) -> FmhaError:
    """The input is a registry without a usable table: an input error (exit 2)."""
    notes = (f"registry: {path}",) if path else ()
    return error(RULE, message, hint=HINT, notes=notes, cls=UsageError)


def load_table(build_dir_or_registry_json: str) -> tuple[dict, dict]:
    """Return ``(seqtune_table, kernels_by_identifier)``; FmhaError ``report.no-table`` when absent/malformed."""
    path = registry_path(build_dir_or_registry_json)
    if not os.path.exists(path):
        raise error("report.no-registry", f"no registry.json at `{path}`", None,
                    "build first: `fmha-dsl build FILE -o DIR` writes DIR/registry.json, then `fmha-dsl tune DIR` "
                    "(on the GPU) measures it for the report", cls=UsageError)
    try:
        doc = read_document(path)
    except RegistryError as e:  # not a table missing: a file that is not a registry at all
        hint = e.diagnostics[0].hint if e.rule == "registry.unreadable" else None
        raise error("report.bad-registry", e.message, e.diagnostics[0].span, hint or
                    "rebuild it: `fmha-dsl build FILE -o DIR` writes DIR/registry.json (then `fmha-dsl tune DIR` on "
                    "the GPU)", cls=UsageError) from None
    table = doc.get("seqtune")
    if table is None:
        raise _fail(f"registry {path} has no seqtune table", path)
    if not isinstance(table, dict) or not isinstance(table.get("classes"), list):
        raise _fail(f"the seqtune table of {path} is malformed (no \"classes\" list)", path)
    if not table["classes"]:
        raise _fail(f"the seqtune table of {path} has no measured classes", path)
    if not readable_version(doc):
        raise error("report.bad-registry", f"registry {path} has schema_version {doc.get('schema_version')!r}; "
                    f"this fmha-dsl reads {', '.join(map(str, READABLE_VERSIONS))}", None,
                    "rebuild it with this version: `fmha-dsl build FILE -o DIR`, then `fmha-dsl tune DIR`",
                    cls=UsageError)
    for i, c in enumerate(table["classes"]):
        if not isinstance(c, dict) or not isinstance(c.get("class"), dict) or not isinstance(c.get("points"), list) \
                or not c["points"]:
            raise _fail(f"seqtune class #{i} of {path} is malformed (needs \"class\" and a non-empty \"points\" "
                        "list)", path)
        why = _bad_class(c["class"])
        if why:
            raise _fail(f"seqtune class #{i} of {path} is malformed: {why}", path)
        for j, p in enumerate(c["points"]):
            why = _bad_point(p)
            if why:
                raise _fail(f"seqtune class #{i} point #{j} of {path} is malformed: {why}", path)
    kernels = {}
    for k in doc.get("kernels") or []:
        if isinstance(k, dict) and isinstance(k.get("identifier"), str):
            kernels[k["identifier"]] = k
    return table, kernels


_POINT_INTS = ("seqlen_q", "seqlen_k", "batch", "nhead_q")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= COUNT_MAX


def _bad_class(cls: dict) -> str | None:
    """What makes a class unusable for the report (None: nothing)."""
    if not cls:
        return "an empty class"
    ints = ("hdim_q", "hdim_v") + (("page_size",) if "page_size" in cls else ())   # (a serving class names it)
    names = ("family", "dtype") + tuple(k for k in ("mode", "mask", "kv_layout", "kv_lookup", "qscale")
                                        if cls.get(k) is not None)
    for k in ints:
        if not _count(cls.get(k)):
            return f"{k} must be an integer >= 1, got {cls.get(k)!r}"
    for k in names:
        if not isinstance(cls.get(k), str):
            return f"{k} must be a name, got {cls.get(k)!r}"
    return None


def _bad_point(p) -> str | None:
    """What makes a measured point unusable (None: nothing): counts in [1, 2**31), times finite and >= 1 ns."""
    if not isinstance(p, dict):
        return "not an object"
    for k in _POINT_INTS + (("nhead_k",) if "nhead_k" in p else ()):
        if not _count(p.get(k)):
            return f"{k} must be an integer in [1, 2**31), got {p.get(k)!r}"
    times = p.get("times_us", {})
    if not isinstance(times, dict) or not isinstance(p.get("failed", {}), dict):
        return "times_us and failed must map kernel names to values"
    for k, v in times.items():
        if not is_time(v):
            lo, hi = TIME_RANGE_US
            return f"the time of {k} must be a finite number of microseconds in [{lo}, {hi:g}], got {shown(v)}"
    return None


# ---------------------------------------------------------------------------------------------
# numbers
# ---------------------------------------------------------------------------------------------
def fastest_measured(cls: dict, point: dict) -> str | None:
    """Default chooser: the kernel with the smallest measured time at this point (ties: identifier order)."""
    times = {k: v for k, v in (point.get("times_us") or {}).items() if k not in (point.get("failed") or {})}
    if not times:
        return None
    return min(sorted(times), key=lambda k: times[k])


def _is_causal(cls: dict) -> bool:
    return str(cls.get("mask", "no")) not in ("no", "none", "no_mask", "n", "")


def point_flops(cls: dict, point: dict) -> float:
    dq = int(cls.get("hdim_q") or 0)
    dv = int(cls.get("hdim_v") or dq)
    flops = 2.0 * point["batch"] * point["nhead_q"] * point["seqlen_q"] * point["seqlen_k"] * (dq + dv)
    if _is_causal(cls):
        flops *= 0.5
    if "bwd" in str(cls.get("family", "")):
        flops *= 2.5
    return flops


def point_tflops(cls: dict, point: dict, time_us: float) -> float:
    """TFLOP/s of one measurement (formula in the module docstring)."""
    return point_flops(cls, point) / (time_us * 1e-6) / 1e12


DECODE_ROWS = 16          # a serving point of at most this many query rows per sequence is plotted as bandwidth
_ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8bf16": 1}   # (FP8: e4m3 caches)
BANDWIDTH_NOTE = "effective K/V bandwidth = K + V bytes read / time (B x Sk x Hk x (Dq + Dv) x element bytes)"


def is_serving(cls: dict) -> bool:
    """A class measured over a paged KV cache (``fmha_dsl.paged_attention``'s): it names its page size."""
    return "page_size" in cls


def is_decode(cls: dict, point: dict) -> bool:
    """A serving point of few query rows (decode, speculative decode): it reads K/V more than it computes, so it is
    plotted as effective K/V bandwidth (GB/s) rather than TFLOP/s."""
    return is_serving(cls) and point["seqlen_q"] <= DECODE_ROWS and point["seqlen_q"] < point["seqlen_k"]


def point_gbps(cls: dict, point: dict, time_us: float) -> float:
    """Effective K/V bandwidth of one measurement, GB/s (:data:`BANDWIDTH_NOTE`)."""
    dq = int(cls.get("hdim_q") or 0)
    dv = int(cls.get("hdim_v") or dq)
    nbytes = (point["batch"] * point["seqlen_k"] * point.get("nhead_k", point["nhead_q"]) * (dq + dv)
              * _ELEMENT_BYTES.get(str(cls.get("dtype")), 2))
    return nbytes / (time_us * 1e-6) / 1e9


def point_value(cls: dict, point: dict, time_us: float) -> tuple[float, str]:
    """What a measurement is plotted as: ``(GB/s, "GB/s")`` at a decode point of a serving class, else
    ``(TFLOP/s, "TFLOP/s")``."""
    if is_decode(cls, point):
        return point_gbps(cls, point, time_us), "GB/s"
    return point_tflops(cls, point, time_us), "TFLOP/s"


# ---------------------------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------------------------
_ID_RE = re.compile(r"_p([a-z0-9_]+?)_t(\d+(?:x\d+)*)_w(\d+(?:x\d+)*)_wt(\d+(?:x\d+)*)_pad(\d+)")


def _usable_algorithm(alg) -> bool:
    """An entry's ``algorithm`` the labels can read: an object whose tile, wave and warp are lists of ints and whose
    paddings are ints."""
    def ints(v):
        return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)

    return isinstance(alg, dict) and all(ints(alg.get(k) or []) for k in ("tile", "wave", "warp")) and all(
        isinstance(alg.get(k, 0), int) for k in ("pad_s", "pad_sk", "pad_d", "pad_dv"))


def _tokens(ident: str, kernel: dict | None) -> dict:
    """The algorithm tokens of a kernel: tile, wave (warps), warp tile, pipeline, padding."""
    alg = (kernel or {}).get("algorithm") or {}
    if alg and not _usable_algorithm(alg):   # a damaged entry: its label comes from the identifier
        alg = {}
    if alg:
        tile, wave, warp = (list(alg.get(k) or []) for k in ("tile", "wave", "warp"))
        pad = "".join(str(alg.get(k, 0)) for k in ("pad_s", "pad_sk", "pad_d", "pad_dv"))
        pipe = str(alg.get("pipeline") or (kernel or {}).get("pipeline") or "")
    else:
        m = _ID_RE.search(ident)
        if not m:
            return {"tile": [], "wave": [], "warp": [], "pipeline": "", "pad": "", "raw": ident}
        pipe, t, w, wt, pad = m.groups()
        tile, wave, warp = ([int(x) for x in s.split("x")] for s in (t, w, wt))
    return {"tile": tile, "wave": wave, "warp": warp, "pipeline": pipe, "pad": pad, "raw": ""}


def short_labels(identifiers: Iterable[str], kernels: dict) -> dict[str, str]:
    """Kernel identifier -> short legend label made of the tokens that differ between these kernels.

    Always starts with the tile (its shortest prefix that tells the tiles apart, at least m0 x n0);
    then warps (``w4x1x1``), warp tile (``wt32x32x16``), pipeline and padding (``pad1111``) where they
    differ.  Colliding labels get ``#2``, ``#3`` ...
    """
    ids = sorted(set(identifiers))
    toks = {i: _tokens(i, kernels.get(i)) for i in ids}
    tiles = [tuple(t["tile"]) for t in toks.values()]
    n = 2
    while n < max((len(t) for t in tiles), default=0) and len({t[:n] for t in tiles}) < len(set(tiles)):
        n += 1

    def varies(key, f=lambda v: v):
        return len({repr(f(t[key])) for t in toks.values()}) > 1

    out = {}
    for i in ids:
        t = toks[i]
        if t["raw"]:
            parts = [t["raw"][-48:]]
        else:
            parts = ["x".join(map(str, t["tile"][:n]))] if t["tile"] else []
            if varies("wave", lambda v: v[:3]):
                parts.append("w" + "x".join(map(str, t["wave"][:3])))
            if varies("warp", lambda v: v[:3]):
                parts.append("wt" + "x".join(map(str, t["warp"][:3])))
            if varies("pipeline") or len(ids) == 1 or not parts:
                parts.append(t["pipeline"])
            if varies("pad"):
                parts.append("pad" + t["pad"])
        out[i] = " ".join(p for p in parts if p) or i
    seen: dict[str, int] = {}
    for i in ids:
        lab = out[i]
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            out[i] = f"{lab} #{seen[lab]}"
    return out


def _class_title(cls: dict) -> str:
    fam, dt, mode = cls.get("family", "?"), cls.get("dtype", "?"), cls.get("mode", "?")
    dq, dv = cls.get("hdim_q", "?"), cls.get("hdim_v", "?")
    title = f"{fam} {dt} {mode} d{dq}/{dv} mask={cls.get('mask', 'no')}"
    if is_serving(cls):  # a paged KV cache: which one
        title += (f" page_size={cls['page_size']} lookup={cls.get('kv_lookup', '?')} "
                  f"kv_layout={cls.get('kv_layout', '?')}")
    return title


def _class_rest(cls: dict) -> str:
    shown = {"family", "dtype", "mode", "hdim_q", "hdim_v", "mask", "page_size", "kv_lookup", "kv_layout"}
    return " ".join(f"{k}={_fmt_val(cls[k])}" for k in sorted(cls) if k not in shown)


def _fmt_val(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _device_title(table: dict) -> str:
    dev = table.get("device") or {}
    if not isinstance(dev, dict):
        return str(dev)
    name = dev.get("name") or "unknown device"
    arch = dev.get("arch")
    return f"{name} ({arch})" if arch else str(name)


def _num(v: float) -> str:
    """Deterministic short number text."""
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"


def _coord(v: float) -> str:
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


# ---------------------------------------------------------------------------------------------
# the model of one class panel
# ---------------------------------------------------------------------------------------------
def _shape_groups(points: list[dict]) -> list[tuple[tuple, list[dict]]]:
    """Points split into lines: same (Hq, Hk, seqlen relation), then chains along seqlen.

    A chain is either one batch size or one token count (batch x seqlen_q, the issue's fixed-token matrix);
    the longest chain is taken first, so a matrix measured at batch 1 and at 16k tokens gives two lines.
    Key: (kind, value, Hq, Hk, eq, seqlen_q) with kind 0 = batch, 1 = tokens; x = seqlen_q (= seqlen_k) or
    seqlen_k.
    """
    by: dict[tuple, list[dict]] = {}
    for p in points:
        eq = p["seqlen_q"] == p["seqlen_k"]
        by.setdefault((p["nhead_q"], p.get("nhead_k", p["nhead_q"]), 0 if eq else 1, 0 if eq else p["seqlen_q"]),
                      []).append(p)
    out: list[tuple[tuple, list[dict]]] = []
    for (hq, hk, rel, sq), pts in sorted(by.items()):
        left = list(pts)
        while left:
            chains: dict[tuple, list[dict]] = {}
            for p in left:
                chains.setdefault((0, p["batch"]), []).append(p)
                chains.setdefault((1, p["batch"] * p["seqlen_q"]), []).append(p)
            (kind, val), chain = max(chains.items(), key=lambda kv: (len(kv[1]), -kv[0][0], -kv[0][1]))
            seen, line = set(), []
            for p in sorted(chain, key=lambda p: (p["seqlen_k"], p["seqlen_q"])):
                x = p["seqlen_q"] if rel == 0 else p["seqlen_k"]
                if x not in seen:  # one point per x on a line
                    seen.add(x)
                    line.append(p)
            out.append(((kind, val, hq, hk, rel, sq), line))
            ids = {id(p) for p in line}
            left = [p for p in left if id(p) not in ids]
    return out


def _x_of(key: tuple, p: dict) -> int:
    return p["seqlen_q"] if key[4] == 0 else p["seqlen_k"]


def _group_title(key: tuple) -> str:
    kind, val, hq, hk, eq, sq = key
    rel = "seqlen_q = seqlen_k" if eq == 0 else f"seqlen_q = {sq}"
    what = f"B={val}" if kind == 0 else f"B x seqlen_q = {val} tokens"
    return f"{what}, Hq={hq} Hk={hk}, {rel}"


def _class_model(entry: dict, kernels: dict, chooser: Chooser) -> dict:
    cls, points = entry["class"], entry["points"]
    ids = sorted({k for p in points for k in (p.get("times_us") or {})} |
                 {k for p in points for k in (p.get("failed") or {})})
    labels = short_labels(ids, kernels)
    colors = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(ids)}
    picks = []
    for p in points:
        sel = chooser(cls, p)
        picks.append(sel)
    return {"class": cls, "points": points, "ids": ids, "labels": labels, "colors": colors,
            "picks": picks, "groups": _shape_groups(points)}
