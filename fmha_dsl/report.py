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

Modules: :mod:`.report_model` (the table loaded, numbers, labels, one panel's data), :mod:`.report_scene`
(a panel as drawing primitives), :mod:`.report_png` (primitives -> PNG) and this one (the HTML page, the
PNG entry point, :func:`write_report`); the public names of all of them are importable from here.

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

Serving classes (measured over a paged KV cache: the title names page size, lookup and layout) plot their decode
points (at most 16 query rows per sequence, fewer than its keys) as effective K/V bandwidth instead, said on the plot::

    GB/s = B * Sk * Hk * (Dq + Dv) * element bytes / (time_us * 1e-6) / 1e9    # K + V bytes read once
"""

from __future__ import annotations

import html
import json
import os

from .errors import UsageError, error
from .atomic_file import write_atomic
from .report_model import (BANDWIDTH_NOTE, DECODE_ROWS, Chooser, _class_model, _class_title, _coord, _device_title,
                           fastest_measured, is_decode, load_table, point_gbps, point_tflops, point_value, short_labels)
from .report_scene import FONT_FAMILY, W, _line, _scene

__all__ = [
    "fastest_measured",
    "load_table",
    "png_backend",
    "point_gbps",
    "point_tflops",
    "point_value",
    "render_html",
    "render_png",
    "short_labels",
    "write_report",
]

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
                val, unit = point_value(cls, p, times[k])
                o.append(f'<td{c} title="{val:.1f} {unit}">{times[k]:.2f}</td>')
            else:
                o.append('<td class="none">&mdash;</td>')
        o.append(f'<td>{html.escape(labels.get(sel, sel)) if sel else "&mdash;"}</td></tr>')
    o.append("</tbody></table>")
    return "".join(o)


def _kernels_html(model: dict, kernels: dict) -> str:
    o = ['<table class="kernels"><thead><tr><th>label</th><th>name</th><th>identifier</th></tr></thead><tbody>']
    for k in model["ids"]:
        name = (kernels.get(k) or {}).get("name", "(not in this registry)")
        name = name if isinstance(name, str) else repr(name)
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
    if any(is_decode(m["class"], p) for m in models for p in m["points"]):
        o.append(f'<p class="note">Serving classes (a paged KV cache; the title names its page size, table lookup and '
                 f'layout): decode points (at most {DECODE_ROWS} query rows per sequence, fewer than its keys) are '
                 f'plotted as {html.escape(BANDWIDTH_NOTE)}, in GB/s; their prefill points in TFLOP/s as above.</p>')
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
    if out_path.endswith(("/", os.sep)) or os.path.isdir(out_path):
        raise error("usage.output", f"the report goes to a file, and `{out_path}` names a folder", None,
                    f"name the page, e.g. -o {os.path.join(out_path, 'report.html')} (or .png for the image alone)",
                    cls=UsageError)
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
