"""CK append-KV forward (``fwd_appendkv``): appends new K/V (optionally with RoPE) to the KV cache.

Derived from upstream's ``codegen/ops/fmha_fwd_appendkv.py`` (ROCm/composable_kernel @01acc6fd),
``get_fwd_appendkv_blobs``.  Tables live in ``fmha_dsl/data/ck_appendkv.json`` (each with its ``_source``).

Upstream facts the rules restate:

* ``get_factory``: gfx9* -> gfx9 (gfx950 included, suffix ``_gfx9``), gfx12* -> gfx12; any other target raises
  "Unsupported device target" (no gfx11 kernels).  Both factories use the base-class tables;
* no batch/group loop (the name has no mode token; ``mode`` keeps CK's default ``batch``);
* fp16/bf16: row-major V x paged-KV {yes, no} x 6 (padding, rope) variants; fp8: one fully padded variant,
  no rope, no paged KV.

Tile encoding: upstream's tile is ``(bs, bsk, bd, bdv)``; the Tile is ``tile=(bs, bsk, bd, bdv, 0, 0)``
(the kernel has no k1 / k0max), wave/warp = CK's FmhaAlgorithm defaults (the kernel has no wave/warp
parameters), ``block_per_cu`` = upstream's occupancy.
"""

from __future__ import annotations

import functools

from .. import vocab as V
from .base import FamilyRules, Rule, Tile, pad_token, x
from .ck_shared import FP16_BF16, PAD_TOKENS, PrefixTables, dtype_rule, fwd_domain, group_table, hdim_rule, \
    loop_rule, pads, receipt_chain, receipt_rule, row_major_v, table_dtypes, table_hdims

DATA = "ck_appendkv"
TABLES = PrefixTables(DATA)
ck_factory = TABLES.factory  # upstream get_factory: the first target prefix that matches wins; none -> unsupported


def _dtypes(b: dict) -> tuple[str, ...]:
    # loop over FWD_DTYPE_MAP keys; dtypes without a tile table are skipped
    return table_dtypes(DATA, "tiles")


def _hdims(b: dict) -> tuple[tuple[int, int], ...]:
    # fp16/bf16 share one table; upstream tests `dtype in ["fp8", "bf8"]` for the fp8 one
    return table_hdims(DATA, "tiles", b["dtype"])


@functools.lru_cache(maxsize=None)
def _table_tiles(dtype: str, hdim: tuple[int, int]) -> tuple[Tile, ...]:
    t = group_table(DATA, "tiles", dtype, {}).get(str(hdim[0])) if hdim[0] == hdim[1] else None
    if not t:
        return ()
    return (Tile(tuple(t["tile"]) + (0, 0), V.WAVE_DEFAULT, V.WARP_DEFAULT, t["block_per_cu"]),)


@functools.lru_cache(maxsize=None)
def _variants(dtype: str) -> frozenset:
    """(pads, rope) pairs of get_pipelines for this dtype; pads = (s, sk, d, dv)."""
    return frozenset((tuple(v["pads"]), v["rope"]) for v in (TABLES.pipes(dtype) or {}).get("variants", ()))


def domain(field: str, b: dict):
    return fwd_domain(field, b, _dtypes, _hdims, lambda b: _table_tiles(b["dtype"], b["hdim"]))  # + paged_kv


def _variants_text(b: dict) -> str:
    return ", ".join(f"({', '.join(map(str, p))}) {r}" for p, r in sorted(_variants(b["dtype"]))) or "none"


def _half_row(b: dict) -> bool:
    return b["dtype"] in FP16_BF16 and b["vlayout"] == "r"


# get_fwd_appendkv_blobs' receipt filter (receipts it does not name keep everything);
# 100, 200, 600, 700, 888 ...: no branch in the append-KV generator
_receipt_ok = receipt_chain({
    2: _half_row,  # Flash attention integration
    4: _half_row,  # PyTorch integration
})


RULES = (
    dtype_rule("fwd_appendkv", _dtypes, "append-KV kernels exist for fp16, bf16 and fp8", on_arch=False),
    hdim_rule("fwd_appendkv", _hdims, on_arch=False),
    # get_pipelines: the vlayout loop holds "row" only
    row_major_v("fwd_appendkv", lambda b: b["vlayout"] in TABLES.loop(b["dtype"], "vlayout"), ("dtype", "vlayout")),
    # get_pipelines: the (padding, rope) variants upstream instantiates for this dtype
    Rule("ck.fwd_appendkv.pad-rope-variants", ("dtype", "pad_s", "pad_sk", "pad_d", "pad_dv", "rope"),
         lambda b: (pads(b), b["rope"]) in _variants(b["dtype"]),
         lambda b: (f"fwd_appendkv {b['dtype']} kernels come only with (padding s, sk, d, dv) rope in "
                    f"{_variants_text(b)}"),
         hint="pick one of the listed padding / rope combinations", blame="rope"),
    # get_pipelines: fp8 loops pagedkv over ["f"] only
    loop_rule("fwd_appendkv", "paged_kv", TABLES.loop),
    receipt_rule("fwd_appendkv", ("receipt", "dtype", "vlayout"), _receipt_ok),
)


def ck_name(b: dict) -> str:
    # FmhaFwdAppendKVKernel.name + FmhaFwdAppendKVPipeline.name: only positive tokens are printed;
    # filename = name + "_" + factory arch
    t: Tile = b["tile"]
    n = f"fmha_fwd_appendkv_d{b['hdim'][0]}_{b['dtype']}_b{x(t.tile[:4])}"
    if t.block_per_cu != -1:
        n += f"_o{t.block_per_cu}"
    n += f"_v{b['vlayout']}"
    pad = pad_token(b, PAD_TOKENS)
    if pad != "npad":
        n += f"_{pad}"
    if b["rope"] != "none":
        n += f"_{b['rope']}"
    if b["paged_kv"]:
        n += "_pagedkv"
    return f"{n}_{ck_factory(b['arch'])}"


def supported(arch: str) -> str | None:
    return TABLES.unsupported("fwd_appendkv", arch, "CK has no gfx11 append-KV kernels")


FAMILIES = {
    "fwd_appendkv": FamilyRules(
        family="fwd_appendkv",
        fields=("dtype", "hdim", "vlayout", "tile", "pad_s", "pad_sk", "pad_d", "pad_dv", "rope", "paged_kv"),
        fixed={"pipeline": "appendkv"},
        rules=RULES,
        domain=domain,
        ck_name=ck_name,
        supported=supported,
        doc="CK append-KV forward (get_fwd_appendkv_blobs)",
    ),
}
