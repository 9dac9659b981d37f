"""Expansion semantics: defaults, wildcards, alternatives, explicit errors, where filters, tiles."""

import json
import os

import pytest

import fmha_dsl
from fmha_dsl import FmhaError, RuleError


def expand(write, body, arch=None, profile=None):
    ks = fmha_dsl.load(write("t.fmha", "kernel_set t {\n" + body + "\n}\n"))
    return ks.expand_report(arch=arch, profile=profile)


def test_explicit_kernel_like_ck_example_01(write):
    """CK's examples/fmha/cpp/01_basic_fmha.cpp declaration, ported setter by setter."""
    body = """
    add(FmhaSignature().family("fwd").dtype("fp16").mode("batch").vlayout("r").hdim(128)
                       .mask("no").bias("no").lse(false).dropout(false).qscale("no"),
        FmhaAlgorithm().tile_m0(128).tile_n0(128).tile_k0(32).tile_n1(128).tile_k1(32).tile_k0max(128)
                       .wave_m0(4).wave_n0(1).wave_k0(1).wave_m1(4).wave_n1(1).wave_k1(1)
                       .warp_m0(32).warp_n0(32).warp_k0(16).warp_m1(32).warp_n1(32).warp_k1(16)
                       .pipeline("qr_async").padding(true, true, true, true),
        "gfx950")"""
    rep = expand(write, body)
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    assert k.key.arch == "gfx950"
    assert k.key.algorithm.tile == (128, 128, 32, 128, 32, 128)
    assert k.key.algorithm.wave[:6] == (4, 1, 1, 4, 1, 1)
    assert k.name == ("fmha_fwd_d128_fp16_batch_b128x128x32x128x32x128_r4x1x1_r4x1x1_w32x32x16_w32x32x16_"
                      "qr_async_vr_psskddv_nlogits_nbias_nmask_nlse_ndropout_nskip_nqscale_ntrload_nsink_gfx950")


def test_named_setters_override_bulk_and_autofill(write):
    body = """
    kernel k {
        signature { family(fwd) dtype(fp16) hdim(64) }
        algorithm { pipeline(qr_async) tile_n0(64) tile(128, 128, 32, 0, 0, 0) wave(4, 1, 1, 4, 1, 1)
                    warp(32, 32, 16, 32, 32, 16) padding(true, true, true, true) }
        arch(gfx942)
    }"""
    k = expand(write, body).kernels[0].key.algorithm
    # named tile_n0 wins over the bulk value; n1 <- n0, k1 <- k0, k0max <- k0 (CK auto_fill)
    assert k.tile == (128, 64, 32, 64, 32, 32)


def test_alternatives_are_a_product(write):
    body = """
    kernel k {
        signature { family(fwd) dtype(fp16 | bf16) mode(batch | group) hdim(128) }
        algorithm { pipeline(qr_async) tile(*) padding(true, true, true, true) }
        arch(gfx942)
    }"""
    ks = expand(write, body).kernels
    assert {(k.key.signature.dtype, k.key.signature.mode) for k in ks} == {
        ("fp16", "batch"), ("fp16", "group"), ("bf16", "batch"), ("bf16", "group")}


def test_explicit_invalid_combination_is_an_error_at_the_setter(write):
    body = """
    kernel k {
        signature { family(fwd) dtype(fp16) hdim(128) logits(true) bias(bias) }
        algorithm { pipeline(*) tile(*) padding(*) }
        arch(gfx942)
    }"""
    with pytest.raises(RuleError) as info:
        expand(write, body)
    err = info.value
    assert err.line == 4  # the signature line holding the setters
    assert err.hint
    assert "bias" in err.message or "logits" in err.message


def test_unsupported_dtype_on_arch_is_located(write):
    body = """
    arch(gfx1100)
    kernel k {
        signature { family(fwd) dtype(fp8bf16) hdim(128) }
        algorithm { pipeline(*) tile(*) padding(*) }
    }"""
    with pytest.raises(RuleError) as info:
        expand(write, body)
    assert info.value.line == 5
    assert info.value.column >= 30  # points into dtype(...)


def test_fixed_field_of_family_is_an_error(write):
    body = """
    kernel k {
        signature { family(fwd_appendkv) dtype(fp16) hdim(128) mask(top_left) }
        arch(gfx942)
    }"""
    with pytest.raises(RuleError) as info:
        expand(write, body)
    assert info.value.rule == "family.fixed-field"
    assert "mask" in info.value.message


def test_wildcards_drop_silently_and_are_counted(write):
    body = """
    arch(gfx942)
    kernel k {
        signature { family(fwd) dtype(*) hdim(*) mode(*) mask(*) bias(*) logits(*) }
        algorithm { pipeline(*) tile(*) padding(*) }
    }"""
    rep = expand(write, body)
    assert rep.kernels
    assert sum(rep.dropped.values()) > 0
    assert all(rid for rid in rep.dropped)


def test_declaration_expanding_to_nothing_is_an_error(write):
    body = """
    arch(gfx942)
    kernel k {
        signature { family(fwd) dtype(*) hdim(*) }
        algorithm { pipeline(*) tile(*) padding(*) }
        where hdim_q == 1000
    }"""
    with pytest.raises(RuleError) as info:
        expand(write, body)
    assert info.value.rule == "decl.empty" and info.value.line == 4
    assert info.value.hint.startswith("it gives kernels with no `where` on line 7;")


