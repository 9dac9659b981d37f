"""CK backward (``--api bwd``): bwd_dot_do_o, bwd_dq_dk_dv and bwd_convert_dq.

Upstream: ROCm/rocm-libraries @1d30ef29,
``projects/composablekernel/example/ck_tile/01_fmha/codegen/ops/fmha_bwd.py`` (``get_bwd_blobs``,
``get_factory``, ``KernelComponentFactoryGfx9/Gfx950/Gfx12``, ``FmhaBwdApiTrait``, the kernels' ``name``).
Data: ``fmha_dsl/data/ck_bwd.json``.

Upstream enumerates one *trait* per (tile, mode, mask, bias, dbias, dropout, spad1d, dpad, dvpad,
deterministic); every kept trait emits one dq_dk_dv kernel plus the two 1-d kernels it calls (dO·O
and, unless the tile has a max_seq_q, the dQ conversion), each list de-duplicated.  Here dq_dk_dv is
enumerated directly; a 1-d kernel exists exactly when some valid dq_dk_dv trait projects onto it
(:func:`_projections`, computed once per factory / receipt / mask impl).  The tables and domains these rules read:
:mod:`.ck_bwd_table`.
"""

from __future__ import annotations

from .base import FACTORY, FamilyRules, Rule, Tile, enumerate_space, pad_token, tf, x
from .ck_bwd_table import (CONVERT, DOT, DOT_TILE, DQ, M0_1D, ONE_D_OCCUPANCY, _has_trload_tiles, _hdims,
                           _suffix, _table, _trload_of, domain)
from .ck_shared import mask_token

HALF = ("fp16", "bf16")


# ---------------------------------------------------------------- shared predicates

def has_tiles(b):
    # get_dq_dk_dv_tiles: fp32/fp16/bf16 on gfx9 and gfx950, fp16/bf16 on gfx12
    return b["dtype"] in _table(b["factory"])


def hdim_has_tiles(b):
    # get_bwd_blobs: head dims are those of the factory's tiles (bhdq, bhdv)
    return tuple(b["hdim"]) in _hdims(b["factory"], b["dtype"])


def receipt_ok(b) -> bool:
    return receipt_keeps(b, b["receipt"])


def receipt_keeps(b: dict, r: int) -> bool:
    """get_bwd_blobs receipt chain (2, 3, 4, 300, 400, 600), then the fp32 chain (800, 801, else no fp32)."""
    if r < 0:
        return True
    half = b["dtype"] in HALF
    same_pad = b["pad_d"] == b["pad_dv"]
    no_randval = not b["store_randval"]   # dropout in (no, dropout_wg16)
    det = b["deterministic"]
    if r == 2:      # Flash attention integration
        ok = half and b["bias"] in ("no", "alibi") and no_randval and same_pad
    elif r == 3:
        ok = half and b["bias"] in ("no", "alibi") and same_pad and not det
    elif r == 4:    # PyTorch integration
        ok = half and b["bias"] in ("no", "bias") and no_randval and same_pad and not det
    elif r == 300:  # Aiter mha_bwd
        ok = half and b["mode"] == "batch" and no_randval
    elif r == 400:  # Aiter mha_varlen_bwd
        ok = half and b["mode"] == "group" and no_randval
    elif r == 600:  # aiter::mha_bwd C++ api
        ok = half
    else:
        ok = True
    if not ok:
        return False
    if r == 800:    # fp32 only, all variations
        return b["dtype"] == "fp32" and same_pad
    if r == 801:    # fp32 only, minimal set (mask 's_no' exists only in the simplified mask map)
        return (b["dtype"] == "fp32" and b["hdim"][0] in (64, 128) and same_pad and b["mode"] == "batch"
                and b["bias"] == "no" and not b["dropout"] and b["mask"] == "no"
                and b["mask_impl"] == "simplified" and not det)
    return b["dtype"] != "fp32"   # don't build fp32 by default


