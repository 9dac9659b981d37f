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
from ..data import load
from .base import ARCH_SUFFIX, FamilyRules, Rule, Tile, pad_token, tf, x

FP16_BF16 = ("fp16", "bf16")
CK_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")


# ---------------------------------------------------------------------------------------------- data helpers

def _data() -> dict:
    return load("ck_splitkv")


@functools.lru_cache(maxsize=None)
def ck_factory(arch: str) -> str | None:
    """Upstream ``get_factory``: the first target prefix that matches wins (gfx950 -> gfx9)."""
    for prefix, factory in _data()["factory_by_target_prefix"]["value"]:
        if arch.startswith(prefix):
            return factory
    return None


def dtype_group(dtype: str) -> str | None:
    """Key of the per-dtype tables: fp16/bf16 share one table; upstream tests `dtype in ["fp8", "bf8"]`."""
    if dtype in FP16_BF16:
        return "fp16_bf16"
    if dtype in ("fp8", "bf8"):
        return "fp8"
    return None


def ordered_dtypes(groups) -> tuple[str, ...]:
    """Dtypes whose group is in ``groups``, in upstream's loop order (FWD_DTYPE_MAP keys)."""
    keys = _data()["common"]["fwd_dtype_keys"]["value"]
    return tuple(d for d in keys if dtype_group(d) in groups)


def table_tile(t: dict) -> Tile:
    """A fwd-style table entry as a Tile (6-element wave/warp padded with CK's (1,1,1) / (16,16,16))."""
    return Tile(tuple(t["tile"]), tuple(t["wave"]) + (1, 1, 1), tuple(t["warp"]) + (16, 16, 16), t["block_per_cu"])


def mask_domain(mask_impl: str) -> tuple[str, ...]:
    # cpp_symbol_map.get_mask_map: simplified {s_no, s_mask}; generic {no, causal, generic}
    return ("no", "top_left") if mask_impl == "simplified" else ("no", "top_left", "generic")


def mask_token(b: dict) -> str:
    # Fwd pipeline names: simplified -> nmask / mask; generic -> nmask / mc (causal) / mg (generic)
    if b["mask"] == "no":
        return "nmask"
    if b["mask_impl"] == "simplified":
        return "mask"
    return "mg" if b["mask"] == "generic" else "mc"


def bias_token(bias: str) -> str:
    return "nbias" if bias == "no" else bias


def tile_token(t: Tile) -> str:
    # FmhaFwdTileSize.name: b{tile}_r{wave gemm0}_r{wave gemm1}_w{warp gemm0}_w{warp gemm1}[_o{occupancy}]
    s = f"b{x(t.tile)}_r{x(t.wave[0:3])}_r{x(t.wave[3:6])}_w{x(t.warp[0:3])}_w{x(t.warp[3:6])}"
    return s if t.block_per_cu == -1 else f"{s}_o{t.block_per_cu}"


def suffix(arch: str) -> str:
    # ArchTrait.filename_suffix = "_" + factory name (base.ARCH_SUFFIX spelling; gfx950 -> "_gfx9" here)
    return ARCH_SUFFIX.get(ck_factory(arch), "_" + str(ck_factory(arch)))


def profile_text(b: dict) -> str:
    r = b["receipt"]
    return f"profile {V.RECEIPT_TO_PROFILE.get(r, r)} (receipt {r})"


def unsupported_reason(family: str, arch: str, what: str) -> str | None:
    if arch not in CK_ARCHS:
        return f"{family} is not supported on {arch} (CK is AMD only)"
    if ck_factory(arch) is None:
        return f"{family} is not supported on {arch} (CK has no {what} kernels for it)"
    return None


# ---------------------------------------------------------------------------------------------- split kernel

def _tiles(arch: str) -> dict:
    return _data()["tiles"].get(ck_factory(arch), {})


def _pipes(dtype: str) -> dict | None:
    g = dtype_group(dtype)
    return _data()["pipelines"].get(g) if g else None


@functools.lru_cache(maxsize=None)
def _split_dtypes(arch: str) -> tuple[str, ...]:
    # get_hdim_tile_size_dict returns None for dtypes without a table -> skipped
    return ordered_dtypes(set(_tiles(arch)))


@functools.lru_cache(maxsize=None)
def _split_hdims(arch: str, dtype: str) -> tuple[tuple[int, int], ...]:
    g = dtype_group(dtype)
    return tuple((int(h), int(h)) for h in _tiles(arch).get(g, {})) if g else ()


