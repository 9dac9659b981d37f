"""CK batch prefill (``--api batch_prefill``): paged-KV prefill kernels for vLLM / SGLang caches.

Upstream: ROCm/rocm-libraries @0fcb74e2,
``projects/composablekernel/example/ck_tile/01_fmha/codegen/ops/fmha_batch_prefill.py``
(``get_fwd_blobs``, ``KernelComponentFactory``, ``CustomFactory``, the ``name`` properties).
Data: ``fmha_dsl/data/ck_batch_prefill.json``.

One factory serves every gfx9 target (gfx90a, gfx942, gfx950 list the same kernels, without an arch
suffix); any non-gfx9 target makes upstream emit nothing.  Kernels are group mode, row-major V,
pipeline ``qr_async`` with every dim padded; each kept kernel may get a ``64bit_`` twin (``kv64``).
"""

from __future__ import annotations

import functools

from .. import data
from .base import FACTORY, FamilyRules, Rule, pad_token, tf, x
from .ck_shared import PAD_TOKENS, bias_token, mask_domain, mask_token, no_logits_with_bias, table_tile, tile_token

FAMILY = "batch_prefill"


# ---------------------------------------------------------------- data (loaded on first use)

def _d() -> dict:
    return data.load("ck_batch_prefill")


@functools.lru_cache(maxsize=None)
def _tiles(factory: str) -> dict:
    """{dtype: {(hdim_q, hdim_v): (Tile, ...)}} of a factory; {} where upstream emits nothing."""
    table = _d()["factory_tables"].get(factory)
    if table is None:
        return {}
    out = {}
    for dtype, per_hdim in _d()["tiles"][table].items():
        by_hdim = {}
        for rows in per_hdim.values():
            for r in rows:
                # wave/warp: 6 printed numbers, padded with CK's defaults for the unused third gemm
                t = table_tile(r)
                by_hdim.setdefault((t.tile[5], t.tile[3]), []).append(t)   # (bk0max, bn1) = (hdim_q, hdim_v)
        out[dtype] = {h: tuple(ts) for h, ts in by_hdim.items()}
    return out


@functools.lru_cache(maxsize=None)
def _variants(dtype: str) -> dict:
    return {k: tuple(v) for k, v in _d()["variants"].get(dtype, {}).items()}


@functools.lru_cache(maxsize=None)
def _receipt_filter(receipt: int) -> dict | None:
    for key, spec in _d()["receipts"].items():
        if not key.startswith("_") and (receipt == int(key) or receipt in spec.get("also", ())):
            return {f: frozenset(v) for f, v in spec.items() if f != "also"}
    return None


# ---------------------------------------------------------------- domains

_BOOLS = (False, True)


def domain(field: str, b: dict):
    if field == "dtype":
        return tuple(_tiles(b["factory"]))
    if field == "hdim":
        return tuple(_tiles(b["factory"]).get(b["dtype"], {}))
    if field == "tile":
        return _tiles(b["factory"]).get(b["dtype"], {}).get(b["hdim"], ())
    if field == "mask":
        return mask_domain(b["mask_impl"])
    if field == "bias":
        return ("no", "bias", "alibi")
    if field == "qscale":
        return ("no", "pertensor", "kv_blockscale")
    if field == "kv_layout":
        return tuple(_d()["kv_layouts"]["value"])
    if field == "kv_lookup":
        return tuple(_d()["kv_lookups"]["value"])
    if field == "page_size":
        return tuple(_d()["page_sizes"]["value"])
    return _BOOLS   # logits, lse, dropout, sink, kv64


# ---------------------------------------------------------------- rule predicates

def has_tiles(b):
    # get_fwd_blobs: dtypes whose get_hdim_tile_size_dict is None are skipped
    return b["dtype"] in _tiles(b["factory"])


def hdim_has_tiles(b):
    # get_hdim_tile_size_dict: only the listed head dims (128, 256) have tiles
    return b["hdim"] in _tiles(b["factory"]).get(b["dtype"], {})


