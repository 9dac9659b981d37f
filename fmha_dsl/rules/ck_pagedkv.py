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

from .. import vocab as V
from ..data import load
from .base import FamilyRules, Rule, pad_token, tf
from .ck_splitkv import CK_ARCHS, FP16_BF16, bias_token, dtype_group, mask_domain, mask_token, profile_text, \
    table_tile, tile_token


def _data() -> dict:
    return load("ck_pagedkv")


@functools.lru_cache(maxsize=None)
def ck_factory(arch: str) -> str | None:
    """Upstream ``get_factory``: the first target prefix that matches wins (gfx950 -> gfx9)."""
    for prefix, factory in _data()["factory_by_target_prefix"]["value"]:
        if arch.startswith(prefix):
            return factory
    return None


def _tiles(arch: str) -> dict:
    return _data()["tiles"].get(ck_factory(arch), {})


def _pipes(dtype: str) -> dict | None:
    g = dtype_group(dtype)
    return _data()["pipelines"].get(g) if g else None


@functools.lru_cache(maxsize=None)
def _dtypes(arch: str) -> tuple[str, ...]:
    # loop over FWD_DTYPE_MAP keys; get_hdim_tile_size_dict gives None for dtypes without a table
    groups = set(_tiles(arch))
    return tuple(d for d in _data()["common"]["fwd_dtype_keys"]["value"] if dtype_group(d) in groups)


@functools.lru_cache(maxsize=None)
def _hdims(arch: str, dtype: str) -> tuple[tuple[int, int], ...]:
    g = dtype_group(dtype)
    return tuple((int(h), int(h)) for h in _tiles(arch).get(g, {})) if g else ()


@functools.lru_cache(maxsize=None)
def _table_tiles(arch: str, dtype: str, hdim: tuple[int, int]):
    if hdim[0] != hdim[1]:
        return ()
    g = dtype_group(dtype)
    return tuple(table_tile(t) for t in _tiles(arch).get(g, {}).get(str(hdim[0]), ()))


@functools.lru_cache(maxsize=None)
def _variants(dtype: str) -> frozenset:
    """(vlayout, pads) pairs of get_pipelines for this dtype; pads = (s, sk, d, dv)."""
    return frozenset((v["vlayout"], tuple(v["pads"])) for v in (_pipes(dtype) or {}).get("variants", ()))


def _loop(dtype: str, key: str) -> list:
    p = _pipes(dtype)
    return p["loop"][key] if p else []


def domain(field: str, b: dict):
    arch = b["arch"]
    if field == "dtype":
        return _dtypes(arch)
    if field == "hdim":
        return _hdims(arch, b["dtype"])
    if field == "tile":
        return _table_tiles(arch, b["dtype"], b["hdim"])
    if field == "mode":
        return V.MODES
    if field == "vlayout":
        return V.VLAYOUTS
    if field in ("pad_s", "pad_sk", "pad_d", "pad_dv"):
        return (0, 1)
    if field == "mask":
        return mask_domain(b["mask_impl"])
    if field == "bias":
        return V.BIASES
    return (False, True)  # logits, sink, fp8_static_quant


def _pads(b: dict) -> tuple[int, int, int, int]:
    return (b["pad_s"], b["pad_sk"], b["pad_d"], b["pad_dv"])


def _variants_text(b: dict) -> str:
    return ", ".join("(" + ", ".join(map(str, p)) + ")" for _, p in sorted(_variants(b["dtype"]))) or "none"


def _receipt_ok(b: dict) -> bool:
    """get_fwd_blobs' receipt chain (receipts it does not name keep everything)."""
    r, d = b["receipt"], b["dtype"]
    if r == -1:  # profile `all`: no receipt filter
        return True
    if r in (800, 801):  # fp32-only receipts; paged-KV prefill has no fp32 kernels
        return d == "fp32"
    row, squant = b["vlayout"] == "r", b["fp8_static_quant"]
    if r in (2, 3):  # Flash attention integration
        return (d in FP16_BF16 and row and b["bias"] in ("no", "alibi") and not squant and not b["skip"]
                and not b["sink"])
    if r == 4:  # PyTorch integration
        return (d in FP16_BF16 and row and b["bias"] in ("no", "bias") and not squant and not b["skip"]
                and not b["sink"])
    if r == 100:  # aiter mha_fwd
        return d in FP16_BF16 and b["mode"] == "batch" and row and not squant
    if r == 200:  # aiter mha_varlen_fwd
        return d in FP16_BF16 and b["mode"] == "group" and row and not squant
    if r == 600:  # aiter::mha_fwd C++ api
        return d in FP16_BF16 and row and not squant
    if r == 700:  # TE does not use this API
        return False
    return True


