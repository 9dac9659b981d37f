"""CK split-KV forward: the split kernel (``fwd_splitkv``) and its combine kernel (``fwd_splitkv_combine``).

Derived from upstream's ``codegen/ops/fmha_fwd_splitkv.py`` (ROCm/rocm-libraries @4e5c4b1a, less the one gfx11
hdim-128 b64x32 tile only that PR adds): ``get_fwd_splitkv_blobs`` and ``get_fwd_splitkv_combine_blobs``.
Tables live in ``fmha_dsl/data/ck_splitkv.json`` (each with its ``_source``).

Upstream facts the rules restate:

* the factory is picked by target prefix (``get_factory``): gfx9* -> gfx9 (so gfx950 uses the gfx9 tables and
  the ``_gfx9`` suffix: there is no gfx950 split-KV factory), gfx11* -> gfx11, gfx12* -> gfx12;
* only fp16/bf16 (one shared table) and fp8 have tiles; fp8 has no paged-KV / sink variants and always uses
  static quantisation (``squant = dtype == "fp8"``); the split kernel always writes LSE;
* the combine kernel's tiles and pipelines come from the factory base class: identical on every arch.

Combine-kernel key encoding: CK's dispatcher builds combine kernels at hdim_v x hdim_v and they are
mask-agnostic, so ``hdim = (hdim_v, hdim_v)`` and ``mask`` is fixed to ``"no"``.  The combine kernel has a
single tile parameter, ``bn1``; its Tile is ``tile=(0, 0, 0, bn1, 0, 0)`` (n1 = bn1, the dims the kernel does
not have are 0), ``block_per_cu`` = upstream's occupancy, wave/warp = CK's FmhaAlgorithm defaults (the kernel
has no wave/warp parameters).  Only n1 is checked, so an explicit tile with other dims names the same kernel.
Its pipeline is ``splitkv_combine`` (upstream prints the literal tag ``unused``); pad_sk / pad_d do not exist
for it and keep CK's default.
"""

from __future__ import annotations

import functools

from .. import vocab as V
from .base import ARCH_SUFFIX, FamilyRules, Rule, Tile, pad_token, tf
from .ck_shared import FP16_BF16, PrefixTables, dtype_rule, fwd_domain, fwd_kernel_name, group_mode_pads, \
    group_table, half_row_unquantized, hdim_rule, logits_without_bias, loop_rule, pad_variants, receipt_chain, \
    receipt_rule, row_major_v, static_quant_iff_fp8, table_dtypes, table_hdims

DATA = "ck_splitkv"
TABLES = PrefixTables(DATA)
ck_factory = TABLES.factory  # upstream get_factory: the first target prefix that matches wins (gfx950 -> gfx9)


def suffix(arch: str) -> str:
    # ArchTrait.filename_suffix = "_" + factory name (base.ARCH_SUFFIX spelling; gfx950 -> "_gfx9" here)
    return ARCH_SUFFIX.get(ck_factory(arch), "_" + str(ck_factory(arch)))


def supported(family: str):
    return lambda arch: TABLES.unsupported(family, arch, "CK has no split-KV kernels for it")


# ---------------------------------------------------------------------------------------------- split kernel

@functools.lru_cache(maxsize=None)
def _split_variants(dtype: str) -> dict:
    """pipeline -> set of (vlayout, pads) upstream pairs it with (KernelComponentFactoryBase.get_pipelines)."""
    out: dict = {}
    for v in (TABLES.pipes(dtype) or {}).get("variants", ()):
        out.setdefault(v["pipeline"], set()).add((v["vlayout"], tuple(v["pads"])))
    return out


SPLIT_PIPELINES = ("qr", "qr_nwarp_sshuffle")


def split_domain(field: str, b: dict):
    if field == "pipeline":
        return SPLIT_PIPELINES
    return fwd_domain(field, b, TABLES.dtypes, TABLES.hdims, TABLES.tiles)  # + logits, sink, paged_kv, squant


# get_fwd_splitkv_blobs' receipt chain (receipts it does not name keep everything)
_split_receipt_ok = receipt_chain({
    # Flash attention integration
    2: lambda b: half_row_unquantized(b) and b["bias"] in ("no", "alibi") and not b["logits"] and not b["sink"],
    # PyTorch integration.  Upstream quirk, kept for parity: it tests `dtype in ["fp16, bf16"]`, a list holding
    # the single string "fp16, bf16", so no dtype ever matches and receipt 4 lists no split kernels (combine
    # kernels remain).
    4: lambda b: (b["dtype"] in ["fp16, bf16"] and b["vlayout"] == "r" and b["bias"] in ("no", "bias")
                  and not b["fp8_static_quant"] and b["mode"] == "batch" and not b["sink"]),
    200: lambda b: half_row_unquantized(b) and b["mode"] == "group",  # aiter mha_varlen_fwd
    600: half_row_unquantized,  # aiter::mha_fwd_splitkv C++ api
})


