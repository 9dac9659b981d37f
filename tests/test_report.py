"""fmha_dsl.report: the static seqtune report (HTML with inline SVG, PNG)."""

import json
import os
import struct
import zlib
from html.parser import HTMLParser

import pytest

from fmha_dsl import report
from fmha_dsl.errors import FmhaError, UsageError

SEQLENS = [128, 256, 512, 1024, 2048, 4096]


def _kernel(ident, name, tile, wave, pipeline, pad):
    return {"identifier": ident, "name": name, "gfx_arch": "sm90", "pipeline": pipeline,
            "algorithm": {"tile": tile, "wave": wave, "warp": [32, 32, 16], "pipeline": pipeline,
                          "pad_s": pad[0], "pad_sk": pad[1], "pad_d": pad[2], "pad_dv": pad[3]},
            "signature": {"family": "fwd", "dtype": "bf16", "hdim_q": 128, "hdim_v": 128}}


KERNELS = [
    _kernel("kA", "fmha_fwd_small_tile", [64, 64, 32, 128, 32, 128], [4, 1, 1], "qr", (1, 1, 1, 1)),
    _kernel("kB", "fmha_fwd_mid_tile", [128, 64, 32, 128, 32, 128], [4, 1, 1], "qr_async", (1, 1, 1, 1)),
    _kernel("kC", "fmha_fwd_big_tile", [128, 128, 32, 128, 32, 128], [8, 1, 1], "qr_async", (0, 0, 1, 1)),
]


def _time(kernel, s, causal):
    """Synthetic times with a crossover: A wins short, B middle, C long sequences."""
    base = {"kA": 5.0, "kB": 12.0, "kC": 25.0}[kernel]
    rate = {"kA": 6.0e-3, "kB": 3.9e-3, "kC": 3.0e-3}[kernel]
    t = base + rate * s * s / 64
    return round(t * (0.55 if causal else 1.0), 3)


def _registry(with_table=True):
    classes = []
    for mask in ("causal", "no"):
        cls = {"family": "fwd", "dtype": "bf16", "mode": "batch", "vlayout": "r", "hdim_q": 128, "hdim_v": 128,
               "mask": mask, "bias": "no", "lse": False, "dropout": False, "logits": False, "sink": False}
        pts = []
        for s in SEQLENS:
            times = {k: _time(k, s, mask == "causal") for k in ("kA", "kB", "kC")}
            p = {"seqlen_q": s, "seqlen_k": s, "batch": 4, "nhead_q": 16, "nhead_k": 16, "times_us": times}
            pts.append(p)
        classes.append({"class": cls, "points": pts})
    doc = {"schema_version": 2, "metadata": {}, "kernels": KERNELS}
    if with_table:
        doc["seqtune"] = {"device": {"name": "NVIDIA H200", "arch": "sm90", "driver": "580", "triton": "3.6.0",
                                     "torch": "2.11.0", "compute_units": 132},
                          "shapes": "default", "classes": classes}
    return doc


@pytest.fixture
def build_dir(tmp_path):
    d = tmp_path / "build"
    d.mkdir()
    (d / "registry.json").write_text(json.dumps(_registry(), sort_keys=True, indent=1))
    return d


def _fastest(point):
    t = point["times_us"]
    return min(sorted(t), key=t.get)


def test_synthetic_data_has_a_crossover():
    winners = [_fastest(p) for p in _registry()["seqtune"]["classes"][1]["points"]]
    assert len(set(winners)) >= 2 and winners[0] == "kA" and winners[-1] == "kC"


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []  # (tag, attrs dict, enclosing svg index or None)
        self.svg = -1
        self.in_svg = False
        self.bold_cells = []
        self._td_bold = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg":
            self.svg += 1
            self.in_svg = True
        self.tags.append((tag, a, self.svg if self.in_svg else None))

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag):
        if tag == "svg":
            self.in_svg = False


def _parse(path):
    p = _Collect()
    with open(path, encoding="utf-8") as f:
        p.feed(f.read())
    p.close()
    return p


