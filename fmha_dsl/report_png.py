"""[report] Drawing lists -> PNG: through matplotlib when it is installed, else a small built-in rasteriser.

:mod:`fmha_dsl.report` builds one list of drawing items (lines, polylines, rectangles, circles, text, in
logical pixels) per chart; the HTML page writes them as SVG, and this module paints the same items into a PNG
(``zlib`` + ``struct``; a 5x8 bitmap font), so the image and the page always agree.  Output is deterministic.
"""

from __future__ import annotations

import math
import struct
import zlib

def png_matplotlib(items: list[dict], width: int, height: int, scale: int) -> bytes:
    import io

    from matplotlib.figure import Figure  # a bare Figure renders without a backend: the caller's stays as it is
    from matplotlib.patches import Circle, Rectangle

    dpi = 100 * scale
    fig = Figure(figsize=(width / 100, height / 100), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    lw = 72 / 100  # 1 logical px in points
    for it in items:
        t = it["t"]
        if t == "line":
            ls = (0, (it["dash"][0] / it["width"], it["dash"][1] / it["width"])) if it["dash"] else "-"
            ax.plot([it["x1"], it["x2"]], [it["y1"], it["y2"]], color=it["color"], lw=it["width"] * lw, ls=ls,
                    solid_capstyle="butt")
        elif t == "poly":
            ax.plot([p[0] for p in it["pts"]], [p[1] for p in it["pts"]], color=it["color"], lw=it["width"] * lw,
                    solid_joinstyle="round")
        elif t == "rect":
            ax.add_patch(Rectangle((it["x"], it["y"]), it["w"], it["h"], facecolor=it["fill"],
                                   edgecolor=it["stroke"] or "none", lw=lw))
        elif t == "circle":
            ax.add_patch(Circle((it["cx"], it["cy"]), it["r"], facecolor=it["fill"],
                                edgecolor=it["stroke"] or "none", lw=it["sw"] * lw, zorder=3))
        elif t == "text":
            ha = {"start": "left", "middle": "center", "end": "right"}[it["anchor"]]
            ax.text(it["x"], it["y"], it["s"], fontsize=10 * it["scale"] * lw, color=it["color"], ha=ha,
                    va="baseline", family="monospace", weight="bold" if it["bold"] else "normal",
                    rotation=90 if it["rotate"] else 0, rotation_mode="anchor")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": "fmha-dsl report (matplotlib)"})
    return buf.getvalue()


# ---- the built-in rasteriser ----------------------------------------------------------------
# 5x8 bitmap font, column-major, bit 0 = top row (the classic "glcdfont" 5x7 glyphs, rows 0-6, row 7 for
# descenders), printable ASCII 32..126.
_FONT = bytes.fromhex(
    "0000000000" "00005f0000" "0007000700" "147f147f14" "242a7f2a12" "2313086462" "3649562050" "0005030000"
    "001c224100" "0041221c00" "2a1c7f1c2a" "08083e0808" "0050300000" "0808080808" "0060600000" "2010080402"
    "3e5149453e" "00427f4000" "4261514946" "2141454b31" "1814127f10" "2745454539" "3c4a494930" "0171090503"
    "3649494936" "064949291e" "0036360000" "0056360000" "0814224100" "1414141414" "0041221408" "0201510906"
    "3e415d594e" "7c1211127c" "7f49494936" "3e41414122" "7f4141413e" "7f49494941" "7f09090901" "3e41415173"
    "7f0808087f" "00417f4100" "2040413f01" "7f08142241" "7f40404040" "7f021c027f" "7f0408107f" "3e4141413e"
    "7f09090906" "3e4151215e" "7f09192946" "2649494932" "03017f0103" "3f4040403f" "1f2040201f" "3f4038403f"
    "6314081463" "0304780403" "6159494d43" "007f414141" "0204081020" "004141417f" "0402010204" "4040404040"
    "0003070800" "2054547840" "7f28444438" "3844444428" "384444287f" "3854545418" "00087e0902" "18a4a49c78"
    "7f08040478" "00447d4000" "2040403d00" "7f10284400" "00417f4000" "7c04780478" "7c08040478" "3844444438"
    "fc18242418" "18242418fc" "7c08040408" "4854545424" "04043f4424" "3c4040207c" "1c2040201c" "3c4030403c"
    "4428102844" "4c9090907c" "4464544c44" "0008364100" "0000770000" "0041360800" "0201020402")


def _hex(c: str) -> tuple[int, int, int]:
    c = c.lstrip("#")
    if len(c) == 3:
        c = "".join(ch * 2 for ch in c)
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


class _Canvas:
    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.buf = bytearray(b"\xff" * (w * h * 3))

    def hspan(self, x0: int, x1: int, y: int, rgb: bytes):
        if y < 0 or y >= self.h:
            return
        x0, x1 = max(0, x0), min(self.w - 1, x1)
        if x1 < x0:
            return
        o = (y * self.w + x0) * 3
        self.buf[o:o + (x1 - x0 + 1) * 3] = rgb * (x1 - x0 + 1)

    def fill_rect(self, x0: float, y0: float, x1: float, y1: float, rgb: bytes):
        xa, xb = round(x0), round(x1) - 1
        for yy in range(round(y0), round(y1)):
            self.hspan(xa, xb, yy, rgb)

    def disc(self, cx: float, cy: float, r: float, rgb: bytes):
        for yy in range(math.floor(cy - r), math.ceil(cy + r) + 1):
            dy = yy + 0.5 - cy
            if abs(dy) > r:
                continue
            dx = math.sqrt(r * r - dy * dy)
            self.hspan(round(cx - dx), round(cx + dx) - 1, yy, rgb)

    def line(self, x1: float, y1: float, x2: float, y2: float, w: float, rgb: bytes, dash=None):
        length = math.hypot(x2 - x1, y2 - y1)
        steps = max(1, math.ceil(length * 2))
        half = w / 2
        on, off = dash if dash else (0, 0)
        for i in range(steps + 1):
            f = i / steps
            if dash and (f * length) % (on + off) >= on:
                continue
            x, y = x1 + (x2 - x1) * f, y1 + (y2 - y1) * f
            if w <= 2.5:
                self.fill_rect(x - half, y - half, x + half, y + half, rgb)
            else:
                self.disc(x, y, half, rgb)

    def text(self, x: float, y: float, s: str, px: int, rgb: bytes, anchor: str, bold: bool, rotate: bool):
        adv = 6 * px
        width = len(s) * adv - px
        u0 = {"middle": -width / 2, "end": -width}.get(anchor, 0.0)  # start offset along the text
        x, y = round(x), round(y)
        for ci, ch in enumerate(s):
            code = ord(ch)
            if code < 32 or code > 126:
                code = ord("?")
            g = _FONT[(code - 32) * 5:(code - 32) * 5 + 5]
            for col, bits in enumerate(g):
                for row in range(8):
                    if not bits >> row & 1:
                        continue
                    for b in range(2 if bold else 1):
                        u = round(u0) + ci * adv + col * px + b * max(1, px // 2)  # along the text
                        v = (row - 7) * px  # across: rows 0-6 above the baseline, row 7 below
                        if rotate:  # rotated -90 degrees (reads bottom to top): along -> -y, down -> +x
                            self.fill_rect(x + v, y - u - px, x + v + px, y - u, rgb)
                        else:
                            self.fill_rect(x + u, y + v, x + u + px, y + v + px, rgb)

    def png(self, text: dict[str, str] | None = None) -> bytes:
        raw = bytearray()
        row = self.w * 3
        for yy in range(self.h):
            raw.append(0)
            raw += self.buf[yy * row:(yy + 1) * row]

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
        for k, v in sorted((text or {}).items()):
            out += chunk(b"tEXt", k.encode("latin-1") + b"\0" + v.encode("latin-1"))
        out += chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + chunk(b"IEND", b"")
        return out


def png_builtin(items: list[dict], width: int, height: int, scale: int) -> bytes:
    s = scale
    cv = _Canvas(width * s, height * s)
    for it in items:
        t = it["t"]
        if t == "line":
            d = (it["dash"][0] * s, it["dash"][1] * s) if it["dash"] else None
            cv.line(it["x1"] * s, it["y1"] * s, it["x2"] * s, it["y2"] * s, max(1.0, it["width"] * s),
                    bytes(_hex(it["color"])), d)
        elif t == "poly":
            c = bytes(_hex(it["color"]))
            for (xa, ya), (xb, yb) in zip(it["pts"], it["pts"][1:]):
                cv.line(xa * s, ya * s, xb * s, yb * s, it["width"] * s, c)
        elif t == "rect":
            x0, y0, x1, y1 = it["x"] * s, it["y"] * s, (it["x"] + it["w"]) * s, (it["y"] + it["h"]) * s
            cv.fill_rect(x0, y0, x1, y1, bytes(_hex(it["fill"])))
            if it["stroke"]:
                c = bytes(_hex(it["stroke"]))
                for a, b, cc, d in ((x0, y0, x1, y0), (x0, y1 - 1, x1, y1 - 1), (x0, y0, x0, y1), (x1 - 1, y0, x1 - 1, y1)):
                    cv.line(a, b, cc, d, 1, c)
        elif t == "circle":
            if it["stroke"]:
                cv.disc(it["cx"] * s, it["cy"] * s, (it["r"] + it["sw"] / 2) * s, bytes(_hex(it["stroke"])))
                cv.disc(it["cx"] * s, it["cy"] * s, (it["r"] - it["sw"] / 2) * s, bytes(_hex(it["fill"])))
            else:
                cv.disc(it["cx"] * s, it["cy"] * s, it["r"] * s, bytes(_hex(it["fill"])))
        elif t == "text":
            px = max(1, round(it["scale"] * s))
            cv.text(it["x"] * s, it["y"] * s, it["s"], px, bytes(_hex(it["color"])), it["anchor"], it["bold"],
                    it["rotate"])
    return cv.png({"Software": "fmha-dsl report (builtin rasteriser)"})
