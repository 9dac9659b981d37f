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
from ..data import load
from .base import FamilyRules, Rule, Tile, x

FP16_BF16 = ("fp16", "bf16")
CK_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201")


def _data() -> dict:
    return load("ck_appendkv")


@functools.lru_cache(maxsize=None)
def ck_factory(arch: str) -> str | None:
    """Upstream ``get_factory``: the first target prefix that matches wins; none -> unsupported."""
    for prefix, factory in _data()["factory_by_target_prefix"]["value"]:
        if arch.startswith(prefix):
            return factory
    return None


def dtype_group(dtype: str) -> str | None:
    # fp16/bf16 share one table; upstream tests `dtype in ["fp8", "bf8"]` for the fp8 one
    if dtype in FP16_BF16:
        return "fp16_bf16"
    if dtype in ("fp8", "bf8"):
        return "fp8"
    return None


def _tiles(dtype: str) -> dict:
    g = dtype_group(dtype)
    return _data()["tiles"].get(g, {}) if g else {}


def _pipes(dtype: str) -> dict | None:
    g = dtype_group(dtype)
    return _data()["pipelines"].get(g) if g else None


@functools.lru_cache(maxsize=None)
def _dtypes() -> tuple[str, ...]:
    # loop over FWD_DTYPE_MAP keys; dtypes without a tile table are skipped
    groups = {k for k in _data()["tiles"] if not k.startswith("_")}
    return tuple(d for d in _data()["common"]["fwd_dtype_keys"]["value"] if dtype_group(d) in groups)


@functools.lru_cache(maxsize=None)
def _hdims(dtype: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(h), int(h)) for h in _tiles(dtype))


@functools.lru_cache(maxsize=None)
def _table_tiles(dtype: str, hdim: tuple[int, int]) -> tuple[Tile, ...]:
    t = _tiles(dtype).get(str(hdim[0])) if hdim[0] == hdim[1] else None
    if not t:
        return ()
    return (Tile(tuple(t["tile"]) + (0, 0), V.WAVE_DEFAULT, V.WARP_DEFAULT, t["block_per_cu"]),)


@functools.lru_cache(maxsize=None)
def _variants(dtype: str) -> frozenset:
    """(pads, rope) pairs of get_pipelines for this dtype; pads = (s, sk, d, dv)."""
    return frozenset((tuple(v["pads"]), v["rope"]) for v in (_pipes(dtype) or {}).get("variants", ()))


def _loop(dtype: str, key: str) -> list:
    p = _pipes(dtype)
    return p["loop"][key] if p else []


def domain(field: str, b: dict):
    if field == "dtype":
        return _dtypes()
    if field == "hdim":
        return _hdims(b["dtype"])
    if field == "tile":
        return _table_tiles(b["dtype"], b["hdim"])
    if field == "vlayout":
        return V.VLAYOUTS
    if field in ("pad_s", "pad_sk", "pad_d", "pad_dv"):
        return (0, 1)
    if field == "rope":
        return V.ROPES
    return (False, True)  # paged_kv


def _pads(b: dict) -> tuple[int, int, int, int]:
    return (b["pad_s"], b["pad_sk"], b["pad_d"], b["pad_dv"])


def _variants_text(b: dict) -> str:
    return ", ".join(f"({', '.join(map(str, p))}) {r}" for p, r in sorted(_variants(b["dtype"]))) or "none"


def _receipt_ok(b: dict) -> bool:
    """get_fwd_appendkv_blobs' receipt filter (receipts it does not name keep everything)."""
    r, d = b["receipt"], b["dtype"]
    if r == -1:  # profile `all`: no receipt filter
        return True
    if r in (800, 801):  # fp32-only receipts; append-KV has no fp32 kernels
        return d == "fp32"
    if r == 2:  # Flash attention integration
        return d in FP16_BF16 and b["vlayout"] == "r"
    if r == 4:  # PyTorch integration
        return d in FP16_BF16 and b["vlayout"] == "r"
    return True  # 100, 200, 600, 700, 888 ...: no branch in the append-KV generator


