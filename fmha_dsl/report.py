"""``fmha-dsl report``: see a build directory's seqtune table (issue 4, section "4. See it").

:func:`write_report` reads ``registry.json`` (a build directory or the file itself), takes its
``"seqtune"`` table (format: ``docs/registry.md`` / :mod:`fmha_dsl.seqtune`) and writes

* ``*.html`` -- one static, self-contained page: inline CSS, one inline SVG per signature class,
  one table per class; no JavaScript, no network, opens from disk;
* ``*.png`` -- the same charts as an image.  With matplotlib importable it draws them; otherwise a
  built-in pure-Python rasteriser (lines, discs, a 5x8 bitmap font) draws them and the PNG is
  encoded with ``zlib`` + ``struct``.  :func:`png_backend` says which one is used.

Both are drawn from one list of primitives (a "scene") per class, so the page and the image show
the same charts.  Output is deterministic: the same registry gives the same bytes.

Charts (one panel per signature class; a class whose points have several batch/head shapes gets
one sub-plot per shape inside its panel):

* TFLOP/s vs seqlen (log2 x axis), a line per kernel, legend with the kernel name shortened to its
  distinguishing tokens (tile, warps, warp tile, pipeline, padding);
* at every measured point the kernel the selection picks is ringed (``chooser``: by default the
  fastest measured there; pass the real selector to show its picks);
* the bucket boundaries (the measured seqlens) as dashed vertical guides;
* title: device and class.

Throughput formula (documented in the page as well)::

    flops  = 2 * B * Hq * Sq * Sk * (Dq + Dv)      # = 4*B*Hq*Sq*Sk*D when Dq == Dv == D
    flops *= 0.5   if the class mask is not "no"   # causal / top_left / bottom_right (approx. for Sq != Sk)
    flops *= 2.5   if the class family is a backward pass (the usual FlashAttention convention)
    TFLOP/s = flops / (time_us * 1e-6) / 1e12
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from collections.abc import Callable, Iterable

from .errors import FmhaError, RegistryError, error
from .registry import read_document, registry_path, write_atomic

__all__ = [
    "fastest_measured",
    "load_table",
    "png_backend",
    "point_tflops",
    "render_html",
    "render_png",
    "short_labels",
    "write_report",
]

RULE = "report.no-table"
HINT = "run fmha-dsl tune DIR first"

Chooser = Callable[[dict, dict], "str | None"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd")
FONT_FAMILY = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CHAR_W = 6.0  # logical px per character at text scale 1 (SVG font-size 10 monospace ~ 6 px advance)


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------
def _fail(message: str, path: str | None = None) -> FmhaError:
    notes = (f"registry: {path}",) if path else ()
    return error(RULE, message, hint=HINT, notes=notes)


def load_table(build_dir_or_registry_json: str) -> tuple[dict, dict]:
    """Return ``(seqtune_table, kernels_by_identifier)``; FmhaError ``report.no-table`` when absent/malformed."""
    path = registry_path(build_dir_or_registry_json)
    try:
        doc = read_document(path)
    except RegistryError as e:
        raise _fail(e.message, path) from None
    table = doc.get("seqtune")
    if table is None:
        raise _fail(f"registry {path} has no seqtune table", path)
    if not isinstance(table, dict) or not isinstance(table.get("classes"), list):
        raise _fail(f"the seqtune table of {path} is malformed (no \"classes\" list)", path)
    if not table["classes"]:
        raise _fail(f"the seqtune table of {path} has no measured classes", path)
    for i, c in enumerate(table["classes"]):
        if not isinstance(c, dict) or not isinstance(c.get("class"), dict) or not isinstance(c.get("points"), list):
            raise _fail(f"seqtune class #{i} of {path} is malformed (needs \"class\" and \"points\")", path)
        for j, p in enumerate(c["points"]):
            ok = isinstance(p, dict) and isinstance(p.get("times_us", {}), dict) and all(
                isinstance(p.get(k), int) and p.get(k) > 0
                for k in ("seqlen_q", "seqlen_k", "batch", "nhead_q"))
            if ok:
                ok = all(isinstance(v, (int, float)) and v > 0 for v in p.get("times_us", {}).values())
            if not ok:
                raise _fail(f"seqtune class #{i} point #{j} of {path} is malformed", path)
    kernels = {}
    for k in doc.get("kernels") or []:
        if isinstance(k, dict) and isinstance(k.get("identifier"), str):
            kernels[k["identifier"]] = k
    return table, kernels


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


# ---------------------------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------------------------
_ID_RE = re.compile(r"_p([a-z0-9_]+?)_t(\d+(?:x\d+)*)_w(\d+(?:x\d+)*)_wt(\d+(?:x\d+)*)_pad(\d+)")


def _tokens(ident: str, kernel: dict | None) -> dict:
    """The algorithm tokens of a kernel: tile, wave (warps), warp tile, pipeline, padding."""
    alg = (kernel or {}).get("algorithm") or {}
    if alg:
        tile = [int(x) for x in alg.get("tile") or []]
        wave = [int(x) for x in alg.get("wave") or []]
        warp = [int(x) for x in alg.get("warp") or []]
        pad = "".join(str(int(alg.get(k, 0))) for k in ("pad_s", "pad_sk", "pad_d", "pad_dv"))
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
    return f"{fam} {dt} {mode} d{dq}/{dv} mask={cls.get('mask', 'no')}"


def _class_rest(cls: dict) -> str:
    shown = {"family", "dtype", "mode", "hdim_q", "hdim_v", "mask"}
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


# ---------------------------------------------------------------------------------------------
# scene: primitives shared by the SVG and PNG renderers (logical px, y down)
# ---------------------------------------------------------------------------------------------
def _nice_step(span: float, n: int = 5) -> float:
    raw = span / n if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


W = 980
PLOT_L, PLOT_R = 78, 24
PLOT_H = 250


def _text(x, y, s, scale=1.0, anchor="start", color="#222", bold=False, rotate=False, **meta):
    return {"t": "text", "x": x, "y": y, "s": s, "scale": scale, "anchor": anchor, "color": color, "bold": bold,
            "rotate": rotate, "meta": meta}


def _line(x1, y1, x2, y2, color="#000", width=1.0, dash=None, **meta):
    return {"t": "line", "x1": x1, "y1": y1, "x2": x2, "y2": y2, "color": color, "width": width, "dash": dash,
            "meta": meta}


def _poly(pts, color, width=2.0, **meta):
    return {"t": "poly", "pts": pts, "color": color, "width": width, "meta": meta}


def _rect(x, y, w, h, fill, stroke=None, **meta):
    return {"t": "rect", "x": x, "y": y, "w": w, "h": h, "fill": fill, "stroke": stroke, "meta": meta}


def _circle(cx, cy, r, fill, stroke=None, sw=1.0, **meta):
    return {"t": "circle", "cx": cx, "cy": cy, "r": r, "fill": fill, "stroke": stroke, "sw": sw, "meta": meta}


def _wrap(s: str, width_px: float, scale: float = 1.0) -> list[str]:
    n = max(10, int(width_px / (CHAR_W * scale)))
    words, lines, cur = s.split(" "), [], ""
    for w_ in words:
        if cur and len(cur) + 1 + len(w_) > n:
            lines.append(cur)
            cur = w_
        else:
            cur = f"{cur} {w_}" if cur else w_
    if cur:
        lines.append(cur)
    return lines


def _scene(model: dict, device: str) -> tuple[list[dict], int]:
    """Primitives of one class panel and its height."""
    cls = model["class"]
    items: list[dict] = []
    y = 24.0
    items.append(_text(12, y, f"{device} -- {_class_title(cls)}", scale=1.5, bold=True))
    for ln in _wrap(_class_rest(cls), W - 24):
        y += 15
        items.append(_text(12, y, ln, color="#555"))
    y += 10
    pick_at = {id(p): s for p, s in zip(model["points"], model["picks"])}
    pw = W - PLOT_L - PLOT_R
    for key, pts in model["groups"]:
        y += 18
        items.append(_text(PLOT_L, y, _group_title(key), bold=True))
        top = y + 10
        bottom = top + PLOT_H
        xs = sorted({_x_of(key, p) for p in pts})
        lo, hi = math.log2(xs[0]), math.log2(xs[-1])
        if hi - lo < 1e-9:
            lo, hi = lo - 1, hi + 1
        pad = 0.06 * (hi - lo)
        lo, hi = lo - pad, hi + pad

        def X(v, lo=lo, hi=hi):
            return PLOT_L + (math.log2(v) - lo) / (hi - lo) * pw

        tf = {}
        for p in pts:
            for k, t in sorted((p.get("times_us") or {}).items()):
                if k not in (p.get("failed") or {}):
                    tf[(id(p), k)] = point_tflops(cls, p, t)
        ymax_raw = max(tf.values(), default=1.0)
        step = _nice_step(ymax_raw * 1.05)
        ymax = step * math.ceil(ymax_raw * 1.05 / step)

        def Y(v, top=top, ymax=ymax):
            return top + PLOT_H - v / ymax * PLOT_H

        items.append(_rect(PLOT_L, top, pw, PLOT_H, "#ffffff", "#999999", cls="plot"))
        # y grid + ticks
        nt = round(ymax / step)
        for i in range(nt + 1):
            v = i * step
            yy = Y(v)
            if 0 < i < nt:
                items.append(_line(PLOT_L, yy, PLOT_L + pw, yy, "#eeeeee", 1))
            items.append(_line(PLOT_L - 4, yy, PLOT_L, yy, "#666", 1))
            items.append(_text(PLOT_L - 7, yy + 3.5, _num(round(v, 6)), anchor="end", color="#444"))
        items.append(_text(20, top + PLOT_H / 2, "TFLOP/s", anchor="middle", rotate=True, color="#222"))
        # bucket guides at the measured seqlens + x tick labels
        last_lab = -1e9
        for v in xs:
            xx = X(v)
            items.append(_line(xx, top, xx, bottom, "#b0b0b0", 1, dash=(4, 3), cls="bucket", data_seqlen=str(v)))
            items.append(_line(xx, bottom, xx, bottom + 4, "#666", 1))
            lab = _num(v)
            half = len(lab) * CHAR_W / 2
            if xx - half > last_lab + 4:
                items.append(_text(xx, bottom + 15, lab, anchor="middle", color="#444"))
                last_lab = xx + half
        xl = "seqlen (q = k), log scale" if key[4] == 0 else "seqlen_k, log scale"
        items.append(_text(PLOT_L + pw / 2, bottom + 32, xl + "; dashed: bucket boundaries", anchor="middle"))
        # series
        for k in model["ids"]:
            col = model["colors"][k]
            seg: list[tuple[float, float]] = []
            segs = []
            for p in pts:
                if (id(p), k) in tf:
                    seg.append((X(_x_of(key, p)), Y(tf[(id(p), k)])))
                elif seg:
                    segs.append(seg)
                    seg = []
            if seg:
                segs.append(seg)
            for s in segs:
                if len(s) > 1:
                    items.append(_poly(s, col, 2.0, cls="series", data_kernel=k))
            for p in pts:
                if (id(p), k) in tf:
                    items.append(_circle(X(_x_of(key, p)), Y(tf[(id(p), k)]), 2.5, col, cls="pt", data_kernel=k,
                                         title=f"{model['labels'][k]}: {_num(round(p['times_us'][k], 3))} us, "
                                               f"{tf[(id(p), k)]:.1f} TFLOP/s at {_x_of(key, p)}"))
        # selected kernel per point: ring + tab on the axis
        for p in pts:
            k = pick_at[id(p)]
            if k is None:
                continue
            xx = X(_x_of(key, p))
            col = model["colors"].get(k, "#000")
            items.append(_rect(xx - 5, bottom - 6, 10, 6, col, None))
            if (id(p), k) in tf:
                t = p["times_us"][k]
                items.append(_circle(xx, Y(tf[(id(p), k)]), 6.5, col, "#000000", 2.0, cls="sel", data_kernel=k,
                                     data_seqlen_q=str(p["seqlen_q"]), data_seqlen_k=str(p["seqlen_k"]),
                                     data_batch=str(p["batch"]), data_nhead_q=str(p["nhead_q"]),
                                     data_time_us=_num(round(t, 6)),
                                     title=f"selected: {model['labels'].get(k, k)} at {_x_of(key, p)} "
                                           f"({_num(round(t, 3))} us)"))
        y = bottom + 40
    # legend (once per class)
    y += 8
    items.append(_text(12, y, "legend (ringed marker = selected kernel at that point; tab on the axis = "
                              "its colour):", color="#444"))
    n_sel = {k: sum(1 for s in model["picks"] if s == k) for k in model["ids"]}
    entries = [f"{model['labels'][k]}  (selected {n_sel[k]}/{len(model['points'])})" for k in model["ids"]]
    colw = max(len(e) for e in entries) * CHAR_W + 36
    ncol = max(1, int((W - 24) // colw))
    for i, (k, e) in enumerate(zip(model["ids"], entries)):
        r, c = divmod(i, ncol)
        lx, ly = 12 + c * colw, y + 18 + r * 17
        items.append(_line(lx, ly - 3.5, lx + 22, ly - 3.5, model["colors"][k], 3, cls="legend", data_kernel=k))
        items.append(_text(lx + 28, ly, e, title=k))
    y += 18 + ((len(entries) + ncol - 1) // ncol) * 17 + 6
    return items, math.ceil(y)


# ---------------------------------------------------------------------------------------------
# SVG / HTML
# ---------------------------------------------------------------------------------------------
def _attrs(meta: dict) -> tuple[str, str]:
    out, title = [], ""
    for k in sorted(meta):
        if k == "title":
            title = f"<title>{html.escape(meta[k])}</title>"
            continue
        name = "class" if k == "cls" else k.replace("_", "-")
        out.append(f' {name}="{html.escape(str(meta[k]))}"')
    return "".join(out), title


def _svg(items: list[dict], height: int, label: str) -> str:
    o = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
         f'role="img" aria-label="{html.escape(label)}" font-family="{FONT_FAMILY}">'),
         f'<rect x="0" y="0" width="{W}" height="{height}" fill="#ffffff"/>']
    for it in items:
        a, title = _attrs(it["meta"])
        t = it["t"]
        if t == "line":
            dash = f' stroke-dasharray="{it["dash"][0]} {it["dash"][1]}"' if it["dash"] else ""
            o.append(f'<line x1="{_coord(it["x1"])}" y1="{_coord(it["y1"])}" x2="{_coord(it["x2"])}" '
                     f'y2="{_coord(it["y2"])}" stroke="{it["color"]}" stroke-width="{_coord(it["width"])}"{dash}{a}/>')
        elif t == "poly":
            pts = " ".join(f"{_coord(x)},{_coord(y)}" for x, y in it["pts"])
            o.append(f'<polyline points="{pts}" fill="none" stroke="{it["color"]}" '
                     f'stroke-width="{_coord(it["width"])}" stroke-linejoin="round"{a}/>')
        elif t == "rect":
            st = f' stroke="{it["stroke"]}"' if it["stroke"] else ""
            o.append(f'<rect x="{_coord(it["x"])}" y="{_coord(it["y"])}" width="{_coord(it["w"])}" '
                     f'height="{_coord(it["h"])}" fill="{it["fill"]}"{st}{a}/>')
        elif t == "circle":
            st = f' stroke="{it["stroke"]}" stroke-width="{_coord(it["sw"])}"' if it["stroke"] else ""
            inner = f"{title}</circle>" if title else ""
            o.append(f'<circle cx="{_coord(it["cx"])}" cy="{_coord(it["cy"])}" r="{_coord(it["r"])}" '
                     f'fill="{it["fill"]}"{st}{a}' + (f">{inner}" if inner else "/>"))
        elif t == "text":
            anchor = "" if it["anchor"] == "start" else f' text-anchor="{it["anchor"]}"'
            rot = f' transform="rotate(-90 {_coord(it["x"])} {_coord(it["y"])})"' if it["rotate"] else ""
            bold = ' font-weight="bold"' if it["bold"] else ""
            o.append(f'<text x="{_coord(it["x"])}" y="{_coord(it["y"])}" font-size="{_coord(10 * it["scale"])}" '
                     f'fill="{it["color"]}"{anchor}{rot}{bold}{a}>{title}{html.escape(it["s"])}</text>')
    o.append("</svg>")
    return "\n".join(o)


CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 24px; color: #222;
       background: #fafafa; }
h1 { font-size: 20px; margin: 0 0 4px 0; } h2 { font-size: 16px; margin: 28px 0 6px 0; }
p.meta, p.note { color: #555; font-size: 13px; margin: 4px 0; }
section.cls { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px 14px; margin: 18px 0; }
svg { display: block; max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 12px; margin: 10px 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; } td.fastest { font-weight: bold; background: #eef7ee; }
td.failed { color: #b00; } td.none { color: #aaa; } code { font-size: 12px; }
span.sw { display: inline-block; width: 14px; height: 4px; vertical-align: middle; margin-right: 6px; }
table.kernels td { text-align: left; }
"""