SPLIT_RULES = (
    dtype_rule("fwd_splitkv", TABLES.dtypes, "split-KV kernels exist for fp16/bf16 (and fp8 on gfx9 / gfx12)"),
    hdim_rule("fwd_splitkv", TABLES.hdims),
    # KernelComponentFactoryBase.get_pipelines: every split pipeline has row-major V
    row_major_v("fwd_splitkv"),
    Rule("ck.fwd_splitkv.pipeline", ("pipeline",),
         lambda b: b["pipeline"] in SPLIT_PIPELINES,
         lambda b: f"fwd_splitkv has no {b['pipeline']} pipeline (only qr and qr_nwarp_sshuffle)",
         hint="use pipeline(qr) or pipeline(qr_nwarp_sshuffle)", blame="pipeline"),
    # get_fwd_splitkv_blobs: "Use qr_nwarp_sshuffle with multiple N warps and qr otherwise"
    Rule("ck.fwd_splitkv.nwarp-sshuffle-iff-multi-n-warps", ("pipeline", "tile"),
         lambda b: (b["tile"].wave[1] != 1) == (b["pipeline"] == "qr_nwarp_sshuffle"),
         lambda b: (f"fwd_splitkv pipeline {b['pipeline']} does not fit a tile with {b['tile'].wave[1]} warp(s) "
                    "along n0: qr_nwarp_sshuffle is used exactly when gemm0 has more than one n warp"),
         hint="use qr_nwarp_sshuffle for tiles with wave n0 > 1 and qr otherwise", blame="pipeline"),
    # get_pipelines: the (pipeline, padding) variants upstream instantiates for this dtype
    pad_variants("fwd_splitkv", lambda b: _split_variants(b["dtype"]).get(b["pipeline"], ()), with_pipeline=True),
    # get_fwd_splitkv_blobs: "in group mode, spad/skpad must be true"
    group_mode_pads("fwd_splitkv"),
    # get_fwd_splitkv_blobs: "logits_soft_cap is only allowed if no bias"
    logits_without_bias("fwd_splitkv"),
    # get_pipelines: fp8 loops sink over ["f"] only
    loop_rule("fwd_splitkv", "sink", TABLES.loop),
    # get_pipelines: fp8 loops pagedkv over ["f"] only
    loop_rule("fwd_splitkv", "paged_kv", TABLES.loop),
    # get_pipelines: squant = (dtype == "fp8")
    static_quant_iff_fp8("fwd_splitkv", TABLES.pipes, "split-KV"),
    receipt_rule("fwd_splitkv",
                 ("receipt", "dtype", "mode", "vlayout", "bias", "logits", "sink", "fp8_static_quant"), _split_receipt_ok),
)


def split_name(b: dict) -> str:
    # FmhaFwdSplitKVKernel.name + FmhaFwdSplitKVPipeline.name
    return fwd_kernel_name("fwd_splitkv", b, (("lse", "lse"), ("fp8_static_quant", "squant"),
                                              ("paged_kv", "pagedkv"), ("sink", "sink")), suffix(b["arch"]))


# ---------------------------------------------------------------------------------------------- combine kernel

def _combine_tiles(dtype: str) -> dict:
    return group_table(DATA, "combine_tiles", dtype, {})


def _combine_pipes(dtype: str) -> dict | None:
    return group_table(DATA, "combine_pipelines", dtype)


def _combine_loop(dtype: str, key: str):
    return (_combine_pipes(dtype) or {}).get(key, ())


def _combine_dtypes(b: dict) -> tuple[str, ...]:
    # get_combine_hdim_tile_size_dict (factory base class): the same on every arch
    return table_dtypes(DATA, "combine_tiles")


def _combine_hdims(dtype: str) -> tuple[tuple[int, int], ...]:
    return table_hdims(DATA, "combine_tiles", dtype)  # built at hdim_v x hdim_v


def combine_tile(bn1: int, block_per_cu: int) -> Tile:
    """The combine kernel's Tile: n1 = bn1, the dims it does not have are 0 (see the module doc)."""
    return Tile((0, 0, 0, bn1, 0, 0), V.WAVE_DEFAULT, V.WARP_DEFAULT, block_per_cu)


@functools.lru_cache(maxsize=None)
def _combine_table_tiles(dtype: str, hdim: tuple[int, int]) -> tuple[Tile, ...]:
    t = _combine_tiles(dtype).get(str(hdim[1])) if hdim[0] == hdim[1] else None
    return (combine_tile(t["bn1"], t["block_per_cu"]),) if t else ()


def _combine_bn1(b: dict) -> int | None:
    t = _combine_tiles(b["dtype"]).get(str(b["hdim"][1]))
    return t["bn1"] if t else None


def combine_domain(field: str, b: dict):
    return fwd_domain(field, b, _combine_dtypes, lambda b: _combine_hdims(b["dtype"]),
                      lambda b: _combine_table_tiles(b["dtype"], b["hdim"]))  # + lse, fp8_static_quant