def _profile_text(b: dict) -> str:
    r = b["receipt"]
    return f"profile {V.RECEIPT_TO_PROFILE.get(r, r)} (receipt {r})"


RULES = (
    Rule("ck.fwd_appendkv.dtype", ("dtype",),
         lambda b: b["dtype"] in _dtypes(),
         lambda b: f"fwd_appendkv has no {b['dtype']} kernels",
         hint="append-KV kernels exist for fp16, bf16 and fp8", blame="dtype"),
    Rule("ck.fwd_appendkv.hdim", ("dtype", "hdim"),
         lambda b: b["hdim"] in _hdims(b["dtype"]),
         lambda b: (f"fwd_appendkv has no {b['dtype']} kernels for hdim {b['hdim']}"
                    f" (head dims: {', '.join(str(h[0]) for h in _hdims(b['dtype']))})"),
         hint="pick one of the listed head dims (hdim_q = hdim_v)", blame="hdim"),
    # get_pipelines: the vlayout loop holds "row" only
    Rule("ck.fwd_appendkv.row-major-v", ("dtype", "vlayout"),
         lambda b: b["vlayout"] in _loop(b["dtype"], "vlayout"),
         "fwd_appendkv kernels only support row-major V",
         hint="use vlayout(r)", blame="vlayout"),
    # get_pipelines: the (padding, rope) variants upstream instantiates for this dtype
    Rule("ck.fwd_appendkv.pad-rope-variants", ("dtype", "pad_s", "pad_sk", "pad_d", "pad_dv", "rope"),
         lambda b: (_pads(b), b["rope"]) in _variants(b["dtype"]),
         lambda b: (f"fwd_appendkv {b['dtype']} kernels come only with (padding s, sk, d, dv) rope in "
                    f"{_variants_text(b)}"),
         hint="pick one of the listed padding / rope combinations", blame="rope"),
    # get_pipelines: fp8 loops pagedkv over ["f"] only
    Rule("ck.fwd_appendkv.paged-kv", ("dtype", "paged_kv"),
         lambda b: b["paged_kv"] in _loop(b["dtype"], "paged_kv"),
         lambda b: f"fwd_appendkv {b['dtype']} kernels have no paged-kv variant",
         hint="drop `paged_kv` for this dtype", blame="paged_kv"),
    Rule("receipt.fwd_appendkv", ("receipt", "dtype", "vlayout"),
         _receipt_ok,
         lambda b: f"{_profile_text(b)} leaves out this fwd_appendkv kernel",
         filter=True),
)


def ck_name(b: dict) -> str:
    # FmhaFwdAppendKVKernel.name + FmhaFwdAppendKVPipeline.name: only positive tokens are printed;
    # filename = name + "_" + factory arch
    t: Tile = b["tile"]
    n = f"fmha_fwd_appendkv_d{b['hdim'][0]}_{b['dtype']}_b{x(t.tile[:4])}"
    if t.block_per_cu != -1:
        n += f"_o{t.block_per_cu}"
    n += f"_v{b['vlayout']}"
    pad = "".join(tok for f, tok in (("pad_s", "s"), ("pad_sk", "sk"), ("pad_d", "d"), ("pad_dv", "dv")) if b[f])
    if pad:
        n += f"_p{pad}"
    if b["rope"] != "none":
        n += f"_{b['rope']}"
    if b["paged_kv"]:
        n += "_pagedkv"
    return f"{n}_{ck_factory(b['arch'])}"


def supported(arch: str) -> str | None:
    if arch not in CK_ARCHS:
        return f"fwd_appendkv is not supported on {arch} (CK is AMD only)"
    if ck_factory(arch) is None:
        return f"fwd_appendkv is not supported on {arch} (CK has no gfx11 append-KV kernels)"
    return None


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