def _table_html(model: dict) -> str:
    ids, labels, cls = model["ids"], model["labels"], model["class"]
    o = ['<table class="times"><thead><tr><th>seqlen_q</th><th>seqlen_k</th><th>batch</th><th>Hq</th><th>Hk</th>']
    for k in ids:
        o.append(f'<th title="{html.escape(k)}"><span class="sw" style="background:{model["colors"][k]}"></span>'
                 f'{html.escape(labels[k])}</th>')
    o.append("<th>selected</th></tr></thead><tbody>")
    for p, sel in zip(model["points"], model["picks"]):
        times = p.get("times_us") or {}
        failed = p.get("failed") or {}
        best = fastest_measured(cls, p)
        o.append(f'<tr><td>{p["seqlen_q"]}</td><td>{p["seqlen_k"]}</td><td>{p["batch"]}</td><td>{p["nhead_q"]}</td>'
                 f'<td>{p.get("nhead_k", p["nhead_q"])}</td>')
        for k in ids:
            if k in failed:
                o.append(f'<td class="failed" title="{html.escape(str(failed[k]))}">failed</td>')
            elif k in times:
                c = ' class="fastest"' if k == best else ""
                tfl = point_tflops(cls, p, times[k])
                o.append(f'<td{c} title="{tfl:.1f} TFLOP/s">{times[k]:.2f}</td>')
            else:
                o.append('<td class="none">&mdash;</td>')
        o.append(f'<td>{html.escape(labels.get(sel, sel)) if sel else "&mdash;"}</td></tr>')
    o.append("</tbody></table>")
    return "".join(o)