@pytest.mark.parametrize("sig,loosen", [
    ("dtype(bf16) hdim(128) qscale(pertensor)", "it gives kernels with `dtype(*)` or with `qscale(*)`;"),
    ("dtype(fp8bf16) hdim(128) mode(group) lse(true)", "it gives kernels with `dtype(*)` or with `lse(*)`;"),
])
def test_an_empty_declaration_says_which_value_leaves_it_empty(write, sig, loosen):
    """Rules that read several fields drop a written value's candidates silently when another field is a
    wildcard: the error names the values that, made `*`, give kernels (a tile table's rules, which drop as many in
    any expansion, are what dropped most)."""
    with pytest.raises(RuleError) as info:
        expand(write, f"arch(gfx942)\n    kernel k {{ signature {{ family(fwd) {sig} }} }}")
    assert info.value.rule == "decl.empty" and info.value.hint.startswith(loosen), info.value.hint


def test_a_tile_pattern_the_table_lacks_names_the_tiles_it_has(write):
    """tile(16, 64, *, ...) on sm90: the Triton table has no m0 = 16 there.  The hint lists the table's (m0, n0)
    pairs, checked against the table itself."""
    import re

    from fmha_dsl.rules.triton_fwd import _tiles

    body = """
    backend(triton)
    arch(sm90)
    kernel k {
        signature { family(fwd) dtype(fp16) mode(batch) hdim(64) mask(no) }
        algorithm { pipeline(qr) tile(16, 64, *, *, *, *) }
    }"""
    with pytest.raises(RuleError) as info:
        expand(write, body)
    d = info.value.diagnostics[0]
    assert d.rule == "decl.empty" and "sm90" in d.hint and "m0/n0" in d.hint
    listed = {tuple(int(x) for x in m) for m in re.findall(r"\((\d+), (\d+)\)", d.hint.split(" in ", 1)[1])}
    assert listed == {(t.tile[0], t.tile[1]) for t in _tiles("sm90", 64, 64)}
    assert (16, 64) not in listed


def test_arch_override_and_narrowing(write):
    body = """
    arch(gfx942, gfx950)
    kernel k {
        signature { family(bwd_dot_do_o) dtype(*) hdim(*) mode(*) }
        algorithm { padding(*) }
    }"""
    assert {k.key.arch for k in expand(write, body, arch="gfx950").kernels} == {"gfx950"}
    with pytest.raises(FmhaError) as info:
        expand(write, body, arch="gfx1100")
    assert info.value.rule == "arch.not-declared"


def test_profile_filters(write):
    body = """
    arch(gfx942)
    kernel k {
        signature { family(fwd) dtype(*) hdim(*) mode(*) mask(*) bias(*) lse(*) dropout(*) logits(*)
                    skip(*) sink(*) qscale(*) }
        algorithm { pipeline(*) tile(*) padding(*) }
    }"""
    default = expand(write, body)
    flash = expand(write, body, profile="flash_fwd")
    assert 0 < len(flash.kernels) < len(default.kernels)
    # receipt 2 (flash_fwd): fp16/bf16, bias no/alibi, no qscale, no skip
    for k in flash.kernels:
        s = k.key.signature
        assert s.dtype in ("fp16", "bf16") and s.bias in ("no", "alibi") and not s.skip
    assert len(expand(write, body, profile=2).kernels) == len(flash.kernels)


def test_unknown_profile_and_arch_arguments(write):
    with pytest.raises(FmhaError) as info:
        expand(write, "kernel k { }", profile="pytorc")
    assert info.value.rule == "usage.profile" and "pytorch" in info.value.hint
    with pytest.raises(FmhaError) as info:
        expand(write, "kernel k { }", arch="gfx951")
    assert info.value.rule == "usage.arch" and "gfx950" in info.value.hint


EXPLICIT = """
    kernel k {{
        signature {{ family(fwd) dtype(fp16) hdim({hdim}) }}
        algorithm {{ pipeline({pipe}) tile({tile}) wave({wave}) warp({warp}) padding(true, true, true, true) }}
        arch({arch})
    }}"""


@pytest.mark.parametrize("hdim,pipe,tile,wave,warp,arch,rule", [
    # async: 3 buffers x max(512*64, 32*64) x 2 bytes = 196608 > 160 KiB
    ("64", "qr_async", "128, 512, 64, 64, 32, 64", "4, 1, 1, 4, 1, 1", "32, 32, 16, 32, 32, 16", "gfx942",
     "ck.tile.lds-capacity"),
    # m0 = 128 is not a multiple of warp m = 48
    ("64", "qr", "128, 64, 32, 64, 32, 64", "4, 1, 1, 4, 1, 1", "48, 32, 16, 32, 32, 16", "gfx942",
     "ck.tile.warp-divides-tile"),
    # qr, hdim 256: (64/32) * (32/16) = 4 MFMA instructions per step, not a multiple of 8
    ("256", "qr", "128, 64, 32, 256, 32, 256", "4, 1, 1, 4, 1, 1", "32, 32, 16, 32, 32, 16", "gfx942",
     "ck.tile.mfma-count"),
    # qr_async, fp16 on gfx942: n0*k0 = 32*16 = 512 is not a multiple of (128/16 warps)*64*(4/2) = 1024
    ("64", "qr_async", "128, 32, 16, 64, 32, 64", "8, 1, 1, 8, 1, 1", "16, 16, 16, 16, 16, 16", "gfx942",
     "ck.tile.async-dma"),
    # k0 = 48 does not divide k0max = 64
    ("64", "qr", "128, 64, 48, 64, 32, 64", "4, 1, 1, 4, 1, 1", "16, 16, 16, 16, 16, 16", "gfx942",
     "ck.tile.k0-fits-hdim"),
])
def test_explicit_tiles_checked_like_ck_dispatcher(write, hdim, pipe, tile, wave, warp, arch, rule):
    body = EXPLICIT.format(hdim=hdim, pipe=pipe, tile=tile, wave=wave, warp=warp, arch=arch)
    with pytest.raises(RuleError) as info:
        expand(write, body)
    assert rule in [d.rule for d in info.value.diagnostics], info.value.render()
    assert info.value.line == 5  # the algorithm line, where tile(...) is