RULES = (
    Rule("ck.fwd_pagedkv.dtype", ("dtype", "arch"),
         lambda b: b["dtype"] in _dtypes(b["arch"]),
         lambda b: f"fwd_pagedkv has no {b['dtype']} kernels on {b['arch']}",
         hint="paged-KV prefill kernels exist for fp16/bf16 (and fp8 on gfx9 / gfx12)", blame="dtype"),
    Rule("ck.fwd_pagedkv.hdim", ("dtype", "hdim", "arch"),
         lambda b: b["hdim"] in _hdims(b["arch"], b["dtype"]),
         lambda b: (f"fwd_pagedkv has no {b['dtype']} kernels for hdim {b['hdim']} on {b['arch']}"
                    f" (head dims: {', '.join(str(h[0]) for h in _hdims(b['arch'], b['dtype']))})"),
         hint="pick one of the listed head dims (hdim_q = hdim_v)", blame="hdim"),
    # get_pipelines: every paged-KV pipeline has row-major V
    Rule("ck.fwd_pagedkv.row-major-v", ("vlayout",),
         lambda b: b["vlayout"] == "r",
         "fwd_pagedkv kernels only support row-major V",
         hint="use vlayout(r)", blame="vlayout"),
    # get_pipelines: the padding variants upstream instantiates for this dtype
    Rule("ck.fwd_pagedkv.pad-variants", ("dtype", "vlayout", "pad_s", "pad_sk", "pad_d", "pad_dv"),
         lambda b: (b["vlayout"], _pads(b)) in _variants(b["dtype"]),
         lambda b: (f"fwd_pagedkv {b['dtype']} kernels come only with padding (s, sk, d, dv) in "
                    f"{_variants_text(b)}"),
         hint="pick one of the listed padding combinations", blame="pad_s"),
    # get_fwd_blobs: "in group mode, spad/skpad must be true"
    Rule("ck.fwd_pagedkv.group-mode-pads", ("mode", "pad_s", "pad_sk"),
         lambda b: b["mode"] != "group" or (b["pad_s"] and b["pad_sk"]),
         "group-mode fwd_pagedkv kernels need seqlen padding (pad_s and pad_sk)",
         hint="use padding(1, 1, ...) or batch mode", blame="mode"),
    # get_fwd_blobs: hdim 192 with bn1 128 (deepseek) has no bias / lse kernels (no such tile is enabled today)
    Rule("ck.fwd_pagedkv.d192-v128-no-bias-lse", ("hdim", "tile", "bias", "lse"),
         lambda b: not (b["hdim"][0] == 192 and b["tile"].tile[3] == 128) or (b["bias"] == "no" and not b["lse"]),
         "hdim (192, 128) has no fwd_pagedkv kernels with bias or lse",
         hint="use bias(no)", blame="bias"),
    # get_fwd_blobs: "logits_soft_cap is only allowed if no bias"
    Rule("ck.fwd_pagedkv.logits-without-bias", ("bias", "logits"),
         lambda b: not b["logits"] or b["bias"] == "no",
         "logits soft-cap cannot be combined with bias in fwd_pagedkv kernels",
         hint="drop `logits` or use bias(no)", blame="logits"),
    # get_pipelines: fp8 loops sink over ["f"] only
    Rule("ck.fwd_pagedkv.sink", ("dtype", "sink"),
         lambda b: b["sink"] in _loop(b["dtype"], "sink"),
         lambda b: f"fwd_pagedkv {b['dtype']} kernels have no sink variant",
         hint="drop `sink` for this dtype", blame="sink"),
    # get_pipelines: squant = (dtype == "fp8")
    Rule("ck.fwd_pagedkv.static-quant-iff-fp8", ("dtype", "fp8_static_quant"),
         lambda b: b["fp8_static_quant"] == (_pipes(b["dtype"]) or {}).get("fp8_static_quant"),
         lambda b: (f"fwd_pagedkv {b['dtype']} kernels always use fp8 static quantization" if b["dtype"] == "fp8"
                    else f"fwd_pagedkv {b['dtype']} kernels have no fp8 static quantization"),
         hint="fp8 paged-KV kernels need `fp8_static_quant`; other dtypes must not set it",
         blame="fp8_static_quant"),
    Rule("receipt.fwd_pagedkv",
         ("receipt", "dtype", "mode", "vlayout", "bias", "skip", "sink", "fp8_static_quant"),
         _receipt_ok,
         lambda b: f"{profile_text(b)} leaves out this fwd_pagedkv kernel",
         filter=True),
)


def ck_name(b: dict) -> str:
    # FmhaFwdKernel.name + FmhaFwdPipeline.name in fmha_pagedkv_prefill.py; suffix "_" + factory
    pad = pad_token(b, (("pad_s", "s"), ("pad_sk", "sk"), ("pad_d", "d"), ("pad_dv", "dv")))
    return (f"fmha_fwd_pagedkv_d{b['hdim'][0]}_{b['dtype']}_{b['mode']}_{tile_token(b['tile'])}_{b['pipeline']}"
            f"_v{b['vlayout']}_{pad}_{tf(b['logits'], 'logits')}_{bias_token(b['bias'])}_{mask_token(b)}"
            f"_{tf(b['lse'], 'lse')}_{tf(b['skip'], 'skip')}_{tf(b['fp8_static_quant'], 'squant')}"
            f"_{tf(b['paged_kv'], 'pagedkv')}_{tf(b['sink'], 'sink')}_{ck_factory(b['arch'])}")


def supported(arch: str) -> str | None:
    if arch not in CK_ARCHS:
        return f"fwd_pagedkv is not supported on {arch} (CK is AMD only)"
    if ck_factory(arch) is None:
        return f"fwd_pagedkv is not supported on {arch} (CK has no paged-KV prefill kernels for it)"
    return None


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