def _common_rules(fam: str) -> list[Rule]:
    return [
        Rule(f"ck.{fam}.dtype-has-tiles", ("factory", "dtype"), has_tiles,
             "{family} has no {dtype} kernels on {arch}", hint="use fp16 or bf16 (fp32 on gfx9/gfx950 only)",
             blame="dtype"),
        Rule(f"ck.{fam}.hdim-has-tiles", ("factory", "dtype", "hdim"), hdim_has_tiles,
             "{family} has no {dtype} kernels for hdim {hdim} on {arch}",
             hint="use a head dim of the bwd tile table (e.g. 64, 128, 256)", blame="hdim"),
    ]


# ---------------------------------------------------------------- bwd_dq_dk_dv

def tile_matches_hdim(b):
    # tiles carry their head dims: bhdq = hdim_q, bhdv = hdim_v (9-value bwd tile)
    t = b["tile"].tile
    return len(t) == 9 and (t[7], t[8]) == tuple(b["hdim"])


def pad_values(fld: str):
    # get_bwd_blobs: dpad/dvpad in [0, 8, 1]
    return lambda b: b[fld] in (0, 1, 8)


def pad8_needs_dv8(b):
    # get_bwd_blobs (tr_load f): "do not generate instance with only 1 of dpad/dvpad being 8" (dpad 8, dvpad != 8)
    return not (b["pad_d"] == 8 and b["pad_dv"] != 8)


def maxq_batch_only(b):
    # get_bwd_blobs: (mode == group or "no" not in mask) and max_seq_q != 0 -> skip (mode half)
    return b["tile"].max_seq_len_q == 0 or b["mode"] == "batch"


def maxq_no_mask(b):
    # get_bwd_blobs: same condition, mask half
    return b["tile"].max_seq_len_q == 0 or b["mask"] == "no"


def dbias_needs_bias(b):
    # get_bwd_blobs: dbias only with elementwise bias (not with no / alibi)
    return not b["dbias"] or b["bias"] == "bias"


def randval_needs_dropout(b):
    # DROPOUT_MAP variants kept: no, dropout_wg16, dropout_wg16_storerandval (wg32 ones are skipped)
    return not b["store_randval"] or b["dropout"]


def trload_available(b):
    # get_dq_dk_dv_tiles: tr_load 't' tiles exist only on gfx950, fp16/bf16
    return not b["trload"] or _has_trload_tiles(b["factory"], b["dtype"])


def trload_matches_tile(b):
    # get_dq_dk_dv_tiles(dtype, tr_load): a table tile belongs to one tr_load list (explicit tiles: any)
    t = b["tile"]
    if not t.from_table or not _has_trload_tiles(b["factory"], b["dtype"]):
        return True   # explicit tile, or no trload list at all (trload-available decides)
    return _trload_of(b["factory"], b["dtype"]).get(t, b["trload"]) == b["trload"]


def trload_pads(b):
    # get_bwd_blobs: tr_load 't' works only with dpad == dvpad in {0, 8}
    return not b["trload"] or (b["pad_d"] == b["pad_dv"] and b["pad_d"] != 1)