def test_explicit_valid_tile_passes_all_checks(write):
    body = EXPLICIT.format(hdim="128", pipe="qr_async", tile="128, 128, 32, 128, 32, 128", wave="4, 1, 1, 4, 1, 1",
                           warp="32, 32, 16, 32, 32, 16", arch="gfx950")
    assert len(expand(write, body).kernels) == 1


@pytest.mark.parametrize("setter,expect", [
    ("wave(4, 1, 1)", (4, 1, 1, 2, 2, 1, 1, 1, 1)),
    ("wave(4, 1, 1, 4, 1, 1)", (4, 1, 1, 4, 1, 1, 1, 1, 1)),
    ("warp(16, 16, 32)", (16, 16, 32, 32, 32, 16, 16, 16, 16)),
    ("warp(16, 16, 32, 16, 16, 16)", (16, 16, 32, 16, 16, 16, 16, 16, 16)),
])
def test_short_wave_warp_padded_like_ck(setter, expect):
    """CK's scraper pads .wave(a,b,c) with (2,2,1,1,1,1) and .warp(a,b,c) with (32,32,16,16,16,16)."""
    from fmha_dsl.expand import _explicit_tiles
    from fmha_dsl.declare import resolve
    from fmha_dsl.parse import parse_text

    d = resolve(parse_text(f"kernel_set s {{ kernel {{ algorithm {{ {setter} }} }} }}"))[0]
    (t,) = _explicit_tiles(d)
    assert (t.wave if setter.startswith("wave") else t.warp) == expect


SPLIT_AND_DOT = """
    arch(gfx942)
    dtype(*) hdim(*) mode(*) mask(*) bias(*) lse(*) logits(*) sink(*) paged_kv(*) fp8_static_quant(*)
    pipeline(*) tile(*) padding(*)
    kernel split { signature { family(fwd_splitkv) } }
    kernel dot { signature { family(bwd_dot_do_o) } }"""


def test_profile_that_leaves_a_declaration_empty_is_a_warning(write):
    """Upstream's receipt 4 lists no split-KV kernels: a warning, like upstream's empty list, not an error."""
    body = SPLIT_AND_DOT
    rep = expand(write, body, profile="pytorch")
    assert rep.kernels and all(k.sig["family"] == "bwd_dot_do_o" for k in rep.kernels)
    assert [d.rule for d in rep.notes] == ["profile.empty"] and rep.notes[0].severity == "warning"


def test_the_kernel_limit_neither_hides_an_explain_row_nor_makes_a_profile_empty(write, monkeypatch):
    """Past FMHA_DSL_MAX_KERNELS, explain (keep-going) still shows the declaration's row, and the check that a
    profile left a declaration empty (whose walk without the profile stops at its first kernel) still says so."""
    body = SPLIT_AND_DOT
    full = expand(write, body, profile="pytorch")
    monkeypatch.setenv("FMHA_DSL_MAX_KERNELS", str(len(full.kernels) + 1))
    rep = expand(write, body, profile="pytorch")   # (split's walk without the profile would pass the limit)
    assert [d.rule for d in rep.notes] == ["profile.empty"] and len(rep.kernels) == len(full.kernels)
    ks = fmha_dsl.load(write("wide.fmha", "kernel_set w {\n    arch(gfx942)\n"
                                          "    kernel wide { signature { family(fwd) dtype(fp16) hdim(128) mask(*) "
                                          "bias(*) } }\n"
                                          "    kernel small { signature { family(fwd) dtype(bf16) hdim(128) } }\n}\n"))
    monkeypatch.setenv("FMHA_DSL_MAX_KERNELS", "5")
    rep = ks.expand_report(keep_going=True)
    assert set(rep.per_decl) == {"wide", "small"} and rep.per_decl["small"] == {"gfx942": 2}
    assert [d.rule for d in rep.errors] == ["decl.too-many"]


def test_alignments_auto_fill_from_k0max(write):
    """CK's auto_fill: hdim_q/v_alignment <= 0 take tile_k0max; explicit alignments are kept."""
    base = """
    kernel k {{
        signature {{ family(fwd) dtype(fp16) hdim(128) }}
        algorithm {{ pipeline(qr_async) tile(128, 128, 32, 128, 32, 128) wave(4, 1, 1, 4, 1, 1)
                    warp(32, 32, 16, 32, 32, 16) padding(true, true, true, true) {extra} }}
        arch(gfx942)
    }}"""
    a = expand(write, base.format(extra="")).kernels[0].key.algorithm
    assert (a.hdim_q_alignment, a.hdim_v_alignment) == (128, 128)
    a = expand(write, base.format(extra="alignments(8, 16)")).kernels[0].key.algorithm
    assert (a.hdim_q_alignment, a.hdim_v_alignment) == (8, 16)