@functools.lru_cache(maxsize=None)
def _split_tiles(arch: str, dtype: str, hdim: tuple[int, int]) -> tuple[Tile, ...]:
    if hdim[0] != hdim[1]:
        return ()
    g = dtype_group(dtype)
    return tuple(table_tile(t) for t in _tiles(arch).get(g, {}).get(str(hdim[0]), ()))


@functools.lru_cache(maxsize=None)
def _split_variants(dtype: str) -> dict:
    """pipeline -> set of (vlayout, pads) upstream pairs it with (KernelComponentFactoryBase.get_pipelines)."""
    out: dict = {}
    for v in (_pipes(dtype) or {}).get("variants", ()):
        out.setdefault(v["pipeline"], set()).add((v["vlayout"], tuple(v["pads"])))
    return out


def _split_loop(dtype: str, key: str) -> list:
    p = _pipes(dtype)
    return p["loop"][key] if p else []


SPLIT_PIPELINES = ("qr", "qr_nwarp_sshuffle")


def split_domain(field: str, b: dict):
    arch = b["arch"]
    if field == "dtype":
        return _split_dtypes(arch)
    if field == "hdim":
        return _split_hdims(arch, b["dtype"])
    if field == "tile":
        return _split_tiles(arch, b["dtype"], b["hdim"])
    if field == "mode":
        return V.MODES
    if field == "vlayout":
        return V.VLAYOUTS
    if field == "pipeline":
        return SPLIT_PIPELINES
    if field in ("pad_s", "pad_sk", "pad_d", "pad_dv"):
        return (0, 1)
    if field == "mask":
        return mask_domain(b["mask_impl"])
    if field == "bias":
        return V.BIASES
    return (False, True)  # logits, sink, paged_kv, fp8_static_quant


def _split_pads(b: dict) -> tuple[int, int, int, int]:
    return (b["pad_s"], b["pad_sk"], b["pad_d"], b["pad_dv"])


def _split_receipt_ok(b: dict) -> bool:
    """get_fwd_splitkv_blobs' receipt chain (receipts it does not name keep everything)."""
    r, d = b["receipt"], b["dtype"]
    if r == -1:  # profile `all`: no receipt filter
        return True
    if r in (800, 801):  # fp32-only receipts; split-KV has no fp32 kernels
        return d == "fp32"
    row, squant = b["vlayout"] == "r", b["fp8_static_quant"]
    if r == 2:  # Flash attention integration
        return (d in FP16_BF16 and row and b["bias"] in ("no", "alibi") and not b["logits"] and not squant
                and not b["sink"])
    if r == 4:  # PyTorch integration
        # Upstream quirk, kept for parity: it tests `dtype in ["fp16, bf16"]`, a list holding the single string
        # "fp16, bf16", so no dtype ever matches and receipt 4 lists no split kernels (combine kernels remain).
        return (d in ["fp16, bf16"] and row and b["bias"] in ("no", "bias") and not squant
                and b["mode"] == "batch" and not b["sink"])
    if r == 200:  # aiter mha_varlen_fwd
        return d in FP16_BF16 and b["mode"] == "group" and row and not squant
    if r == 600:  # aiter::mha_fwd_splitkv C++ api
        return d in FP16_BF16 and row and not squant
    if r == 700:  # TE does not use this API
        return False
    return True


def _variants_text(b: dict) -> str:
    pairs = sorted(p for _, p in _split_variants(b["dtype"]).get(b["pipeline"], ()))
    return ", ".join("(" + ", ".join(map(str, p)) + ")" for p in pairs) or "none"