DQ_RULES = tuple(_common_rules(DQ)) + (
    Rule(f"ck.{DQ}.tile-matches-hdim", ("hdim", "tile"), tile_matches_hdim,
         lambda b: f"tile {x(b['tile'].tile)} does not fit hdim {b['hdim']} (needs 9 values ending in bhdq, bhdv)",
         hint="use a 9-value bwd tile whose last two values are hdim_q, hdim_v", blame="tile"),
    Rule(f"ck.{DQ}.pad-d-values", ("pad_d",), pad_values("pad_d"),
         "bwd head-dim padding is 0, 1 or 8 (got pad_d={pad_d})",
         hint="use 0 (none), 8 (multiple of 8) or 1 (any)", blame="pad_d"),
    Rule(f"ck.{DQ}.pad-dv-values", ("pad_dv",), pad_values("pad_dv"),
         "bwd head-dim padding is 0, 1 or 8 (got pad_dv={pad_dv})",
         hint="use 0 (none), 8 (multiple of 8) or 1 (any)", blame="pad_dv"),
    Rule(f"ck.{DQ}.pad-d8-needs-dv8", ("pad_d", "pad_dv"), pad8_needs_dv8,
         "pad_d=8 needs pad_dv=8", hint="set pad_dv to 8 or pad_d to 0/1", blame="pad_dv"),
    Rule(f"ck.{DQ}.maxq-batch-only", ("mode", "tile"), maxq_batch_only,
         lambda b: f"small-seqlen tiles (maxq{b['tile'].max_seq_len_q}) serve batch mode only",
         hint="use a maxq0 tile for group mode", blame="tile"),
    Rule(f"ck.{DQ}.maxq-no-mask", ("tile", "mask"), maxq_no_mask,
         lambda b: f"small-seqlen tiles (maxq{b['tile'].max_seq_len_q}) have no masked variant",
         hint="use a maxq0 tile with masks", blame="tile"),
    Rule(f"ck.{DQ}.dbias-needs-bias", ("bias", "dbias"), dbias_needs_bias,
         "dbias needs elementwise bias", hint="set bias(bias) or drop dbias", blame="dbias"),
    Rule(f"ck.{DQ}.randval-needs-dropout", ("dropout", "store_randval"), randval_needs_dropout,
         "store_randval needs dropout", hint="add dropout or drop store_randval", blame="store_randval"),
    Rule(f"ck.{DQ}.trload-available", ("factory", "dtype", "trload"), trload_available,
         "{dtype} bwd has no transposed-load (trload) kernels on {arch}",
         hint="trload kernels exist for fp16/bf16 on gfx950 only", blame="trload"),
    Rule(f"ck.{DQ}.trload-pads", ("pad_d", "pad_dv", "trload"), trload_pads,
         "trload kernels need pad_d == pad_dv in {{0, 8}}", hint="use padding 0/0 or 8/8 with trload",
         blame="trload"),
    Rule(f"ck.{DQ}.trload-matches-tile", ("factory", "dtype", "tile", "trload"), trload_matches_tile,
         lambda b: f"tile {x(b['tile'].tile)} is listed for {'non-' if b['trload'] else ''}trload kernels only",
         hint="pick a tile of the matching trload list", blame="trload"),
    Rule(f"receipt.{DQ}", ("receipt", "mask_impl", "dtype", "hdim", "mode", "mask", "bias", "dropout",
                           "store_randval", "pad_d", "pad_dv", "deterministic"), receipt_ok,
         "receipt {receipt} has no such bwd_dq_dk_dv kernel", filter=True),
)


def _dq_tile_token(t: Tile) -> str:
    # FmhaBwdDQDKDVTileSize.name: three wave triples, two warp triples, _o and _maxq always printed (gfx12: _o-1)
    return (f"b{x(t.tile)}_r{x(t.wave[0:3])}_r{x(t.wave[3:6])}_r{x(t.wave[6:9])}"
            f"_w{x(t.warp[0:3])}_w{x(t.warp[3:6])}_o{t.block_per_cu}_maxq{t.max_seq_len_q}")


def _dq_pad_token(b) -> str:
    # FmhaBwdDQDKDVKernel.name: p + d{dpad} + dv{dvpad} (zeros left out), else npad
    s = (f"d{b['pad_d']}" if b["pad_d"] else "") + (f"dv{b['pad_dv']}" if b["pad_dv"] else "")
    return "p" + s if s else "npad"


def _dropout_token(b) -> str:
    # DROPOUT_MAP keys kept by get_bwd_blobs
    if not b["dropout"]:
        return "ndropout"
    return "dropout_wg16_storerandval" if b["store_randval"] else "dropout_wg16"