@pytest.mark.parametrize("clause,keeps", [
    ('rope == "none"', True),          # rope's `none`, not the mask alias `none` -> `no`
    ("dtype == half", True),           # dtype alias: half -> fp16
    ("mask in [causal]", True),        # mask alias: causal -> top_left
    ('dtype == "bf16"', False),
])
def test_where_literals_use_the_compared_fields_aliases(write, clause, keeps):
    body = f"""
    kernel k {{
        signature {{ family(fwd) dtype(fp16) hdim(128) mask(causal) }}
        algorithm {{ pipeline(qr_async) tile(*) padding(true, true, true, true) }}
        arch(gfx942)
        where {clause}
    }}"""
    if keeps:
        assert expand(write, body).kernels
    else:
        with pytest.raises(RuleError):
            expand(write, body)


def test_alternatives_in_an_explicit_tile_are_a_product(write):
    body = """
    kernel k {
        signature { family(fwd) dtype(fp16) hdim(64) }
        algorithm { pipeline(qr_async) tile(128, 64 | 128, 32, 0, 0, 64) wave(4, 1, 1, 4, 1, 1)
                    warp(32, 32, 16, 32, 32, 16) padding(true, true, true, true) }
        arch(gfx942)
    }"""
    tiles = sorted(k.key.algorithm.tile for k in expand(write, body).kernels)
    assert tiles == [(128, 64, 32, 64, 32, 64), (128, 128, 32, 128, 32, 64)]


def test_arch_star_narrowed_to_an_arch_of_another_backend(write):
    """ck's `arch(*)` is the AMD archs: asking for sm90 says so instead of failing."""
    with pytest.raises(FmhaError) as info:
        expand(write, "arch(*)\n kernel k { signature { family(fwd) } }", arch="sm90")
    assert info.value.rule == "arch.not-declared" and "gfx942" in info.value.message


def test_explicit_tile_in_a_kernel_replaces_a_set_level_tile_star(write):
    """A set-level tile(*) is a default: a kernel's own explicit tile replaces it (one kernel, that tile)."""
    body = ("tile(*)\n kernel k { signature { family(fwd) dtype(fp16) mode(batch) hdim(128) mask(no) }\n"
            " algorithm { pipeline(qr_async) tile(128, 128, 32, 128, 32, 128) padding(true, true, true, true) } }")
    rep = expand(write, body, arch="gfx942")
    assert [tuple(k.key.algorithm.tile[:6]) for k in rep.kernels] == [(128, 128, 32, 128, 32, 128)]


def test_arch_not_declared_names_the_archs_of_the_requested_backend(write):
    """`arch(*)` under --backend ck means the AMD archs: the message must not list NVIDIA ones."""
    ks = fmha_dsl.load(write("t.fmha", "kernel_set t {\n backend(triton) arch(*)\n kernel k { signature { family(fwd) } }\n}\n"))
    with pytest.raises(FmhaError) as info:
        ks.expand_report(arch="sm90", backend="ck")
    assert info.value.rule == "arch.not-declared" and "sm90" not in info.value.message.split("declared for")[1]


TMA_KERNEL = """
    backend(triton)
    arch({arch})
    kernel k {{
        signature {{ family(fwd) dtype(fp16) mode(batch) hdim(128) mask(no) vlayout({vlayout}) }}
        algorithm {{ pipeline({pipe}) tile(128, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *) }}
    }}"""


@pytest.mark.parametrize("pipe,stages", [("qr_async_trload", 2), ("qr_async_trload_v3", 3), ("qr_async", 3)])
def test_tma_pipelines_on_sm90(write, pipe, stages):
    """The TMA pipelines exist on sm90 with their stage counts; (128, 64) on 4 warps at d128 keeps 192
    accumulators per thread, the register budget's edge (3/4 of 256)."""
    from fmha_dsl.compile_triton import compile_options
    from fmha_dsl.rules.triton_fwd import acc_regs, reg_budget

    ks = fmha_dsl.load(write("t.fmha", "kernel_set t {\n" + TMA_KERNEL.format(arch="sm90", vlayout="r", pipe=pipe)
                             + "\n}\n"))
    (e,) = ks.registry(arch="sm90")
    assert e.alg["pipeline"] == pipe
    assert compile_options(e.sig, e.alg, "sm90")["num_stages"] == stages
    b = {"arch": "sm90", "tile": _tile_of(e)}
    assert acc_regs(b) == (128 * 128 + 128 * 64) // 128 == reg_budget("sm90") == 192


def _tile_of(e):
    from fmha_dsl.rules.base import Tile

    return Tile(tuple(e.alg["tile"]), tuple(e.alg["wave"]), tuple(e.alg["warp"]), e.alg["block_per_cu"], 0, True)


@pytest.mark.parametrize("arch", ["sm80", "gfx942", "gfx1100"])
def test_tma_pipeline_needs_an_arch_with_tma(write, arch):
    with pytest.raises(RuleError) as info:
        expand(write, TMA_KERNEL.format(arch=arch, vlayout="r", pipe="qr_async_trload"))
    d = info.value.diagnostics[0]
    assert d.rule == "triton.tma" and arch in d.message and "qr_async" in d.hint
    assert info.value.line == 7  # the algorithm line that names the pipeline