def tile_matches_hdim(b):
    # tiles are keyed by hdim: bk0max = hdim_q, bn1 = hdim_v
    t = b["tile"].tile
    return len(t) == 6 and (t[5], t[3]) == tuple(b["hdim"])


def variant_allowed(field):
    # get_pipelines: the per-dtype product (fp8bf16: no bias/lse/dropout/sink, qscale pertensor|kv_blockscale)
    def check(b):
        allowed = _variants(b["dtype"]).get(field)
        return allowed is None or b[field] in allowed
    return check


def d192_v128_inference_only(b):
    # get_fwd_blobs: hdim 192 with bn1 128 -> no bias, lse or dropout (no such tile today)
    if b["hdim"][0] == 192 and b["tile"].tile[3] == 128:
        return b["bias"] == "no" and not b["lse"] and not b["dropout"]
    return True


def page_size_supported(b):
    # get_fwd_blobs: page loop over SUPPORTED_PAGE_SIZE
    return b["page_size"] in _d()["page_sizes"]["value"]


def page1_linear_only(b):
    # get_fwd_blobs page loop: page_size 1 only with the linear KV layout
    return b["page_size"] != 1 or b["kv_layout"] == "linear"


def kv_blockscale_page_ge_bn0(b):
    # get_fwd_blobs page loop: kv_blockscale needs page_size >= bn0
    return b["qscale"] != "kv_blockscale" or b["page_size"] >= b["tile"].tile[1]


def kv64_needs_small_page(b):
    # get_fwd_blobs: the kUse64BitLoad twin is emitted only when page_size < bn0
    return not b["kv64"] or b["page_size"] < b["tile"].tile[1]


def receipt_ok(b):
    # get_fwd_blobs receipt block (2/3, 4, 100, 200, 600, 800/801); other receipts: no filter
    if b["receipt"] < 0:
        return True
    f = _receipt_filter(b["receipt"])
    return f is None or all(b[k] in allowed for k, allowed in f.items())


def _variant_rule(field: str) -> Rule:
    def message(b):
        v = b[field]
        what = field if isinstance(v, bool) else f"{field} {v!r}"
        return f"batch_prefill {b['dtype']} kernels have no {what}"
    return Rule(f"ck.{FAMILY}.{field}-by-dtype", ("dtype", field), variant_allowed(field), message,
                hint="fp16/bf16 take qscale no; fp8bf16 takes qscale pertensor or kv_blockscale and has no "
                     "bias, lse, dropout or sink", blame=field)