def dq_name(b: dict) -> str:
    # FmhaBwdDQDKDVKernel.name + arch suffix
    # (mask: simplified -> mask/nmask; generic -> nmask, mc (causal), mg (generic))
    return "_".join([
        f"fmha_bwd_d{b['hdim'][0]}_{b['dtype']}_{b['mode']}", _dq_tile_token(b["tile"]), _dq_pad_token(b),
        b["bias"] if b["bias"] != "no" else "nbias", tf(b["dbias"], "dbias"), mask_token(b),
        _dropout_token(b), tf(b["deterministic"], "deterministic"), tf(b["trload"], "trload"),
    ]) + _suffix(b)


# ---------------------------------------------------------------- 1-d kernels: projections of dq_dk_dv traits

def spad1d_allowed(mode: str, maxq: int, spad: int) -> bool:
    # get_bwd_blobs: group mode always pads seqlen in the 1-d kernels;
    # 0 < max_seq_q < M0_1D requires seqlen padding
    if mode == "group" and not spad:
        return False
    return spad or not (0 < maxq < M0_1D)


_TRAITS: dict = {}
_PROJ: dict = {}


def _traits(b: dict) -> list:
    """Every dq_dk_dv binding of b's arch with no receipt filter; cached per (factory, mask_impl)."""
    key = (b["factory"], b["mask_impl"])
    if key not in _TRAITS:
        _TRAITS[key] = enumerate_space(FAMILIES[DQ], b["arch"], -1, b["mask_impl"])
    return _TRAITS[key]


def _projections(b: dict, receipt: int) -> tuple[frozenset, frozenset]:
    """(dot_do_o keys, convert_dq keys) of every dq_dk_dv trait valid on b's arch under ``receipt``.

    Upstream applies the receipt to the whole trait, so a 1-d kernel is kept when some kept trait uses
    it.  dot_do_o key: (dtype, hdim, mode, spad, dvpad > 0); convert_dq key: (dtype, hdim, mode,
    convert bn0, spad, dpad > 0, deterministic) -- FmhaBwdApiTrait.dot_do_o_kernel / convert_dq_kernel.
    Cached per (factory, receipt, mask_impl).
    """
    key = (b["factory"], receipt, b["mask_impl"])
    hit = _PROJ.get(key)
    if hit is None:
        dot, conv = set(), set()
        for t in _traits(b):
            if not receipt_keeps(t, receipt):
                continue
            tile, mode = t["tile"], t["mode"]
            for spad in (0, 1):
                if not spad1d_allowed(mode, tile.max_seq_len_q, spad):
                    continue
                dot.add((t["dtype"], t["hdim"], mode, spad, int(t["pad_dv"] > 0)))
                if tile.max_seq_len_q == 0:   # convert_dq_kernel.disabled = max_seq_q != 0
                    bn0 = tile.tile[1] if t["deterministic"] else 0
                    conv.add((t["dtype"], t["hdim"], mode, bn0, spad, int(t["pad_d"] > 0), t["deterministic"]))
        hit = _PROJ[key] = (frozenset(dot), frozenset(conv))
    return hit


def _dot_key(b):
    return (b["dtype"], tuple(b["hdim"]), b["mode"], b["pad_s"], b["pad_dv"])


def _convert_key(b):
    return (b["dtype"], tuple(b["hdim"]), b["mode"], b["tile"].tile[1], b["pad_s"], b["pad_d"], b["deterministic"])


def dot_from_trait(b):
    return _dot_key(b) in _projections(b, -1)[0]


def dot_receipt_ok(b):
    return b["receipt"] < 0 or _dot_key(b) in _projections(b, b["receipt"])[0]


def convert_from_trait(b):
    return _convert_key(b) in _projections(b, -1)[1]


def convert_receipt_ok(b):
    return b["receipt"] < 0 or _convert_key(b) in _projections(b, b["receipt"])[1]