def test_tma_pipeline_needs_row_major_v(write):
    with pytest.raises(RuleError) as info:
        expand(write, TMA_KERNEL.format(arch="sm90", vlayout="c", pipe="qr_async_trload"))
    assert info.value.diagnostics[0].rule == "triton.tma-vlayout"


def test_pipeline_star_draws_tma_only_where_the_arch_has_it(write):
    body = """
    backend(triton)
    arch(sm90, sm80)
    kernel k {
        signature { family(fwd) dtype(fp16) mode(batch) hdim(64) mask(no) vlayout(*) }
        algorithm { pipeline(*) tile(64, 64, *, *, *, *) }
    }"""
    packed = {("qr_nwarp_sshuffle", "r"), ("qr_nwarp_sshuffle", "c")}  # GQA-packed rows: every arch, both layouts
    for arch, want in (("sm90", {("qr", "r"), ("qr", "c"), ("qr_async", "r"), ("qr_async", "c"),
                                 ("qr_async_trload", "r"), ("qr_async_trload_v3", "r")} | packed),
                       ("sm80", {("qr", "r"), ("qr", "c"), ("qr_async", "r"), ("qr_async", "c")} | packed)):
        ks = fmha_dsl.load(write("t.fmha", "kernel_set t {\n" + body + "\n}\n"))
        got = {(e.alg["pipeline"], e.sig["vlayout"]) for e in ks.registry(arch=arch)}
        assert got == want, arch


# ---- the minimal declaration: in a kernel { } block, an unset pipeline and tile mean `*` ---------------------
MINIMAL = "kernel fwd { signature { family(fwd) dtype(bf16) hdim(128) } }"


@pytest.mark.parametrize("backend", ["ck", "triton"])
@pytest.mark.parametrize("algorithm", ["", "algorithm { tile(*) }", "algorithm { pipeline(*) }"])
def test_the_minimal_declaration_expands(write, backend, algorithm):
    body = f"backend({backend}) arch(*)\n" + MINIMAL.replace(" } }", " } " + algorithm + " }")
    rep = expand(write, body)
    assert rep.kernels and {k.arch for k in rep.kernels} >= {"gfx90a", "gfx942", "gfx950"}
    assert all(k.sig["hdim_q"] == 128 and k.sig["dtype"] == "bf16" for k in rep.kernels)
    assert all(k.alg["pad_s"] == k.alg["pad_sk"] == 1 for k in rep.kernels)  # padding keeps its default


def test_add_form_keeps_cks_algorithm_defaults(write):
    """`.add(..., FmhaAlgorithm()...)` is CK's C++ and keeps FmhaAlgorithm()'s defaults (pipeline qr, CK's
    default tile); fmt spells them out when it rewrites the line as a block, so the meaning stays."""
    from fmha_dsl.fmt import format_source

    body = ('add(FmhaSignature().family("fwd").dtype("fp16").hdim(128).bias("bias"), '
            'FmhaAlgorithm().tile_n0(128).wave(4, 1, 1, 4, 1, 1), "gfx942")\n'
            'add(FmhaSignature().family("fwd").dtype("fp16").hdim(64), FmhaAlgorithm().pipeline("qr_async"), "gfx942")')
    rep = expand(write, body)
    assert [(k.alg["pipeline"], k.alg["tile"]) for k in rep.kernels] == [
        ("qr", (128, 128, 32, 128, 32, 128)), ("qr_async", (128, 64, 32, 128, 32, 128))]
    text = "kernel_set t {\n" + body + "\n}\n"
    block = format_source(text)
    assert ".add" not in block and "pipeline(qr)" in block and "tile(128, 64, 32, 128, 32, 128)" in block
    assert [k.identifier for k in fmha_dsl.loads(block).expand_report().kernels] == \
        [k.identifier for k in rep.kernels]


# ---- Triton: variants that cannot make another kernel are dropped and counted --------------------------------
def test_triton_expansion_has_no_two_kernels_with_the_same_code(write):
    """Every kept key compiles to its own binary: what decides the code (the template's constexprs and the
    compile options) differs between any two keys of an arch."""
    pytest.importorskip("triton")
    from fmha_dsl.compile_triton import compile_options
    from fmha_dsl.kernels.fwd_host import constexprs

    body = """backend(triton) arch(*)
    kernel k {
        signature { family(fwd | fwd_splitkv) dtype(bf16) hdim(128 | 80) mode(*) mask(*) bias(no) lse(*)
                    dropout(false) sink(*) logits(false) vlayout(r) }
        algorithm { padding(*) tile(128, 64, *, *, *, *) pipeline(*) }
    }"""
    rep = expand(write, body)
    seen = {}
    for k in rep.kernels:
        code = (k.arch, k.alg.get("max_splits_log2"), tuple(sorted(constexprs(k.sig, k.alg).items())),
                tuple(sorted(compile_options(k.sig, k.alg, k.arch).items())))
        assert code not in seen, (k.name, seen[code])
        seen[code] = k.name
    assert rep.dropped["triton.same-kernel"] > 0            # sink(true) without a mask
    assert rep.dropped["triton.group-mode-padding"] > 0     # group mode pads rows and columns anyway
    # hdim 80: pad_d false masks against the constant 80 (16-byte loads), pad_d true against the run-time head dim
    # (any Dq <= 80): two kernels, both kept
    assert {k.alg["pad_d"] for k in rep.kernels if k.sig["hdim_q"] == 80} == {0, 1}
    assert all(not (k.sig["sink"] and k.sig["mask"] == "no") for k in rep.kernels)