RULES = (
    Rule(f"ck.{FAMILY}.dtype-has-tiles", ("factory", "dtype"), has_tiles,
         "batch_prefill has no {dtype} kernels", hint="use fp16, bf16 or fp8bf16", blame="dtype"),
    Rule(f"ck.{FAMILY}.hdim-has-tiles", ("factory", "dtype", "hdim"), hdim_has_tiles,
         "batch_prefill has no {dtype} kernels for hdim {hdim}", hint="use hdim 128 or 256", blame="hdim"),
    Rule(f"ck.{FAMILY}.tile-matches-hdim", ("hdim", "tile"), tile_matches_hdim,
         lambda b: f"tile {x(b['tile'].tile)} does not fit hdim {b['hdim']} (needs bk0max = hdim_q, bn1 = hdim_v)",
         hint="use a 6-value tile whose bn1 is hdim_v and bk0max is hdim_q", blame="tile"),
    _variant_rule("bias"),
    _variant_rule("logits"),
    _variant_rule("lse"),
    _variant_rule("dropout"),
    Rule(f"ck.{FAMILY}.d192-v128-inference-only", ("hdim", "tile", "bias", "lse", "dropout"),
         d192_v128_inference_only, "hdim (192, 128) batch_prefill kernels have no bias, lse or dropout",
         hint="drop bias/lse/dropout", blame="hdim"),
    # get_fwd_blobs: logits soft-cap only with bias == no
    Rule(f"ck.{FAMILY}.logits-needs-no-bias", ("logits", "bias"), no_logits_with_bias,
         "logits soft-cap is only available without bias", hint="set bias(no) or drop logits", blame="logits"),
    _variant_rule("qscale"),
    _variant_rule("sink"),
    Rule(f"ck.{FAMILY}.page-size-supported", ("page_size",), page_size_supported,
         "batch_prefill has no kernels for page size {page_size}", hint="use page size 1, 16 or 1024",
         blame="page_size"),
    Rule(f"ck.{FAMILY}.page1-needs-linear", ("kv_layout", "page_size"), page1_linear_only,
         "page size 1 needs the linear kv layout", hint="use kv_cache(linear, ...) or a larger page size",
         blame="page_size"),
    Rule(f"ck.{FAMILY}.kv-blockscale-page-ge-bn0", ("tile", "qscale", "page_size"), kv_blockscale_page_ge_bn0,
         lambda b: f"kv_blockscale needs a page size of at least the tile's bn0 ({b['tile'].tile[1]})",
         hint="use page size 1024 with kv_blockscale", blame="page_size"),
    Rule(f"ck.{FAMILY}.kv64-needs-small-page", ("tile", "page_size", "kv64"), kv64_needs_small_page,
         lambda b: f"64-bit kv addressing exists only for page sizes below the tile's bn0 ({b['tile'].tile[1]})",
         hint="drop kv64 or use a smaller page size", blame="kv64"),
    Rule(f"receipt.{FAMILY}", ("receipt", "dtype", "mode", "vlayout", "bias", "qscale"), receipt_ok,
         "receipt {receipt} has no such batch_prefill kernel", filter=True),
)


# ---------------------------------------------------------------- names

def ck_name(b: dict) -> str:
    # FmhaFwdKernel.name + FmhaFwdPipeline.name (no arch suffix: arch-agnostic translation units);
    # FmhaFwdTileSize.name: 6-value tile, two wave and two warp triples, _o only when set;
    # mask: simplified -> mask/nmask; generic -> nmask, mc (causal), mg (generic)
    parts = [
        f"fmha_batch_prefill_d{b['hdim'][0]}_{b['dtype']}_{b['mode']}_ps{b['page_size']}",
        ("64bit_" if b["kv64"] else "") + tile_token(b["tile"]),
        b["pipeline"], "v" + b["vlayout"], pad_token(b, PAD_TOKENS),
        tf(b["logits"], "logits"),
        bias_token(b["bias"]),
        mask_token(b),
        tf(b["lse"], "lse"), tf(b["dropout"], "dropout"),
        b["qscale"] if b["qscale"] != "no" else "nqscale",
        tf(b["sink"], "sink"),
        b["kv_layout"], b["kv_lookup"],
    ]
    return "_".join(parts)


def supported(arch: str) -> str | None:
    factory = FACTORY.get(arch)
    if factory in ("sm80", "sm90"):
        return f"{FAMILY} is not supported on {arch} (CK is AMD only)"
    if factory not in ("gfx9", "gfx950"):
        # get_fwd_blobs: any target not starting with gfx9 -> no kernels
        return f"{FAMILY} is not supported on {arch} (CK emits batch-prefill kernels for gfx9 targets only)"
    return None


FAMILIES = {
    FAMILY: FamilyRules(
        family=FAMILY,
        fields=("dtype", "hdim", "tile", "mask", "bias", "logits", "lse", "dropout", "qscale", "sink",
                "kv_layout", "kv_lookup", "page_size", "kv64"),
        rules=RULES,
        domain=domain,
        ck_name=ck_name,
        # get_fwd_blobs keeps group mode only; get_pipelines: qr_async, row-major V, every dim padded
        fixed={"mode": "group", "vlayout": "r", "pipeline": "qr_async", "paged_kv": True,
               "pad_s": 1, "pad_sk": 1, "pad_d": 1, "pad_dv": 1},
        supported=supported,
        doc="CK batch prefill: group-mode paged-KV prefill (vLLM/SGLang page tables), gfx9 only",
    ),
}
