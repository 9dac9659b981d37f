"""[report] The scene of one class panel: a list of drawing primitives (text, lines, polylines, rectangles,
circles; logical px, y down) that both the SVG (:mod:`fmha_dsl.report`) and the PNG (:mod:`fmha_dsl.report_png`)
renderers draw, so the page and the image show the same charts.
"""

from __future__ import annotations

import math

from .report_model import (BANDWIDTH_NOTE, _class_rest, _class_title, _group_title, _num, _x_of, is_decode,
                           point_value)

FONT_FAMILY = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CHAR_W = 6.0  # logical px per character at text scale 1 (SVG font-size 10 monospace ~ 6 px advance)


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
        unit = "GB/s" if is_decode(cls, pts[0]) else "TFLOP/s"   # one kind of point per group (same seqlen_q)
        if unit == "GB/s":
            y += 14
            items.append(_text(PLOT_L, y, f"decode: {BANDWIDTH_NOTE}", color="#444"))
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
                    tf[(id(p), k)] = point_value(cls, p, t)[0]
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
        items.append(_text(20, top + PLOT_H / 2, "K/V GB/s" if unit == "GB/s" else unit, anchor="middle",
                           rotate=True, color="#222"))
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
                                               f"{tf[(id(p), k)]:.1f} {unit} at {_x_of(key, p)}"))
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
    colw = max((len(e) for e in entries), default=0) * CHAR_W + 36   # (no kernel measured anywhere: none)
    ncol = max(1, int((W - 24) // colw))
    for i, (k, e) in enumerate(zip(model["ids"], entries)):
        r, c = divmod(i, ncol)
        lx, ly = 12 + c * colw, y + 18 + r * 17
        items.append(_line(lx, ly - 3.5, lx + 22, ly - 3.5, model["colors"][k], 3, cls="legend", data_kernel=k))
        items.append(_text(lx + 28, ly, e, title=k))
    y += 18 + ((len(entries) + ncol - 1) // ncol) * 17 + 6
    return items, math.ceil(y)