# ---- the backward's shared-memory bound against what Triton's builds take ---------------------------------------
SHARED_BYTES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results",
                            "2026-11-28_cpu_bwd_shared_bytes_s38.json")


@pytest.mark.parametrize("aligned", [True, False])
def test_the_backward_shared_memory_bound_drops_no_kernel_that_fits(aligned):
    """Against the shared memory (LDS) Triton's CPU builds of the backward candidates took, per arch
    (bench/results/..._cpu_bwd_shared_bytes_s38.json, bench/measure_bwd_shared.py): no build that fits its arch is
    over the bound -- the rule's (any build) or first use's for aligned builds -- and on sm90 first use's bound
    drops most aligned builds that do not fit, the tiles among the cost model's first candidates at head dims
    160-256 (the build fails the rest: tests/test_build_triton.py::test_bigger_than_lds_fails_its_build)."""
    from types import SimpleNamespace

    from fmha_dsl import arch as arch_table
    from fmha_dsl.kernels.bwd_abi import block_d
    from fmha_dsl.rules.triton_bwd import smem_bytes

    with open(SHARED_BYTES) as f:
        doc = json.load(f)
    measured = [(a, rows) for part in (("archs", "archs_triton_3_9") if aligned else ("archs_unaligned",))
                for a, rows in doc[part].items()]
    assert {a for a, _ in measured} >= {"sm90", "sm80", "gfx942"} | ({"gfx1100"} if aligned else set())
    for arch, rows in measured:
        limit = arch_table.info(arch)["shared_bytes"]
        over = dropped = 0
        for dtype, hq, hv, (m0, n0), warps, pipeline, det, real in rows:
            dq, dv = block_d(hq), block_d(hv)
            b = {"tile": SimpleNamespace(tile=(m0, n0, dq, m0, dv, m0, n0, dq, dv)), "dtype": dtype, "arch": arch,
                 "pipeline": pipeline, "deterministic": det}
            for bound in {smem_bytes(b), smem_bytes(b, aligned=aligned)}:
                assert bound <= limit or real > limit, (arch, dtype, hq, hv, m0, n0, warps, pipeline, det, real, bound)
            over += real > limit
            dropped += smem_bytes(b, aligned=aligned) > limit
        assert rows and (arch != "sm90" or not aligned or dropped >= 0.85 * over), (arch, over, dropped)


def test_a_declaration_past_the_kernel_limit_stops_with_a_located_error(write, monkeypatch):
    """A wildcard left open can mean millions of kernels (CK's receipt 0 under the Triton backend: 4.8 M on sm90):
    past FMHA_DSL_MAX_KERNELS the expansion stops at the declaration instead of filling memory."""
    path = write("big.fmha", """
kernel_set s {
    arch(gfx942)
    kernel wide { signature { family(fwd) dtype(fp16) hdim(128) mask(*) bias(*) } }
}
""")
    ks = fmha_dsl.load(path)
    n = len(ks.expand())
    assert n > 10
    monkeypatch.setenv("FMHA_DSL_MAX_KERNELS", str(n))
    assert len(ks.expand()) == n
    monkeypatch.setenv("FMHA_DSL_MAX_KERNELS", str(n - 1))
    with pytest.raises(RuleError, match=f"more than {n - 1:,} kernels"):   # (past the limit after the walk)
        ks.expand()
    limit = (n - 1) // 3   # the walk stops at three bindings a kernel (mask values one kernel serves)
    monkeypatch.setenv("FMHA_DSL_MAX_KERNELS", str(limit))
    import fmha_dsl.expand as ex
    from fmha_dsl.rules.base import TooMany

    stopped = []

    def search(*a, **k):  # the walk itself stops past the limit (memory stays bounded), not the caller after it
        try:
            return real(*a, **k)
        except TooMany:
            stopped.append(a[5] if len(a) > 5 else k.get("most"))
            raise
    real = ex.search
    monkeypatch.setattr(ex, "search", search)
    with pytest.raises(RuleError) as exc:
        ks.expand()
    assert stopped == [3 * limit]
    d = exc.value.diagnostics[0]
    assert d.rule == "decl.too-many" and (d.span.line, d.span.column) == (4, 5)
    assert f"more than {limit:,} kernels" in d.message and "FMHA_DSL_MAX_KERNELS" in d.hint


def test_the_triton_backends_one_d_backward_stages_expand():
    """bwd_dot_do_o and bwd_convert_dq have a 1-d tile (m0, n0): no head-dim alignment to fill from it (was an
    IndexError)."""
    for family in ("bwd_dot_do_o", "bwd_convert_dq"):
        keys = fmha_dsl.loads(f"kernel_set f {{ backend(triton) arch(sm90) kernel k {{ signature {{ family({family}) "
                              f"dtype(bf16) hdim(128) }} }} }}").expand()
        assert len(keys) == 1 and keys[0].signature.family == family
        assert keys[0].algorithm.hdim_q_alignment == keys[0].algorithm.hdim_v_alignment == 0


