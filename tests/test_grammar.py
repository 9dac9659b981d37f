"""The language: golden resolution of every setter, formatter idempotence, C++ paste form."""

import glob
import os

import pytest

import fmha_dsl
from fmha_dsl.fmt import format_source

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = sorted(glob.glob(os.path.join(REPO, "grammar", "examples", "*.fmha")))
SHIPPED = sorted(glob.glob(os.path.join(REPO, "kernelsets", "*.fmha")))


def summary(ks) -> str:
    """A readable dump of what each declaration asks for (reviewed by hand: tests/golden/)."""
    out = []
    for d in ks.declarations:
        archs = "*" if d.archs.values is None else ",".join(d.archs.values)
        out.append(f"decl {d.label} line {d.span.line}: arch={archs} profile={d.profile.values[0]} "
                   f"mask_impl={d.mask_impl} wheres={len(d.wheres)}")
        for name in sorted(d.fields):
            fs = d.fields[name]
            vals = "*" if fs.values is None else " | ".join(map(str, fs.values))
            out.append(f"  {name} = {vals}")
        for name in sorted(d.tile.dims):
            v = d.tile.dims[name]
            out.append(f"  tile.{name} = {'*' if v is None else ' | '.join(map(str, v))}")
    rep = ks.expand_report()
    for label, counts in rep.per_decl.items():
        out.append(f"kernels {label}: " + ", ".join(f"{a}={n}" for a, n in counts.items()))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_golden_resolution(path):
    golden = os.path.join(HERE, "golden", os.path.basename(path)[:-5] + ".txt")
    got = summary(fmha_dsl.load(path))
    if os.environ.get("FMHA_UPDATE_GOLDEN"):
        with open(golden, "w") as f:
            f.write(got)
    with open(golden) as f:
        assert got == f.read()


@pytest.mark.parametrize("path", EXAMPLES + SHIPPED, ids=os.path.basename)
def test_checked_in_files_are_formatted(path):
    with open(path) as f:
        text = f.read()
    assert format_source(text, path) == text


@pytest.mark.parametrize("path", EXAMPLES + SHIPPED, ids=os.path.basename)
def test_format_keeps_meaning_and_comments(path, write):
    with open(path) as f:
        text = f.read()
    messy = text.replace("\n    ", "\n").replace("(", " ( ")  # re-indent and space out
    out = format_source(messy)
    assert format_source(out) == out
    a = fmha_dsl.loads(text)
    b = fmha_dsl.loads(out)
    arch = None if "arch(sm90)" in text else "gfx942"  # the declared archs, or gfx942 for arch(*) sets
    ka = sorted(e.identifier for e in a.registry(arch=arch))
    kb = sorted(e.identifier for e in b.registry(arch=arch))
    assert ka == kb
    assert text.count("#") == out.count("#")


def test_paste_form_equals_block_form():
    block = """kernel_set s { kernel {
        signature { family(fwd) dtype(fp16) mode(batch) hdim(128) mask(causal) lse(true) }
        algorithm { tile(128, 128, 32, 128, 32, 128) wave(4, 1, 1, 4, 1, 1) warp(32, 32, 16, 32, 32, 16)
                    pipeline(qr_async) padding(true, true, true, true) }
        arch(gfx942) } }"""
    paste = """kernel_set s {
        .add(FmhaSignature().family("fwd").dtype("fp16").mode("batch").hdim(128).mask("causal").lse(),
             FmhaAlgorithm().tile(128,128,32,128,32,128).wave(4,1,1,4,1,1).warp(32,32,16,32,32,16)
                            .pipeline("qr_async").padding(true,true,true,true), "gfx942") }"""
    a = [k.key for k in fmha_dsl.loads(block).expand_report().kernels]
    b = [k.key for k in fmha_dsl.loads(paste).expand_report().kernels]
    assert len(a) == 1 and a == b
    assert a[0].signature.mask == "top_left" and a[0].signature.lse is True


@pytest.mark.parametrize("alias,canon", [("no_mask", "no"), ("causal", "top_left"), ("t", "top_left"),
                                         ("b", "bottom_right"), ("window_generic", "generic")])
def test_mask_aliases(alias, canon):
    from fmha_dsl.declare import resolve
    from fmha_dsl.parse import parse_text

    d = resolve(parse_text(f"kernel_set s {{ kernel {{ signature {{ mask({alias}) }} }} }}"))[0]
    assert d.fields["mask"].values == (canon,)