SPLIT_RULES = (
    Rule("ck.fwd_splitkv.dtype", ("dtype", "arch"),
         lambda b: b["dtype"] in _split_dtypes(b["arch"]),
         lambda b: f"fwd_splitkv has no {b['dtype']} kernels on {b['arch']}",
         hint="split-KV kernels exist for fp16/bf16 (and fp8 on gfx9 / gfx12)", blame="dtype"),
    Rule("ck.fwd_splitkv.hdim", ("dtype", "hdim", "arch"),
         lambda b: b["hdim"] in _split_hdims(b["arch"], b["dtype"]),
         lambda b: (f"fwd_splitkv has no {b['dtype']} kernels for hdim {b['hdim']} on {b['arch']}"
                    f" (head dims: {', '.join(str(h[0]) for h in _split_hdims(b['arch'], b['dtype']))})"),
         hint="pick one of the listed head dims (hdim_q = hdim_v)", blame="hdim"),
    # KernelComponentFactoryBase.get_pipelines: every split pipeline has row-major V
    Rule("ck.fwd_splitkv.row-major-v", ("vlayout",),
         lambda b: b["vlayout"] == "r",
         "fwd_splitkv kernels only support row-major V",
         hint="use vlayout(r)", blame="vlayout"),
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
    Rule("ck.fwd_splitkv.pad-variants", ("dtype", "pipeline", "vlayout", "pad_s", "pad_sk", "pad_d", "pad_dv"),
         lambda b: (b["vlayout"], _split_pads(b)) in _split_variants(b["dtype"]).get(b["pipeline"], ()),
         lambda b: (f"fwd_splitkv {b['dtype']} {b['pipeline']} kernels come only with padding (s, sk, d, dv) in "
                    f"{_variants_text(b)}"),
         hint="pick one of the listed padding combinations", blame="pad_s"),
    # get_fwd_splitkv_blobs: "in group mode, spad/skpad must be true"
    Rule("ck.fwd_splitkv.group-mode-pads", ("mode", "pad_s", "pad_sk"),
         lambda b: b["mode"] != "group" or (b["pad_s"] and b["pad_sk"]),
         "group-mode fwd_splitkv kernels need seqlen padding (pad_s and pad_sk)",
         hint="use padding(1, 1, ...) or batch mode", blame="mode"),
    # get_fwd_splitkv_blobs: "logits_soft_cap is only allowed if no bias"
    Rule("ck.fwd_splitkv.logits-without-bias", ("bias", "logits"),
         lambda b: not b["logits"] or b["bias"] == "no",
         "logits soft-cap cannot be combined with bias in fwd_splitkv kernels",
         hint="drop `logits` or use bias(no)", blame="logits"),
    # get_pipelines: fp8 loops sink over ["f"] only
    Rule("ck.fwd_splitkv.sink", ("dtype", "sink"),
         lambda b: b["sink"] in _split_loop(b["dtype"], "sink"),
         lambda b: f"fwd_splitkv {b['dtype']} kernels have no sink variant",
         hint="drop `sink` for this dtype", blame="sink"),
    # get_pipelines: fp8 loops pagedkv over ["f"] only
    Rule("ck.fwd_splitkv.paged-kv", ("dtype", "paged_kv"),
         lambda b: b["paged_kv"] in _split_loop(b["dtype"], "paged_kv"),
         lambda b: f"fwd_splitkv {b['dtype']} kernels have no paged-kv variant",
         hint="drop `paged_kv` for this dtype", blame="paged_kv"),
    # get_pipelines: squant = (dtype == "fp8")
    Rule("ck.fwd_splitkv.static-quant-iff-fp8", ("dtype", "fp8_static_quant"),
         lambda b: b["fp8_static_quant"] == (_pipes(b["dtype"]) or {}).get("fp8_static_quant"),
         lambda b: (f"fwd_splitkv {b['dtype']} kernels always use fp8 static quantization" if b["dtype"] == "fp8"
                    else f"fwd_splitkv {b['dtype']} kernels have no fp8 static quantization"),
         hint="fp8 split-KV kernels need `fp8_static_quant`; other dtypes must not set it",
         blame="fp8_static_quant"),
    Rule("receipt.fwd_splitkv",
         ("receipt", "dtype", "mode", "vlayout", "bias", "logits", "sink", "fp8_static_quant"),
         _split_receipt_ok,
         lambda b: f"{profile_text(b)} leaves out this fwd_splitkv kernel",
         filter=True),
)


def split_name(b: dict) -> str:
    # FmhaFwdSplitKVKernel.name + FmhaFwdSplitKVPipeline.name
    pad = pad_token(b, (("pad_s", "s"), ("pad_sk", "sk"), ("pad_d", "d"), ("pad_dv", "dv")))
    return (f"fmha_fwd_splitkv_d{b['hdim'][0]}_{b['dtype']}_{b['mode']}_{tile_token(b['tile'])}_{b['pipeline']}"
            f"_v{b['vlayout']}_{pad}_{tf(b['logits'], 'logits')}_{bias_token(b['bias'])}_{mask_token(b)}"
            f"_{tf(b['lse'], 'lse')}_{tf(b['fp8_static_quant'], 'squant')}_{tf(b['paged_kv'], 'pagedkv')}"
            f"_{tf(b['sink'], 'sink')}{suffix(b['arch'])}")


# ---------------------------------------------------------------------------------------------- combine kernel

def _combine_tiles(dtype: str) -> dict:
    g = dtype_group(dtype)
    return _data()["combine_tiles"].get(g, {}) if g else {}