def _kernels_html(model: dict, kernels: dict) -> str:
    o = ['<table class="kernels"><thead><tr><th>label</th><th>name</th><th>identifier</th></tr></thead><tbody>']
    for k in model["ids"]:
        name = (kernels.get(k) or {}).get("name", "(not in this registry)")
        o.append(f'<tr><td><span class="sw" style="background:{model["colors"][k]}"></span>'
                 f'{html.escape(model["labels"][k])}</td><td><code>{html.escape(name)}</code></td>'
                 f'<td><code>{html.escape(k)}</code></td></tr>')
    o.append("</tbody></table>")
    return "".join(o)


def render_html(table: dict, kernels: dict, chooser: Chooser = fastest_measured,
                chooser_name: str | None = None) -> str:
    """The whole page as text (deterministic)."""
    device = _device_title(table)
    dev = table.get("device") or {}
    models = [_class_model(e, kernels, chooser) for e in table["classes"]]
    cname = chooser_name or getattr(chooser, "__name__", "chooser")
    o = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         f"<title>fmha-dsl seqtune report -- {html.escape(device)}</title>", f"<style>{CSS}</style></head><body>",
         f"<h1>fmha-dsl seqtune report &mdash; {html.escape(device)}</h1>"]
    if isinstance(dev, dict) and dev:
        o.append('<p class="meta">' + " &middot; ".join(html.escape(f"{k}: {dev[k]}") for k in sorted(dev)) + "</p>")
    o.append(f'<p class="meta">shapes: {html.escape(str(table.get("shapes", "?")))} &middot; '
             f'{len(models)} signature class(es) &middot; selection shown: <code>{html.escape(cname)}</code></p>')
    o.append('<p class="note">TFLOP/s = 2&middot;B&middot;Hq&middot;Sq&middot;Sk&middot;(Dq+Dv) / time '
             '(= 4&middot;B&middot;Hq&middot;Sq&middot;Sk&middot;D for Dq = Dv = D), halved when the class mask is '
             'causal (any mask other than <code>no</code>; approximate when Sq &ne; Sk), &times;2.5 for backward '
             'families. Times are median kernel times in &micro;s; bold = fastest measured at that point. Dashed '
             'vertical guides = bucket boundaries (the measured seqlens); ringed marker = the selected kernel.</p>')
    for i, m in enumerate(models):
        items, h = _scene(m, device)
        title = _class_title(m["class"])
        o.append(f'<section class="cls" id="class-{i}" data-class="{html.escape(json.dumps(m["class"], sort_keys=True))}">')
        o.append(f"<h2>{html.escape(device)} &mdash; {html.escape(title)}</h2>")
        o.append(_svg(items, h, f"{device} {title}"))
        o.append("<h3>median time (&micro;s) per point</h3>")
        o.append(_table_html(m) + _kernels_html(m, kernels))
        o.append("</section>")
    o.append("</body></html>\n")
    return "\n".join(o)