def test_html_structure_selection_and_guides(build_dir, tmp_path):
    out = tmp_path / "r" / "report.html"
    files = report.write_report(str(build_dir), str(out))
    assert files == [str(out)]
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    p = _parse(out)
    svgs = [t for t in p.tags if t[0] == "svg"]
    assert len(svgs) == 2  # one per class
    reg = _registry()["seqtune"]["classes"]
    for ci, entry in enumerate(reg):
        sels = [a for tag, a, s in p.tags if s == ci and a.get("class") == "sel"]
        assert len(sels) == len(SEQLENS)  # one highlighted kernel at each measured point
        by_seq = {int(a["data-seqlen-q"]): a["data-kernel"] for a in sels}
        for pt in entry["points"]:
            assert by_seq[pt["seqlen_q"]] == _fastest(pt)
        guides = sorted(int(a["data-seqlen"]) for tag, a, s in p.tags if s == ci and a.get("class") == "bucket")
        assert guides == SEQLENS
        series = {a["data-kernel"] for tag, a, s in p.tags if s == ci and a.get("class") == "series"}
        assert series == {"kA", "kB", "kC"}
    # one table per class, fastest bold
    assert text.count('<table class="times">') == 2
    assert text.count('class="fastest"') == 2 * len(SEQLENS)
    # legend labels: distinguishing tokens only, and axis labels / units / device in the title
    labels = report.short_labels(["kA", "kB", "kC"], {k["identifier"]: k for k in KERNELS})
    assert labels == {"kA": "64x64 w4x1x1 qr pad1111", "kB": "128x64 w4x1x1 qr_async pad1111",
                      "kC": "128x128 w8x1x1 qr_async pad0011"}
    for lab in labels.values():
        assert lab in text
    assert "TFLOP/s" in text and "seqlen" in text and "NVIDIA H200" in text and "mask=causal" in text


def test_custom_chooser_is_shown(build_dir, tmp_path):
    out = tmp_path / "c.html"
    report.write_report(str(build_dir), str(out), chooser=lambda cls, pt: "kB", chooser_name="always_kB")
    p = _parse(out)
    sels = [a["data-kernel"] for tag, a, s in p.tags if a.get("class") == "sel"]
    assert sels and set(sels) == {"kB"}
    assert "always_kB" in out.read_text()


def test_tflops_formula():
    cls = {"hdim_q": 128, "hdim_v": 128, "mask": "no", "family": "fwd"}
    pt = {"batch": 2, "nhead_q": 8, "seqlen_q": 1024, "seqlen_k": 1024}
    flops = 4 * 2 * 8 * 1024 * 1024 * 128
    assert report.point_tflops(cls, pt, 100.0) == pytest.approx(flops / 100e-6 / 1e12)
    assert report.point_tflops(dict(cls, mask="causal"), pt, 100.0) == pytest.approx(flops / 2 / 100e-6 / 1e12)