def _combine_pipes(dtype: str) -> dict | None:
    g = dtype_group(dtype)
    return _data()["combine_pipelines"].get(g) if g else None


@functools.lru_cache(maxsize=None)
def _combine_dtypes() -> tuple[str, ...]:
    # get_combine_hdim_tile_size_dict (factory base class): the same on every arch
    return ordered_dtypes({k for k in _data()["combine_tiles"] if not k.startswith("_")})


@functools.lru_cache(maxsize=None)
def _combine_hdims(dtype: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(h), int(h)) for h in _combine_tiles(dtype))  # built at hdim_v x hdim_v


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
    if field == "dtype":
        return _combine_dtypes()
    if field == "hdim":
        return _combine_hdims(b["dtype"])
    if field == "tile":
        return _combine_table_tiles(b["dtype"], b["hdim"])
    if field == "mode":
        return V.MODES
    if field in ("pad_s", "pad_dv"):
        return (0, 1)
    return (False, True)  # lse, fp8_static_quant


def _combine_receipt_ok(b: dict) -> bool:
    """get_fwd_splitkv_combine_blobs' receipt chain: only 200 and 600 (plus the fp32 receipts) filter."""
    r, d = b["receipt"], b["dtype"]
    if r == -1:
        return True
    if r in (800, 801):  # fp32-only receipts
        return d == "fp32"
    if r == 200:  # aiter mha_varlen_fwd
        return d in FP16_BF16 and b["mode"] == "group"
    if r == 600:  # aiter::mha_fwd_splitkv C++ api
        return d in FP16_BF16
    return True  # 2, 4, 100, 700, 888 ...: the combine kernel has no branch for them


COMBINE_RULES = (
    Rule("ck.fwd_splitkv_combine.dtype", ("dtype",),
         lambda b: b["dtype"] in _combine_dtypes(),
         lambda b: f"fwd_splitkv_combine has no {b['dtype']} kernels",
         hint="combine kernels exist for fp16, bf16 and fp8", blame="dtype"),
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
    Rule("ck.fwd_splitkv_combine.group-mode-pads", ("mode", "pad_s"),
         lambda b: b["mode"] != "group" or b["pad_s"],
         "group-mode fwd_splitkv_combine kernels need seqlen padding (pad_s)",
         hint="use pad_s(1) or batch mode", blame="mode"),
    # get_combine_pipelines: fp8 combine kernels loop lse over ["f"] only
    Rule("ck.fwd_splitkv_combine.lse", ("dtype", "lse"),
         lambda b: b["lse"] in (_combine_pipes(b["dtype"]) or {}).get("lse", ()),
         lambda b: f"fwd_splitkv_combine {b['dtype']} kernels have no lse variant",
         hint="drop `lse` for this dtype", blame="lse"),
    # get_combine_pipelines: squant = (dtype == "fp8")
    Rule("ck.fwd_splitkv_combine.static-quant-iff-fp8", ("dtype", "fp8_static_quant"),
         lambda b: b["fp8_static_quant"] == (_combine_pipes(b["dtype"]) or {}).get("fp8_static_quant"),
         lambda b: (f"fwd_splitkv_combine {b['dtype']} kernels always use fp8 static quantization"
                    if b["dtype"] == "fp8" else
                    f"fwd_splitkv_combine {b['dtype']} kernels have no fp8 static quantization"),
         hint="fp8 combine kernels need `fp8_static_quant`; other dtypes must not set it",
         blame="fp8_static_quant"),
    Rule("receipt.fwd_splitkv_combine", ("receipt", "dtype", "mode"),
         _combine_receipt_ok,
         lambda b: f"{profile_text(b)} leaves out this fwd_splitkv_combine kernel",
         filter=True),
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
        supported=lambda arch: unsupported_reason("fwd_splitkv", arch, "split-KV"),
        doc="CK split-KV forward, split kernel (get_fwd_splitkv_blobs)",
    ),
    "fwd_splitkv_combine": FamilyRules(
        family="fwd_splitkv_combine",
        fields=("dtype", "hdim", "mode", "tile", "pad_s", "pad_dv", "lse", "fp8_static_quant"),
        fixed={"pipeline": "splitkv_combine", "mask": "no"},  # mask-agnostic
        rules=COMBINE_RULES,
        domain=combine_domain,
        ck_name=combine_name,
        supported=lambda arch: unsupported_reason("fwd_splitkv_combine", arch, "split-KV"),
        doc="CK split-KV forward, combine kernel (get_fwd_splitkv_combine_blobs)",
    ),
}
