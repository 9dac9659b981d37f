"""CK paged-KV prefill forward (``fwd_pagedkv``; upstream ``--api pagedkv_prefill``).

Derived from upstream's ``codegen/ops/fmha_pagedkv_prefill.py`` (ROCm/rocm-libraries @16f85ebe), ``get_fwd_blobs``.
Tables live in ``fmha_dsl/data/ck_pagedkv.json`` (each with its ``_source``).

Upstream facts the rules restate:

* ``get_factory`` by target prefix: gfx9* -> gfx9 (gfx950 included: no gfx950 factory, suffix ``_gfx9``),
  gfx11* -> gfx11, gfx12* -> gfx12;
* one pipeline, ``qr_pagedkv``, always with paged KV, without LSE and without skip-min-seqlen-q (so
  ``paged_kv`` is fixed to True, ``lse`` / ``skip`` to False);
* fp16/bf16 kernels (hdim 128 only) loop sink {yes, no}; fp8 kernels have no sink and always use static
  quantisation (gfx9 / gfx12 only).

Tiles are fwd-style (``FmhaFwdTileSize``): 6-element wave/warp padded with CK's (1,1,1) / (16,16,16).
"""

from __future__ import annotations

import functools

from .base import FamilyRules, Rule
from .ck_shared import PrefixTables, dtype_rule, fwd_domain, fwd_kernel_name, group_mode_pads, \
    half_row_unquantized, hdim_rule, logits_without_bias, loop_rule, pad_variants, receipt_chain, receipt_rule, \
    row_major_v, static_quant_iff_fp8

TABLES = PrefixTables("ck_pagedkv")
ck_factory = TABLES.factory  # upstream get_factory: the first target prefix that matches wins (gfx950 -> gfx9)


@functools.lru_cache(maxsize=None)
def _variants(dtype: str) -> frozenset:
    """(vlayout, pads) pairs of get_pipelines for this dtype; pads = (s, sk, d, dv)."""
    return frozenset((v["vlayout"], tuple(v["pads"])) for v in (TABLES.pipes(dtype) or {}).get("variants", ()))


def domain(field: str, b: dict):
    # dtype: loop over FWD_DTYPE_MAP keys; get_hdim_tile_size_dict gives None for dtypes without a table
    return fwd_domain(field, b, TABLES.dtypes, TABLES.hdims, TABLES.tiles)  # + logits, sink, fp8_static_quant


def _integration(biases: tuple[str, ...]):
    return lambda b: half_row_unquantized(b) and b["bias"] in biases and not b["skip"] and not b["sink"]


# get_fwd_blobs' receipt chain (receipts it does not name keep everything)
_receipt_ok = receipt_chain({
    2: _integration(("no", "alibi")),  # Flash attention integration
    3: _integration(("no", "alibi")),
    4: _integration(("no", "bias")),  # PyTorch integration
    100: lambda b: half_row_unquantized(b) and b["mode"] == "batch",  # aiter mha_fwd
    200: lambda b: half_row_unquantized(b) and b["mode"] == "group",  # aiter mha_varlen_fwd
    600: half_row_unquantized,  # aiter::mha_fwd C++ api
})


RULES = (
    dtype_rule("fwd_pagedkv", TABLES.dtypes,
               "paged-KV prefill kernels exist for fp16/bf16 (and fp8 on gfx9 / gfx12)"),
    hdim_rule("fwd_pagedkv", TABLES.hdims),
    # get_pipelines: every paged-KV pipeline has row-major V
    row_major_v("fwd_pagedkv"),
    # get_pipelines: the padding variants upstream instantiates for this dtype
    pad_variants("fwd_pagedkv", lambda b: _variants(b["dtype"]), with_pipeline=False),
    # get_fwd_blobs: "in group mode, spad/skpad must be true"
    group_mode_pads("fwd_pagedkv"),
    # get_fwd_blobs: hdim 192 with bn1 128 (deepseek) has no bias / lse kernels (no such tile is enabled today)
    Rule("ck.fwd_pagedkv.d192-v128-no-bias-lse", ("hdim", "tile", "bias", "lse"),
         lambda b: not (b["hdim"][0] == 192 and b["tile"].tile[3] == 128) or (b["bias"] == "no" and not b["lse"]),
         "hdim (192, 128) has no fwd_pagedkv kernels with bias or lse",
         hint="use bias(no)", blame="bias"),
    # get_fwd_blobs: "logits_soft_cap is only allowed if no bias"
    logits_without_bias("fwd_pagedkv"),
    # get_pipelines: fp8 loops sink over ["f"] only
    loop_rule("fwd_pagedkv", "sink", TABLES.loop),
    # get_pipelines: squant = (dtype == "fp8")
    static_quant_iff_fp8("fwd_pagedkv", TABLES.pipes, "paged-KV"),
    receipt_rule("fwd_pagedkv", ("receipt", "dtype", "mode", "vlayout", "bias", "skip", "sink", "fp8_static_quant"),
                 _receipt_ok),
)


def ck_name(b: dict) -> str:
    # FmhaFwdKernel.name + FmhaFwdPipeline.name in fmha_pagedkv_prefill.py; suffix "_" + factory
    return fwd_kernel_name("fwd_pagedkv", b, (("lse", "lse"), ("skip", "skip"), ("fp8_static_quant", "squant"),
                                              ("paged_kv", "pagedkv"), ("sink", "sink")),
                           f"_{ck_factory(b['arch'])}")


def supported(arch: str) -> str | None:
    return TABLES.unsupported("fwd_pagedkv", arch, "CK has no paged-KV prefill kernels for it")


FAMILIES = {
    "fwd_pagedkv": FamilyRules(
        family="fwd_pagedkv",
        fields=("dtype", "hdim", "mode", "vlayout", "tile", "pad_s", "pad_sk", "pad_d", "pad_dv",
                "mask", "bias", "logits", "sink", "fp8_static_quant"),
        # one pipeline, always paged, never lse / skip (lse / skip equal CK's defaults; listed as rules read them)
        fixed={"pipeline": "qr_pagedkv", "paged_kv": True, "lse": False, "skip": False},
        rules=RULES,
        domain=domain,
        ck_name=ck_name,
        supported=supported,
        doc="CK paged-KV prefill forward (get_fwd_blobs in fmha_pagedkv_prefill.py)",
    ),
}