@pytest.mark.parametrize("where,word,hint", [
    ('pipeline != "qrasync"', "qrasync", "did you mean `qr_async`?"),
    ('pipeline in ["qr_async", "qr_asinc"]', "qr_asinc", "did you mean `qr_async`?"),
    ('mask != "top_lefft"', "top_lefft", "did you mean `top_left`?"),
    ("pipeline == top_left", "top_left", "pipeline is one of: "),
    ('arch == "gfx943"', "gfx943", "did you mean `gfx942`?"),
])
def test_a_value_the_compared_field_never_takes_is_a_located_error(write, where, word, hint):
    """Quoted or bare, a value is checked against the field it is compared with (a typo used to keep or drop every
    kernel silently)."""
    line = f"    kernel k {{ signature {{ family(fwd) dtype(fp16) hdim(128) }} where {where} }}"
    with pytest.raises(FmhaError) as exc:
        fmha_dsl.load(write("w.fmha", "kernel_set f {\n    arch(gfx942)\n" + line + "\n}\n")).expand()
    d = exc.value.diagnostics[0]
    assert d.rule == "where.unknown-value" and d.message.startswith(f"`{word}` is not a")
    assert d.span.line == 3 and line[d.span.column - 1:].lstrip('"').startswith(word) and hint in d.hint
    ok = fmha_dsl.load(write("ok.fmha", 'kernel_set f {\n    arch(gfx942)\n    kernel k { signature { family(fwd) '
                                        'dtype(fp16) hdim(128) } where mask == "no" and arch == "gfx942" }\n}\n'))
    assert len(ok.expand()) == 2


def test_two_declarations_of_one_label_keep_a_row_each(write):
    """`explain` keys its rows by label: a second `kernel x` used to overwrite the first's counts."""
    rep = expand(write, "    arch(gfx942)\n"
                        "    kernel x { signature { family(fwd) dtype(fp16) hdim(128) } }\n"
                        "    kernel x { signature { family(fwd) dtype(bf16) hdim(128) } }")
    assert rep.per_decl == {"x": {"gfx942": 2}, "x (t.fmha:4)": {"gfx942": 2}}
    assert sum(sum(c.values()) for c in rep.per_decl.values()) == len(rep.kernels) == 4


@pytest.mark.parametrize("head,masks,want", [
    ("arch(gfx942)", "mask(top_left) } } kernel b { signature { family(fwd) dtype(bf16) hdim(128) lse(false) "
     "mask(bottom_right)", {"top_left"}),
    ("arch(gfx942) mask_impl(generic)", "mask(t | b | g)", {"top_left", "generic"}),
    ("backend(triton) arch(sm90)", "mask(top_left | bottom_right | generic)", {"top_left"}),
])
def test_mask_values_that_name_one_kernel_give_one_registry_entry(head, masks, want, tmp_path):
    """One compiled causal kernel serves both corners (the corner is a run-time argument), and CK's simplified
    masks and Triton's serve a window too: such values give one key, so a build never writes a registry that
    `Registry.load` then refuses as `registry.duplicate` (session 44's review)."""
    import fmha_dsl

    src = (f"kernel_set s {{ {head} kernel a {{ signature {{ family(fwd) dtype(bf16) hdim(128) lse(false) "
           f"{masks} }} " + ("algorithm { pipeline(qr_async) tile(128, 128, *, *, *, *) padding(true, true, false, "
                             "false) } " if "triton" in head else "") + "} }")
    reg = fmha_dsl.loads(src).registry()
    names = [(e.arch, e.name) for e in reg]
    assert len(names) == len(set(names)) > 0
    assert {e.sig["mask"] for e in reg} == want
    path = tmp_path / "registry.json"
    reg.save(str(path))
    assert len(fmha_dsl.Registry.load(str(path))) == len(reg)


def test_a_nine_value_tile_is_the_backwards_only(write):
    body = ("arch(gfx942)\n    kernel k { signature { family(fwd) dtype(bf16) hdim(128) }\n"
            "               algorithm { pipeline(qr) tile(128, 128, 32, 128, 32, 128, 1, 2, 3) } }")
    with pytest.raises(RuleError) as info:
        expand(write, body)
    d = info.value.diagnostics[0]
    assert d.rule == "tile.length" and "6 values" in d.message and d.hint
    assert d.span.source_line[:d.span.column].endswith("32, 128, 1")   # the caret under the seventh value


def test_ck_on_an_nvidia_arch_points_at_the_triton_backend(write):
    with pytest.raises(RuleError) as info:
        expand(write, "arch(sm90)\n    kernel k { signature { family(fwd) dtype(bf16) hdim(128) } }")
    assert info.value.rule == "decl.unsupported" and "add `backend(triton)`" in info.value.hint


def test_an_empty_declaration_probes_each_written_value_once(write, monkeypatch):
    """The probes that find what to loosen do not probe again (they did, recursively: 14 s for one where clause)."""
    from fmha_dsl import expand as E

    made = []
    init = E._Expander.__init__
    monkeypatch.setattr(E._Expander, "__init__", lambda self, *a, **k: (made.append(1), init(self, *a, **k))[1])
    body = """
    kernel k {
        signature { family(fwd) dtype(fp16) hdim(128) mask(causal) }
        algorithm { pipeline(qr_async) tile(*) padding(true, true, true, true) }
        arch(gfx942)
        where dtype == "bf16"
    }"""
    with pytest.raises(RuleError) as info:
        expand(write, body)
    assert "`dtype(*)`" in info.value.hint
    assert len(made) <= 1 + 12 + 1, len(made)   # the expansion, at most 12 probes, the profile's probe