def group_needs_pad_s(b):
    # get_bwd_blobs: (mode == group) and (spad1d == f) -> skip
    return b["mode"] != "group" or b["pad_s"] == 1


def _flag_rule(fam: str, fld: str) -> Rule:
    # FmhaBwdApiTrait: the 1-d kernels take spad1d and dpad > 0 / dvpad > 0 as booleans
    return Rule(f"ck.{fam}.{fld.replace('_', '-')}-is-flag", (fld,), lambda b: b[fld] in (0, 1),
                f"{fam} takes {fld} 0 or 1 (got {{{fld}}})", hint="use 0 (none) or 1 (padded)", blame=fld)


def _one_d_pad_token(b, dim_field: str, dim_tok: str) -> str:
    return pad_token(b, (("pad_s", "s"), (dim_field, dim_tok)))


DOT_RULES = tuple(_common_rules(DOT)) + (
    _flag_rule(DOT, "pad_s"),
    _flag_rule(DOT, "pad_dv"),
    Rule(f"ck.{DOT}.group-needs-pad-s", ("mode", "pad_s"), group_needs_pad_s,
         "group mode bwd kernels always pad seqlen (pad_s=1)", hint="set pad_s to 1", blame="pad_s"),
    Rule(f"ck.{DOT}.from-dq-dk-dv-trait", ("arch", "factory", "mask_impl", "dtype", "hdim", "mode", "pad_s",
                                          "pad_dv"), dot_from_trait,
         "no bwd_dq_dk_dv kernel on {arch} calls a dot_do_o kernel with this dtype, hdim, mode and padding",
         hint="dot_do_o kernels exist only as companions of bwd_dq_dk_dv kernels", blame="pad_dv"),
    Rule(f"receipt.{DOT}", ("arch", "factory", "mask_impl", "receipt", "dtype", "hdim", "mode", "pad_s",
                            "pad_dv"), dot_receipt_ok,
         "receipt {receipt} has no such bwd_dot_do_o kernel", filter=True),
)


def dot_name(b: dict) -> str:
    # FmhaBwdOGradDotOKernel.name: b{M0_1D}, o{occupancy}, pad = s (spad1d) + dv (dvpad > 0)
    t = b["tile"]
    return (f"fmha_bwd_dot_do_o_d{b['hdim'][0]}_{b['dtype']}_b{t.tile[0]}_{b['mode']}_o{t.block_per_cu}_"
            f"{_one_d_pad_token(b, 'pad_dv', 'dv')}{_suffix(b)}")


def convert_tile_shape(b):
    # FmhaBwdApiTrait.convert_dq_kernel: bm0 = M0_1D, occupancy 2
    t = b["tile"]
    return t.tile[0] == M0_1D and t.block_per_cu == ONE_D_OCCUPANCY


def convert_bn0_matches_det(b):
    # FmhaBwdApiTrait.convert_dq_bn0: the dq_dk_dv tile's bn0 if deterministic else 0
    return (b["tile"].tile[1] != 0) == bool(b["deterministic"])