# ---------------------------------------------------------------------------------------------
# PNG
# ---------------------------------------------------------------------------------------------
def png_backend() -> str:
    """``"matplotlib"`` when it is importable, else ``"builtin"`` (the pure-Python rasteriser)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "builtin"
    return "matplotlib"


def _scenes(table: dict, kernels: dict, chooser: Chooser) -> list[tuple[list[dict], int]]:
    device = _device_title(table)
    return [_scene(_class_model(e, kernels, chooser), device) for e in table["classes"]]


def _stack(scenes: list[tuple[list[dict], int]], gap: int = 12) -> tuple[list[dict], int]:
    """All class panels one under another, separated by a rule."""
    out, y0 = [], 0
    for i, (items, h) in enumerate(scenes):
        if i:
            out.append(_line(0, y0 - gap / 2, W, y0 - gap / 2, "#cccccc", 1))
        for it in items:
            out.append(_shift(it, y0))
        y0 += h + gap
    return out, int(y0 - gap)


def _shift(it: dict, dy: float) -> dict:
    it = dict(it)
    for k in ("y", "y1", "y2", "cy"):
        if k in it:
            it[k] += dy
    if "pts" in it:
        it["pts"] = [(x, y + dy) for x, y in it["pts"]]
    return it


def render_png(table: dict, kernels: dict, chooser: Chooser = fastest_measured, backend: str = "auto",
               scale: int = 2) -> tuple[bytes, str]:
    """PNG bytes of all class panels stacked, and the backend used (``matplotlib`` / ``builtin``)."""
    items, h = _stack(_scenes(table, kernels, chooser))
    if backend == "auto":
        backend = png_backend()
    from . import report_png

    if backend == "matplotlib":
        return report_png.png_matplotlib(items, W, h, scale), "matplotlib"
    if backend != "builtin":
        raise ValueError(f"unknown PNG backend {backend!r}")
    return report_png.png_builtin(items, W, h, scale), "builtin"


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------
def write_report(build_dir_or_registry_json: str, out_path: str, *, png: bool | str | None = None,
                 chooser: Chooser = fastest_measured, chooser_name: str | None = None,
                 png_backend_name: str = "auto") -> list[str]:
    """Write the report; return the files written.

    ``out_path`` ending in ``.png`` writes only the image; otherwise the HTML page is written, plus
    the image when ``png`` is true (sibling ``<out>.png``) or a path.  ``chooser(class_dict, point)``
    returns the identifier the selection picks at a measured point (default: the fastest measured
    there); plug the real selector in to show its choices.  ``png_backend_name``: ``auto`` (matplotlib
    when importable, else the built-in rasteriser), ``matplotlib`` or ``builtin``.
    """
    table, kernels = load_table(build_dir_or_registry_json)
    written = []
    png_path = None
    if out_path.lower().endswith(".png"):
        png_path = out_path
    else:
        write_atomic(out_path, render_html(table, kernels, chooser, chooser_name))
        written.append(out_path)
        if png:
            png_path = png if isinstance(png, str) else os.path.splitext(out_path)[0] + ".png"
    if png_path:
        data, _ = render_png(table, kernels, chooser, png_backend_name)
        write_atomic(png_path, data)
        written.append(png_path)
    return written