def test_a_nine_value_tile_serves_the_backward_of_a_declaration_of_several_families(write):
    """With bwd_dq_dk_dv among its families, a nine-value tile is its tile: the other families (which take six)
    are left out, not an error."""
    rep = expand(write, "arch(gfx942)\n    kernel k { signature { family(bwd_dq_dk_dv | bwd_convert_dq) dtype(fp16) "
                        "hdim(128) } algorithm { tile(*, 128, *, *, *, *, *, *, *) } }")
    assert rep.kernels and {k.sig["family"] for k in rep.kernels} == {"bwd_dq_dk_dv"}
    assert [(n.rule, n.severity) for n in rep.notes if "bwd_convert_dq" in n.message] == [("tile.length", "warning")]


def test_the_kernel_limit_counts_one_kernel_once_whatever_mask_values_name_it(write, monkeypatch):
    monkeypatch.setenv("FMHA_DSL_MAX_KERNELS", "2")   # (three bindings, one kernel)
    rep = expand(write, "backend(triton) arch(sm90)\n    kernel k { signature { family(fwd) dtype(bf16) hdim(128) "
                        "lse(false) mask(top_left | bottom_right | generic) } algorithm { pipeline(qr_async) "
                        "tile(128, 128, *, *, *, *) padding(true, true, false, false) } }")
    assert len(rep.kernels) == 1


def test_an_arch_list_names_each_arch_no_declaration_is_for():
    """`--arch sm90,gfx942` on a set for sm90 only: gfx942 is an error (it was left out unseen), as `--arch gfx942`
    alone is."""
    from fmha_dsl.errors import RuleError

    ks = fmha_dsl.loads("kernel_set one { backend(triton) arch(sm90)\n kernel k { signature { family(fwd) dtype(fp16) "
                        "hdim(64) mask(no) } } }")
    assert {k.arch for k in ks.expand(arch="sm90")} == {"sm90"}
    with pytest.raises(RuleError) as e:
        ks.expand(arch="sm90,gfx942")
    d = e.value.diagnostics[0]
    assert d.rule == "arch.not-declared" and "no declaration is for gfx942 (of --arch sm90,gfx942)" in d.message
    assert d.span.line == 1 and "arch(gfx942)" in d.hint


def test_a_backend_override_that_has_no_kernels_for_the_arch_says_to_drop_it():
    """`--backend ck` on a set that declares backend(triton) for sm90: the hint names the override (it said to add
    backend(triton), which the set already has)."""
    ks = fmha_dsl.loads("kernel_set one { backend(triton) arch(sm90)\n kernel k { signature { family(fwd) dtype(fp16) "
                        "hdim(64) mask(no) } } }")
    with pytest.raises(RuleError) as e:
        ks.expand(arch="sm90", backend="ck")
    d = e.value.diagnostics[0]
    assert d.rule == "decl.unsupported" and d.hint == ("--backend ck overrides the set's backend(triton), and sm90 is "
                                                       "not a ck target: drop --backend")


def test_an_alternative_that_gives_no_kernel_is_a_warning_at_its_place():
    """`tile(32 | 64, 64, ...)` on sm90 qr_async: no tile of the table has m0 = 32, so 32 vanished unseen (explain
    said nothing was dropped); now a warning points at it.  A value that gives kernels is not named."""
    text = ("kernel_set alt { backend(triton) arch(sm90)\n kernel k { signature { family(fwd) dtype(fp16 | bf16) "
            "hdim(64) mask(no) } algorithm { tile(32 | 64, 64, *, *, *, *) pipeline(qr_async) "
            "padding(false, false, false, false) }\n where dtype == \"fp16\" } }")
    rep = fmha_dsl.loads(text).expand_report(arch="sm90")
    notes = [n for n in rep.notes if n.rule == "decl.unused-value"]
    assert [n.message for n in notes] == [
        "`k`: `dtype` value 'bf16', written as an alternative, gives no kernel",
        "`k`: tile[0] = 32, written as an alternative, gives no kernel"]
    assert all(n.severity == "warning" and n.hint for n in notes)
    assert text.splitlines()[1][notes[1].span.column - 1:].startswith("32 | 64")
    assert len(rep.kernels) == 1
    clean = fmha_dsl.loads(text.replace("32 | 64", "64").replace("fp16 | bf16", "fp16"))
    clean = clean.expand_report(arch="sm90")
    assert not [n for n in clean.notes if n.rule == "decl.unused-value"]


def test_an_alternative_another_arch_uses_is_not_named_when_arch_narrows(tmp_path):
    text = ("kernel_set per { backend(triton) arch(sm90 | sm80)\n kernel k { signature { family(fwd) dtype(fp16) "
            "hdim(64) mask(no) } algorithm { tile(128 | 64, 64, *, *, *, *) pipeline(qr_async) "
            "padding(false, false, false, false) }\n where tile_m0 == 128 and arch == \"sm90\" or tile_m0 == 64 and "
            "arch == \"sm80\" } }")
    ks = fmha_dsl.loads(text)
    for arch in (None, "sm90", "sm80"):
        rep = ks.expand_report(arch=arch)
        assert rep.kernels and not [n for n in rep.notes if n.rule == "decl.unused-value"], (arch, rep.notes)