CONVERT_RULES = tuple(_common_rules(CONVERT)) + (
    Rule(f"ck.{CONVERT}.tile-shape", ("tile",), convert_tile_shape,
         lambda b: f"convert_dq kernels use bm0 {M0_1D} and occupancy {ONE_D_OCCUPANCY} "
                   f"(got bm0 {b['tile'].tile[0]}, block_per_cu {b['tile'].block_per_cu})",
         hint=f"use tile({M0_1D}, bn0, ...) with block_per_cu({ONE_D_OCCUPANCY})", blame="tile"),
    _flag_rule(CONVERT, "pad_s"),
    _flag_rule(CONVERT, "pad_d"),
    Rule(f"ck.{CONVERT}.group-needs-pad-s", ("mode", "pad_s"), group_needs_pad_s,
         "group mode bwd kernels always pad seqlen (pad_s=1)", hint="set pad_s to 1", blame="pad_s"),
    Rule(f"ck.{CONVERT}.bn0-matches-deterministic", ("tile", "deterministic"), convert_bn0_matches_det,
         lambda b: ("deterministic convert_dq kernels take the dq_dk_dv tile's bn0 (not 0)" if b["deterministic"]
                    else f"non-deterministic convert_dq kernels have bn0 0 (got {b['tile'].tile[1]})"),
         hint="bn0 = the dq_dk_dv tile's bn0 when deterministic, else 0", blame="tile"),
    Rule(f"ck.{CONVERT}.from-dq-dk-dv-trait", ("arch", "factory", "mask_impl", "dtype", "hdim", "mode", "tile",
                                              "pad_s", "pad_d", "deterministic"), convert_from_trait,
         "no bwd_dq_dk_dv kernel on {arch} calls a convert_dq kernel with this dtype, hdim, mode, bn0 and padding",
         hint="convert_dq kernels exist only as companions of bwd_dq_dk_dv kernels (maxq0 tiles)", blame="tile"),
    Rule(f"receipt.{CONVERT}", ("arch", "factory", "mask_impl", "receipt", "dtype", "hdim", "mode", "tile",
                                "pad_s", "pad_d", "deterministic"), convert_receipt_ok,
         "receipt {receipt} has no such bwd_convert_dq kernel", filter=True),
)


def convert_name(b: dict) -> str:
    # FmhaBwdConvertQGradKernel.name: b{M0_1D}x{bn0}, o{occupancy}, pad = s (spad1d) + d (dpad > 0)
    t = b["tile"]
    return (f"fmha_bwd_convert_dq_d{b['hdim'][0]}_{b['dtype']}_b{t.tile[0]}x{t.tile[1]}_{b['mode']}"
            f"_o{t.block_per_cu}_{_one_d_pad_token(b, 'pad_d', 'd')}_{tf(b['deterministic'], 'deterministic')}"
            f"{_suffix(b)}")


# ---------------------------------------------------------------- families

def _supported(family: str):
    def supported(arch: str) -> str | None:
        factory = FACTORY.get(arch)
        if factory in ("sm80", "sm90"):
            return f"{family} is not supported on {arch} (CK is AMD only)"
        if factory not in ("gfx9", "gfx950", "gfx12"):
            # get_factory: anything but gfx950*, gfx9*, gfx12* raises "Unsupported device target"
            return f"{family} is not supported on {arch} (CK has no backward kernels for {factory} targets)"
        return None
    return supported


def _family(family: str, fields: tuple[str, ...], rules: tuple[Rule, ...], ck_name, fixed: dict, doc: str):
    return FamilyRules(family=family, fields=fields, rules=rules, domain=domain, ck_name=ck_name, fixed=fixed,
                       supported=_supported(family), doc=doc)


FAMILIES = {
    DOT: _family(DOT, ("dtype", "hdim", "mode", "pad_s", "pad_dv"), DOT_RULES, dot_name,
                 {"pipeline": "dot_do_o", "tile": DOT_TILE},
                 "CK bwd pre-pass: D = rowsum(dO * O), one per (dtype, hdim, mode, padding) used by a "
                 "dq_dk_dv kernel"),
    DQ: _family(DQ, ("dtype", "hdim", "mode", "tile", "pad_d", "pad_dv", "mask", "bias", "dropout", "store_randval",
                     "dbias", "deterministic", "trload"), DQ_RULES, dq_name,
                {"pipeline": "bwd"}, "CK bwd main kernel: dQ (accumulated), dK, dV"),
    CONVERT: _family(CONVERT, ("dtype", "hdim", "mode", "tile", "pad_s", "pad_d", "deterministic"), CONVERT_RULES,
                     convert_name, {"pipeline": "convert_dq"},
                     "CK bwd post-pass: converts the fp32 dQ accumulator (deterministic: reduces its bn0 splits)"),
}