def _png_info(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF
        if tag == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype = ihdr[:4]
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[ctype] * depth // 8
    raw = zlib.decompress(idat)
    return w, h, bpp, raw


def test_png_builtin_decodes_and_sibling(build_dir, tmp_path):
    out = tmp_path / "r.html"
    files = report.write_report(str(build_dir), str(out), png=True, png_backend_name="builtin")
    assert files == [str(out), str(tmp_path / "r.png")]
    data = (tmp_path / "r.png").read_bytes()
    w, h, bpp, raw = _png_info(data)
    assert w == report.W * 2 and h > 400 and len(raw) == h * (1 + w * bpp)
    assert b"builtin rasteriser" in data
    # not blank: some coloured (kernel) pixels
    assert bytes.fromhex("1f77b4") in raw and bytes.fromhex("ff7f0e") in raw


def test_png_only_when_out_is_png(build_dir, tmp_path):
    out = tmp_path / "only.png"
    files = report.write_report(str(build_dir / "registry.json"), str(out))
    assert files == [str(out)]
    w, h, bpp, raw = _png_info(out.read_bytes())
    assert len(raw) == h * (1 + w * bpp)


def test_deterministic(build_dir, tmp_path):
    """Byte-identical reports from two processes with different string hashes (set and dict orders would differ)."""
    import subprocess
    import sys

    files = []
    for seed in ("1", "2"):
        code = ("import sys; from fmha_dsl import report; print('\\n'.join(report.write_report(sys.argv[1], "
                "sys.argv[2], png=True, png_backend_name='builtin')))")
        r = subprocess.run([sys.executable, "-c", code, str(build_dir), str(tmp_path / seed / "x.html")],
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300)
        assert r.returncode == 0, r.stderr
        files.append(r.stdout.split())
    assert len(files[0]) == len(files[1]) == 2
    for x, y in zip(*files):
        with open(x, "rb") as f1, open(y, "rb") as f2:
            assert f1.read() == f2.read()


@pytest.mark.parametrize("content,rule", [("{not json", "report.bad-registry"), ("[]", "report.bad-registry"),
                                          (json.dumps(_registry(with_table=False)), "report.no-table"),
                                          (json.dumps({"seqtune": {"classes": "x"}}), "report.no-table"),
                                          (json.dumps({"seqtune": {"classes": []}}), "report.no-table")])
def test_error_no_table(tmp_path, content, rule):
    """A registry without a usable table: tune it; a file that is no registry: rebuild it."""
    d = tmp_path / "b"
    d.mkdir()
    if content is not None:
        (d / "registry.json").write_text(content)
    with pytest.raises(FmhaError) as ei:
        report.write_report(str(d), str(tmp_path / "o.html"))
    assert ei.value.rule == rule and ei.value.exit_code == 2
    assert ("fmha-dsl tune" if rule == "report.no-table" else "fmha-dsl build") in ei.value.hint
    assert not os.path.exists(tmp_path / "o.html")


def _corrupt(edit):
    doc = _registry()
    edit(doc["seqtune"]["classes"][0], doc["seqtune"]["classes"][0]["points"][0], doc)
    return doc


@pytest.mark.parametrize("edit,says", [
    (lambda c, p, d: p["times_us"].update(kA=float("inf")), "the time of kA must be a finite number"),
    (lambda c, p, d: p["times_us"].update(kA=1e-320), "microseconds in [0.001, 1e+12]"),
    (lambda c, p, d: p["times_us"].update(kA=10 ** 400), "microseconds in [0.001, 1e+12]"),
    (lambda c, p, d: p.update(nhead_k="x"), "nhead_k must be an integer"),
    (lambda c, p, d: p.update(seqlen_q=10 ** 40), "seqlen_q must be an integer in [1, 2**31)"),
    (lambda c, p, d: p.update(failed=["kA"]), "times_us and failed must map kernel names"),
    (lambda c, p, d: c.update({"class": {}}), "an empty class"),
    (lambda c, p, d: c["class"].update(hdim_q="abc"), "hdim_q must be an integer >= 1"),
    (lambda c, p, d: c["class"].update(family=["x"]), "family must be a name"),
    (lambda c, p, d: c.update(points=[]), "non-empty \"points\" list"),
    (lambda c, p, d: c["class"].pop("hdim_v"), "hdim_v must be an integer >= 1, got None"),
    (lambda c, p, d: c["class"].pop("dtype"), "dtype must be a name, got None"),
])
def test_a_corrupt_table_is_a_located_input_error_not_a_crash(tmp_path, edit, says):
    """Hand-edited or corrupt tables (each was an OverflowError, TypeError, ZeroDivisionError or ValueError)."""
    d = tmp_path / "b"
    d.mkdir()
    (d / "registry.json").write_text(json.dumps(_corrupt(edit)))
    with pytest.raises(FmhaError) as ei:
        report.write_report(str(d), str(tmp_path / "o.html"))
    assert ei.value.rule == "report.no-table" and says in ei.value.message, ei.value.message
    assert ei.value.exit_code == 2 and not os.path.exists(tmp_path / "o.html")


def test_a_registry_of_another_schema_version_is_to_be_rebuilt(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    doc = _registry()
    (d / "registry.json").write_text(json.dumps(dict(doc, schema_version=99)))
    with pytest.raises(FmhaError, match="schema_version 99") as ei:
        report.write_report(str(d), str(tmp_path / "o.html"))
    assert ei.value.rule == "report.bad-registry" and "fmha-dsl build" in ei.value.hint
    doc.pop("schema_version")   # (as Registry.load: no version is version 1)
    (d / "registry.json").write_text(json.dumps(doc))
    assert report.write_report(str(d), str(tmp_path / "o.html")) == [str(tmp_path / "o.html")]


def test_the_report_goes_to_a_file_not_a_folder(build_dir, tmp_path):
    for out in (str(tmp_path) + "/", str(tmp_path / "new") + "/"):
        with pytest.raises(FmhaError, match="names a folder") as ei:
            report.write_report(str(build_dir), out)
        assert ei.value.rule == "usage.output" and "report.html" in ei.value.hint
    assert not os.path.exists(tmp_path / "new")


def test_error_no_registry_says_build_first(tmp_path):
    """A folder without registry.json was never built: tuning it is not the next step, building is."""
    with pytest.raises(FmhaError) as ei:
        report.write_report(str(tmp_path), str(tmp_path / "o.html"))
    assert ei.value.rule == "report.no-registry" and isinstance(ei.value, UsageError)
    assert "registry.json" in ei.value.message and "fmha-dsl build" in ei.value.hint
    assert not os.path.exists(tmp_path / "o.html")


def test_failed_kernel_and_unknown_identifier(tmp_path):
    doc = _registry()
    pt = doc["seqtune"]["classes"][1]["points"][0]
    best = _fastest(pt)
    pt["failed"] = {best: "wrong result"}
    pt["times_us"]["fmha_fwd_x_pqr_t256x64x32x128x32x128_w8x1x1_wt32x32x16_pad1111_r0"] = 1e6
    (tmp_path / "registry.json").write_text(json.dumps(doc))
    out = tmp_path / "f.html"
    report.write_report(str(tmp_path / "registry.json"), str(out))
    text = out.read_text()
    assert 'title="wrong result">failed</td>' in text
    assert "256x64" in text  # label parsed from an identifier missing from "kernels"
    sel = [a for tag, a, s in _parse(out).tags if a.get("class") == "sel" and s == 1]
    assert {a["data-kernel"] for a in sel if a["data-seqlen-q"] == "128"} == {
        min((k for k in pt["times_us"] if k != best), key=pt["times_us"].get)}


def test_png_matplotlib_when_available(build_dir, tmp_path):
    pytest.importorskip("matplotlib")
    f1 = report.write_report(str(build_dir), str(tmp_path / "m1.png"), png_backend_name="matplotlib")
    f2 = report.write_report(str(build_dir), str(tmp_path / "m2.png"), png_backend_name="matplotlib")
    with open(f1[0], "rb") as x, open(f2[0], "rb") as y:
        a, b = x.read(), y.read()
    assert a == b
    w, h, bpp, raw = _png_info(a)
    assert len(raw) == h * (1 + w * bpp)


def test_backward_classes_are_drawn_with_backward_flops(tmp_path):
    """A table with a backward class (what `fmha-dsl tune` writes for `"family": "bwd"`): drawn like a forward one,
    titled with its family, and its TFLOP/s count 2.5x the forward's FLOPs."""
    doc = _registry()
    bwd = [dict(k, identifier=k["identifier"] + "b", name=k["name"].replace("fwd", "bwd"),
                signature=dict(k["signature"], family="bwd_dq_dk_dv")) for k in KERNELS]
    doc["kernels"] = KERNELS + bwd
    cls = dict(doc["seqtune"]["classes"][1]["class"], family="bwd_dq_dk_dv")
    pts = [dict(p, times_us={k + "b": t for k, t in p["times_us"].items()})
           for p in doc["seqtune"]["classes"][1]["points"]]
    doc["seqtune"]["classes"].append({"class": cls, "points": pts})
    d = tmp_path / "b"
    d.mkdir()
    (d / "registry.json").write_text(json.dumps(doc, sort_keys=True, indent=1))
    out = tmp_path / "b.html"
    report.write_report(str(d), str(out))
    text = out.read_text()
    assert text.count("<svg") == 3 and "bwd_dq_dk_dv" in text
    pt = {"batch": 2, "nhead_q": 8, "seqlen_q": 1024, "seqlen_k": 1024}
    fwd = report.point_tflops({"hdim_q": 128, "hdim_v": 128, "mask": "no", "family": "fwd"}, pt, 100.0)
    assert report.point_tflops(dict(cls, mask="no"), pt, 100.0) == pytest.approx(2.5 * fwd)