@pytest.mark.parametrize("field,alias,canon", [
    ("bias", "elementwise", "bias"), ("bias", "no_bias", "no"), ("qscale", "no_scale", "no"),
    ("rope", "interleaved", "inter"), ("rope", "half_rotated", "half"), ("vlayout", "row", "r"),
    ("dtype", "bfloat16", "bf16")])
def test_ck_aliases(field, alias, canon):
    from fmha_dsl.declare import resolve
    from fmha_dsl.parse import parse_text

    d = resolve(parse_text(f"kernel_set s {{ kernel {{ signature {{ {field}({alias}) }} }} }}"))[0]
    assert d.fields[field].values == (canon,)


def test_include(write):
    write("common.fmha", "kernel_set common { arch(gfx942) kernel { signature { family(fwd) dtype(fp16) } "
                         "algorithm { pipeline(qr_async) tile(*) } } }")
    top = write("top.fmha", 'include "common.fmha"\nkernel_set top { arch(gfx942) kernel { signature { '
                            'family(bwd_dot_do_o) dtype(fp16) hdim(*) mode(*) } algorithm { padding(*) } } }')
    ks = fmha_dsl.load(top)
    assert ks.sets == ("common", "top")
    srcs = {k.source.split(":")[0] for k in ks.expand_report().kernels}
    assert srcs == {"common.fmha", "top.fmha"}


def test_formatter_escapes_strings_and_include_paths():
    from fmha_dsl.parse import parse_text

    text = 'include "a\\\\b.fmha"\nkernel_set a { kernel { algorithm { constraint("x\\ny\\t\\"q\\"") } } }\n'
    out = format_source(text)
    assert format_source(out) == out
    src = parse_text(out)
    assert src.includes[0].path == "a\\b.fmha"
    assert src.sets[0].kernels[0].algorithm[0].args[0].alt.options[0].value == 'x\ny\t"q"'


def test_where_text_is_the_clause_as_written(write):
    """explain quotes the where clause itself -- not the braces of a one-line set around it (nor, over several
    lines, more than its first line)."""
    ks = fmha_dsl.load(write("w.fmha", "kernel_set w { arch(gfx942) dtype(*) hdim(*) pipeline(*) tile(*) padding(*) "
                                       "kernel k { signature { family(fwd) } where hdim_q == 64 } }"))
    assert ks.expand_report().rule_text["where#0"] == "filtered by `where hdim_q == 64`"
    ks = fmha_dsl.load(write("w2.fmha", "kernel_set w { arch(gfx942) dtype(*) hdim(*) pipeline(*) tile(*) "
                                        "padding(*) kernel k { signature { family(fwd) } where hdim_q == 64\n"
                                        "    or hdim_q == 96 } }"))
    assert ks.expand_report().rule_text["where#0"] == "filtered by `where hdim_q == 64 ...`"


def test_loads_with_a_path_follows_includes(write):
    write("common.fmha", "kernel_set a { arch(gfx942) kernel { signature { family(bwd_dot_do_o) dtype(fp16) "
                         "hdim(*) mode(*) } algorithm { padding(*) } } }")
    top = write("top.fmha", "")
    text = 'include "common.fmha"\nkernel_set b { arch(gfx942) kernel { signature { family(bwd_dot_do_o) ' \
           'dtype(bf16) hdim(*) mode(*) } algorithm { padding(*) } } }'
    assert fmha_dsl.loads(text, top).sets == ("a", "b")


@pytest.mark.parametrize("terms,ok", [(300, True), (301, False), (5000, False)])
def test_a_where_clause_too_deep_to_walk_is_a_located_error(write, terms, ok):
    """Long `or` chains and runs of `not` nest one level per operator; past MAX_WHERE_DEPTH (300) a located error,
    where 1,000 used to end in a RecursionError (check and fmt, exit 70)."""
    from fmha_dsl.errors import ParseError

    # `terms` comparisons joined by `or`: terms - 1 `or`s over one `==`, `terms` operators deep
    clause = " or ".join(f"tile_m0 == {i}" for i in range(terms)) if terms < 5000 else "not " * terms + "lse"
    text = ("kernel_set a {\n    arch(gfx942)\n    kernel k { signature { family(fwd) dtype(fp16) hdim(128) }\n"
            f"        where {clause} }}\n}}\n")
    path = write("deep.fmha", text)
    if ok:
        assert len(fmha_dsl.load(path).expand()) == 2
        return
    with pytest.raises(ParseError) as exc:
        fmha_dsl.load(path)
    d = exc.value.diagnostics[0]
    assert d.rule == "where.too-deep" and (d.span.line, d.span.column) == (4, 9) and "in [a, b, ...]" in d.hint