# get_fwd_splitkv_combine_blobs' receipt chain: only 200 and 600 (plus the fp32 receipts) filter;
# 2, 4, 100, 700, 888 ...: the combine kernel has no branch for them
_combine_receipt_ok = receipt_chain({
    200: lambda b: b["dtype"] in FP16_BF16 and b["mode"] == "group",  # aiter mha_varlen_fwd
    600: lambda b: b["dtype"] in FP16_BF16,  # aiter::mha_fwd_splitkv C++ api
})


COMBINE_RULES = (
    dtype_rule("fwd_splitkv_combine", _combine_dtypes, "combine kernels exist for fp16, bf16 and fp8",
               on_arch=False),
    # CK's dispatcher builds combine kernels at hdim_v x hdim_v
    Rule("ck.fwd_splitkv_combine.hdim-square", ("hdim",),
         lambda b: b["hdim"][0] == b["hdim"][1],
         lambda b: f"fwd_splitkv_combine kernels are keyed by hdim_v only: use hdim ({b['hdim'][1]}, {b['hdim'][1]})",
         hint="give the combine kernel hdim(v, v)", blame="hdim"),
    Rule("ck.fwd_splitkv_combine.hdim", ("dtype", "hdim"),
         lambda b: (b["hdim"][1], b["hdim"][1]) in _combine_hdims(b["dtype"]),
         lambda b: (f"fwd_splitkv_combine has no {b['dtype']} kernels for hdim_v {b['hdim'][1]}"
                    f" (hdim_v: {', '.join(str(h[1]) for h in _combine_hdims(b['dtype']))})"),
         hint="pick one of the listed head dims", blame="hdim"),
    # get_combine_hdim_tile_size_dict: the combine tile is bn1 (32 for every hdim)
    Rule("ck.fwd_splitkv_combine.bn1", ("dtype", "hdim", "tile"),
         lambda b: b["tile"].tile[3] == _combine_bn1(b),
         lambda b: f"fwd_splitkv_combine kernels need tile n1 = bn1 = {_combine_bn1(b)} (got {b['tile'].tile[3]})",
         hint="use tile(*) or tile_n1(32)", blame="tile"),
    # get_fwd_splitkv_combine_blobs: "in group mode, spad must be true"
    group_mode_pads("fwd_splitkv_combine", ("pad_s",), hint="use pad_s(1) or batch mode"),
    # get_combine_pipelines: fp8 combine kernels loop lse over ["f"] only
    loop_rule("fwd_splitkv_combine", "lse", _combine_loop),
    # get_combine_pipelines: squant = (dtype == "fp8")
    static_quant_iff_fp8("fwd_splitkv_combine", _combine_pipes, "combine"),
    receipt_rule("fwd_splitkv_combine", ("receipt", "dtype", "mode"), _combine_receipt_ok),
)


def combine_name(b: dict) -> str:
    # FmhaFwdSplitKVCombineKernel.name: tile `b{bn1}[_o{occ}]`, literal tag `unused`, pads s/dv only
    t: Tile = b["tile"]
    occ = "" if t.block_per_cu == -1 else f"_o{t.block_per_cu}"
    tag = (_combine_pipes(b["dtype"]) or {}).get("name_tag", "unused")
    pad = pad_token(b, (("pad_s", "s"), ("pad_dv", "dv")))
    return (f"fmha_fwd_splitkv_combine_d{b['hdim'][1]}_{b['dtype']}_{b['mode']}_b{t.tile[3]}{occ}_{tag}_{pad}"
            f"_{tf(b['lse'], 'lse')}_{tf(b['fp8_static_quant'], 'squant')}{suffix(b['arch'])}")


# ---------------------------------------------------------------------------------------------- families

FAMILIES = {
    "fwd_splitkv": FamilyRules(
        family="fwd_splitkv",
        fields=("dtype", "hdim", "mode", "vlayout", "pipeline", "tile", "pad_s", "pad_sk", "pad_d", "pad_dv",
                "mask", "bias", "logits", "sink", "paged_kv", "fp8_static_quant"),
        fixed={"lse": True},  # the split kernel always writes its partial LSE
        rules=SPLIT_RULES,
        domain=split_domain,
        ck_name=split_name,
        supported=supported("fwd_splitkv"),
        doc="CK split-KV forward, split kernel (get_fwd_splitkv_blobs)",
    ),
    "fwd_splitkv_combine": FamilyRules(
        family="fwd_splitkv_combine",
        fields=("dtype", "hdim", "mode", "tile", "pad_s", "pad_dv", "lse", "fp8_static_quant"),
        fixed={"pipeline": "splitkv_combine", "mask": "no"},  # mask-agnostic
        rules=COMBINE_RULES,
        domain=combine_domain,
        ck_name=combine_name,
        supported=supported("fwd_splitkv_combine"),
        doc="CK split-KV forward, combine kernel (get_fwd_splitkv_combine_blobs)",
    ),
}
