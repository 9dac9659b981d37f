"""[ck_fwd] Arch rules of CK's forward kernels (``--api fwd``, FmhaFwdKernel).

Ported from the verified enumerator in research/fwd (derived from upstream
``ROCm/rocm-libraries projects/composablekernel/example/ck_tile/01_fmha/codegen/ops/fmha_fwd.py``
@014d097d; data with sources in ``fmha_dsl/data/ck_fwd.json``).

Upstream's loop: for each dtype of the arch's factory, each (hdim_q, hdim_v) of its tile table, each
mode, every (tile, pipeline) of ``tiles x get_pipelines(...)`` is kept when the factory's compatibility
rules and the receipt's ``get_product`` accept it.  ``get_pipelines`` is the product of a few feature
axes (logits, mask, bias, lse, dropout, skip, sink, qscale) whose rows (pipeline tag, vlayout, pads,
trload) depend on hdim, receipt and bias.  Here each of those conditions is one :class:`Rule`.

The tables these rules read (what upstream lists per factory, dtype and head dim): :mod:`.ck_fwd_table`.

Factories: gfx90a/gfx942 -> gfx9, gfx950 -> gfx950, gfx1100 -> gfx11, gfx1201 -> gfx12
(gfx115 and gfx125 are not modelled).
"""

from __future__ import annotations

from .base import ARCH_SUFFIX, FACTORY, FamilyRules, Rule, Tile, pad_token, tf
from .ck_fwd_table import (PADS, _data, _emitting_dtypes, _fac, _hdim_tables, _mask_key, _mask_keys, _pad_name,
                           _pads, _pipelines, _row_ok, _rows, _set_of, _vlayouts, _when)
from .ck_shared import bias_token, no_logits_with_bias, tile_token

FAMILY = "fwd"
FEATURES = ("mask", "bias", "logits", "lse", "dropout", "skip", "sink", "qscale")
_BOOL = (False, True)
_PAD = (0, 1)
_ENUMS = {
    "mode": ("batch", "group"),
    "vlayout": ("r", "c"),
    "bias": ("no", "bias", "alibi"),
    "qscale": ("no", "pertensor", "blockscale", "kv_blockscale", "mx", "perhead", "per_token_head"),
}


# ----------------------------------------------------------------------------- domains
def domain(field: str, b: dict):
    fac, dtype = b["factory"], b.get("dtype")
    if field == "dtype":
        return _emitting_dtypes(fac)
    if field == "hdim":
        return tuple(_hdim_tables(fac, dtype))
    if field == "pipeline":
        return _pipelines(fac, dtype)
    if field == "tile":
        return _hdim_tables(fac, dtype).get(tuple(b["hdim"]), ())
    if field == "mask":   # one kernel per upstream key: its first served value (simplified `mask` -> top_left)
        info = _data()["mask"]["keys"]
        return tuple(info[k]["serves"][0] for k in _mask_keys(b))
    if field in PADS:
        return _PAD
    if field in _ENUMS:
        return _ENUMS[field]
    return _BOOL          # logits lse dropout skip sink trload


# ----------------------------------------------------------------------------- rule helpers
def _in_factory(name: str):
    """A predicate: the factory-specific check applies only on factories whose data lists it."""
    def applies(b):
        fac = _fac(b["factory"])
        return fac is not None and name in fac["rules"]
    return applies


def _hd(b) -> str:
    return f"({b['hdim'][0]}, {b['hdim'][1]})"


def _show(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _bias_word(b) -> str:
    return {"no": "no bias", "bias": "elementwise bias"}.get(b["bias"], b["bias"] + " bias")


# --- dtype / hdim / layout (supported_dtypes, get_hdim_tile_size_dict)
def check_dtype(b):
    # get_fwd_blobs: factory.supported_dtypes() with a tile table and a get_pipelines branch
    return b["dtype"] in _emitting_dtypes(b["factory"])


def msg_dtype(b):
    fac = _fac(b["factory"]) or {}
    if b["dtype"] in fac.get("listed_dtypes", ()):
        return f"ck lists {b['dtype']} for fwd on {b['arch']} but get_pipelines emits no {b['dtype']} pipeline"
    return f"fwd has no {b['dtype']} kernels on {b['arch']}"


def check_hdim_table(b):
    # get_hdim_tile_size_dict(dtype): the (hdim_q, hdim_v) keys
    return tuple(b["hdim"]) in _hdim_tables(b["factory"], b["dtype"])


def msg_hdim(b):
    have = ", ".join(f"({q}, {v})" for q, v in _hdim_tables(b["factory"], b["dtype"]))
    return f"{b['dtype']} fwd has no kernels for hdim {_hd(b)} on {b['arch']} (available: {have})"


def check_vlayout(b):
    # get_pipelines rows: "row" everywhere except the mxfp8/mxfp4 branch ("col")
    return b["vlayout"] in _vlayouts(b["factory"], b["dtype"])


# --- get_pipelines rows
def _row_check(pads: bool, bias: bool):
    """A predicate: some get_pipelines row of this tag and vlayout holds (and has these pads / fits the bias)."""
    def check(b):
        return _row_ok(b, pads, bias)
    return check


def _padding_message(bias: bool):
    """The padding rows listed for this tag (whose guards hold, with the bias guard when ``bias``)."""
    def message(b):
        ok = sorted({_pad_name(r["pads"]) for r in _rows(b) if _when(r["when"], b, bias)})
        with_bias = f" with {_bias_word(b)}" if bias else ""
        return (f"{b['pipeline']} {b['dtype']} kernels for hdim {_hd(b)}{with_bias} have no padding "
                f"{_pad_name(_pads(b))} (available: {', '.join(ok) or 'none'})")
    return message


# get_pipelines(dtype, hdim, hdim_v, receipt): some row with this tag whose hdim/receipt guard holds
check_pipeline = _row_check(pads=False, bias=False)


def msg_pipeline(b):
    ok = [p for p in _pipelines(b["factory"], b["dtype"]) if _row_ok(dict(b, pipeline=p), False, False)]
    return (f"{b['dtype']} fwd kernels for hdim {_hd(b)} on {b['arch']} have no {b['pipeline']} pipeline "
            f"(vlayout {b['vlayout']}; available: {', '.join(ok) or 'none'})")


# get_pipelines: the (spad, skpad, dpad, dvpad) of the rows listed for this tag
check_padding = _row_check(pads=True, bias=False)
msg_padding = _padding_message(bias=False)

# KernelComponentFactoryGfx9.get_pipelines fp16/bf16, hdim != 256: `if bias == "bias"` -> qr ffff/tttt,
# else qr_async tftt/tttt (+ qr tttt when receipt == 1): the pipeline tag depends on the bias
check_bias_pipeline = _row_check(pads=False, bias=True)


def msg_bias_pipeline(b):
    return (f"{b['dtype']} {b['pipeline']} kernels for hdim {_hd(b)} on {b['arch']} are not generated with "
            f"{_bias_word(b)} (ck uses qr for elementwise bias and qr_async otherwise, rocm 6.2 workaround)")


# same branch: the padding rows also depend on the bias (qr ffff only with elementwise bias)
check_bias_padding = _row_check(pads=True, bias=True)
msg_bias_padding = _padding_message(bias=True)


def check_trload(b):
    # FmhaFwdPipeline(..., F_trload): "t" exactly on the qr_async_trload / qr_async_trload_v3 rows
    return any(r["trload"] == b["trload"] for r in _rows(b))


def _feature_rule(feat: str, noun: str) -> Rule:
    """get_pipelines' itertools.product axes: the values a feature takes in the pipeline's branch."""
    if feat == "mask":
        def check(b):
            return _mask_key(b) is not None
        deps = ("factory", "dtype", "pipeline", "mask", "mask_impl")
    else:
        def check(b):
            s = _set_of(b["factory"], b["dtype"], b["pipeline"])
            return s is not None and b[feat] in s["features"][feat]
        deps = ("factory", "dtype", "pipeline", feat)

    def message(b):
        return f"{b['dtype']} {b['pipeline']} fwd kernels on {b['arch']} have no {noun} {_show(b[feat])} variant"

    return Rule(f"ck.fwd.{feat}-variant", deps, check, message,
                hint=f"use {feat}(*) to take the variants ck generates", blame=feat)


# --- CompatibilityRuleFactory (all factories)
def check_group_mode_padding(b):
    # CompatibilityRuleFactory.check_mode: group mode needs spad = skpad = t
    return b["mode"] != "group" or (b["pad_s"] == 1 and b["pad_sk"] == 1)


def check_d192_bias(b):
    # CompatibilityRuleFactory.check_hdim: (192, 128) is inference-only (deepseek): no bias
    return tuple(b["hdim"]) != tuple(_data()["check_hdim"]["hdim"]) or b["bias"] == "no"


def check_d192_dropout(b):
    # CompatibilityRuleFactory.check_hdim: (192, 128) is inference-only (deepseek): no dropout
    return tuple(b["hdim"]) != tuple(_data()["check_hdim"]["hdim"]) or not b["dropout"]


# --- CompatibilityRuleFactoryGfx9.check_hdim_tile (gfx9, gfx950)
_applies_hdim_tile = _in_factory("check_hdim_tile")


def _hdim_tile_problem(b) -> str | None:
    """Which part of check_hdim_tile fails (None = passes)."""
    if not _applies_hdim_tile(b):
        return None
    cfg = _fac(b["factory"])["check_hdim_tile"]
    if b["dtype"] in cfg["exempt_dtypes"] or b["pipeline"] not in cfg["pipelines"]:
        return None
    bm0, bn0, bk0 = b["tile"].tile[:3]
    d128 = tuple(b["hdim"]) == (128, 128)
    if d128 and bn0 != 128:
        return "hdim (128, 128) {pipeline} kernels need a tile with bn0 = 128"
    if not d128 and bm0 != 128:
        return "{pipeline} kernels for hdim other than (128, 128) need a tile with bm0 = 128"
    if d128 and b["pipeline"] != "qr_async" and bk0 == 64:
        return "hdim (128, 128) tiles with bk0 = 64 are only used by qr_async, not {pipeline}"
    return None


def check_hdim_tile(b):
    # CompatibilityRuleFactoryGfx9.check_hdim_tile (dtype not fp32/mxfp8/mxfp4, tag in {qr, qr_async, qs})
    return _hdim_tile_problem(b) is None


# --- CompatibilityRuleFactoryGfx950.check_tile_pipeline (gfx950)
_applies_tile_pipeline = _in_factory("check_tile_pipeline")


def check_trload_tile(b):
    # check_tile_pipeline: qr_async_trload not with d128 bn0=128 tiles, and only for its hdims
    if not _applies_tile_pipeline(b) or b["pipeline"] != "qr_async_trload":
        return True
    hd = list(b["hdim"])
    if hd == [128, 128] and b["tile"].tile[1] == 128:
        return False
    return hd in _fac(b["factory"])["check_tile_pipeline"]["trload_hdims"]


def _is_v3_tile(t: Tile, cfg: dict) -> bool:
    w = t.wave
    return (t.tile[0] == cfg["bm0"] and w[0] * w[1] * w[2] == cfg["warps_gemm0"]
            and w[3] * w[4] * w[5] == cfg["warps_gemm1"])


def check_v3_tile(b):
    # check_tile_pipeline: the bm0=256 8-warp tile is used by qr_async_trload_v3 and by nothing else
    if not _applies_tile_pipeline(b):
        return True
    v3 = _is_v3_tile(b["tile"], _fac(b["factory"])["check_tile_pipeline"]["v3_tile"])
    return v3 == (b["pipeline"] == "qr_async_trload_v3")


# --- KernelComponentFactoryGfx11.check_d128_tile_pipeline (gfx11)
_applies_d128 = _in_factory("check_d128_tile_pipeline")


def check_d128_hpad_tile(b):
    # check_d128_tile_pipeline: fp16/bf16 d128 tile 64x64 never with qr_hpad (slower)
    if not _applies_d128(b):
        return True
    cfg = _fac(b["factory"])["check_d128_tile_pipeline"]
    if b["dtype"] not in cfg["dtypes"] or list(b["hdim"]) != cfg["hdim"]:
        return True
    if list(b["tile"].tile[:2]) == cfg["tile_bm0_bn0"]:
        return b["pipeline"] != cfg["forbidden_pipeline"]
    return True


# --- get_product(receipt): one filter per field it reads, so pruning happens early
def _receipt(b) -> dict | None:
    r = b["receipt"]
    if r == -1:
        return None
    rec = _data()["receipts"]
    return rec.get(str(r), rec["default"])


def _receipt_rule(key: str, deps: tuple, value) -> Rule:
    def check(b):
        spec = _receipt(b)
        if spec is None or key not in spec:
            return True
        if key == "fp8bf16_hdim_q":
            return b["dtype"] != "fp8bf16" or b["hdim"][0] in spec[key]
        return value(b) in spec[key]

    def message(b):
        return f"receipt {b['receipt']} does not build fwd kernels with {key.replace('_key', '')} {_show(value(b))}"

    return Rule("receipt.fwd", deps + ("receipt",), check, message,
                hint="pick another profile (e.g. `all`) to get these kernels", blame=deps[-1], filter=True)


def _check_receipt_dtype_not(b):
    spec = _receipt(b)
    return spec is None or b["dtype"] not in spec.get("dtype_not", ())


RECEIPT_RULES = (
    Rule("receipt.fwd", ("dtype", "receipt"), _check_receipt_dtype_not,
         "receipt {receipt} does not build {dtype} fwd kernels (fp32 only with receipts 800/801)",
         hint="use profile fp32_all (800) or fp32_min (801) for fp32", blame="dtype", filter=True),
    _receipt_rule("dtype", ("dtype",), lambda b: b["dtype"]),
    _receipt_rule("hdim_q", ("hdim",), lambda b: b["hdim"][0]),
    _receipt_rule("fp8bf16_hdim_q", ("dtype", "hdim"), lambda b: b["hdim"][0]),
    _receipt_rule("mode", ("mode",), lambda b: b["mode"]),
    _receipt_rule("vlayout", ("vlayout",), lambda b: b["vlayout"]),
    _receipt_rule("mask_key", ("factory", "dtype", "pipeline", "mask_impl", "mask"), _mask_key),
    _receipt_rule("bias", ("bias",), lambda b: b["bias"]),
    _receipt_rule("logits", ("logits",), lambda b: b["logits"]),
    _receipt_rule("lse", ("lse",), lambda b: b["lse"]),
    _receipt_rule("dropout", ("dropout",), lambda b: b["dropout"]),
    _receipt_rule("qscale", ("qscale",), lambda b: b["qscale"]),
    _receipt_rule("skip", ("skip",), lambda b: b["skip"]),
    _receipt_rule("sink", ("sink",), lambda b: b["sink"]),
)

_PROBLEM = ("factory", "dtype", "hdim")
RULES = (
    Rule("ck.fwd.dtype", ("factory", "arch", "dtype"), check_dtype, msg_dtype,
         hint="fwd dtypes: gfx9 fp16 bf16 fp8bf16 fp8fp32 (fp32 via receipts 800/801), gfx950 adds mxfp8 mxfp4, "
              "gfx11 fp16 bf16, gfx12 fp16 bf16 fp8 fp8bf16 fp8fp32", blame="dtype"),
    Rule("ck.fwd.hdim", _PROBLEM + ("arch",), check_hdim_table, msg_hdim,
         hint="use hdim(*) or one of the listed head dims", blame="hdim"),
    Rule("ck.fwd.vlayout", ("factory", "dtype", "vlayout"), check_vlayout,
         "{dtype} fwd kernels have no vlayout {vlayout} (mxfp8/mxfp4 use c, every other dtype r)",
         hint="drop vlayout(...) or use vlayout(*)", blame="vlayout"),
    Rule("ck.fwd.pipeline", _PROBLEM + ("vlayout", "pipeline", "receipt", "arch"), check_pipeline, msg_pipeline,
         hint="use pipeline(*) to take the pipelines ck lists for this dtype and hdim", blame="pipeline"),
    Rule("ck.fwd.padding", _PROBLEM + ("vlayout", "pipeline", "receipt") + PADS, check_padding, msg_padding,
         hint="use padding(*) to take the padding variants ck generates", blame="pad_dv"),
    Rule("ck.fwd.group-mode-padding", ("mode", "pad_s", "pad_sk"), check_group_mode_padding,
         "group mode kernels always pad seqlen_q and seqlen_k (pad_s = pad_sk = 1)",
         hint="set padding(s=1, sk=1) for group mode", blame="mode"),
    Rule("ck.fwd.hdim-tile", _PROBLEM + ("pipeline", "tile"), check_hdim_tile,
         lambda b: (_hdim_tile_problem(b) or "tile does not fit").format(**b),
         hint="use tile(*) to take ck's tile for this hdim", blame="tile"),
    Rule("ck.fwd.trload-tile", ("factory", "hdim", "pipeline", "tile"), check_trload_tile,
         "qr_async_trload runs only for hdim (64, 64), (128, 128), (256, 256) and not with hdim (128, 128) bn0 = 128 "
         "tiles", hint="use tile(*) or another pipeline", blame="tile"),
    Rule("ck.fwd.v3-tile", ("factory", "pipeline", "tile"), check_v3_tile,
         "the bm0 = 256 8-warp tile is used by qr_async_trload_v3 only, and v3 needs that tile",
         hint="use tile(*) to pair pipelines with their tiles", blame="tile"),
    Rule("ck.fwd.d128-hpad-tile", _PROBLEM + ("pipeline", "tile"), check_d128_hpad_tile,
         "hdim (128, 128) qr_hpad kernels do not use the 64x64 tile (slower)", hint="use tile(*)", blame="tile"),
    _feature_rule("mask", "mask"),
    _feature_rule("bias", "bias"),
    Rule("ck.fwd.bias-pipeline", _PROBLEM + ("vlayout", "pipeline", "receipt", "arch", "bias"), check_bias_pipeline,
         msg_bias_pipeline, hint="use pipeline(*) (qr for elementwise bias on gfx9/gfx950)", blame="bias"),
    Rule("ck.fwd.bias-padding", _PROBLEM + ("vlayout", "pipeline", "receipt", "bias") + PADS, check_bias_padding,
         msg_bias_padding, hint="use padding(*)", blame="bias"),
    Rule("ck.fwd.d192-no-bias", ("hdim", "bias"), check_d192_bias,
         "hdim (192, 128) has no kernels with bias (inference only)", hint="use bias(no)", blame="bias"),
    _feature_rule("logits", "logits soft-cap"),
    # CompatibilityRuleFactory.check_feature: logits soft-cap only without bias
    Rule("ck.fwd.logits-without-bias", ("bias", "logits"), no_logits_with_bias,
         "logits soft-cap is only generated without bias", hint="use bias(no) with logits", blame="logits"),
    _feature_rule("lse", "lse"),
    _feature_rule("dropout", "dropout"),
    Rule("ck.fwd.d192-no-dropout", ("hdim", "dropout"), check_d192_dropout,
         "hdim (192, 128) has no kernels with dropout (inference only)", hint="use dropout(false)", blame="dropout"),
    _feature_rule("qscale", "qscale"),
    _feature_rule("skip", "skip_min_seqlen_q"),
    _feature_rule("sink", "sink"),
    Rule("ck.fwd.trload-flag", ("factory", "dtype", "pipeline", "trload"), check_trload,
         "trload is set exactly for the qr_async_trload and qr_async_trload_v3 pipelines",
         hint="drop trload(...)", blame="trload"),
) + RECEIPT_RULES


# ----------------------------------------------------------------------------- names / support
def _mask_token(b: dict) -> str:
    key = _mask_key(b)
    if key is not None:
        return _data()["mask"]["keys"][key]["token"]
    if b["mask"] == "no":
        return "nmask"
    return "mask" if b["mask_impl"] == "simplified" else "m" + {"generic": "g"}.get(b["mask"], "c")


def ck_name(b: dict) -> str:
    # FmhaFwdKernel.name + ArchTrait.filename_suffix (no .cpp); pipeline part = FmhaFwdPipeline.name
    pipe = "_".join((
        b["pipeline"], "v" + b["vlayout"], pad_token(b, tuple(zip(PADS, ("s", "sk", "d", "dv")))),
        tf(b["logits"], "logits"), bias_token(b["bias"]), _mask_token(b),
        tf(b["lse"], "lse"), tf(b["dropout"], "dropout"), tf(b["skip"], "skip"),
        b["qscale"] if b["qscale"] != "no" else "nqscale", tf(b["trload"], "trload"), tf(b["sink"], "sink")))
    return (f"fmha_fwd_d{b['hdim'][0]}_{b['dtype']}_{b['mode']}_{tile_token(b['tile'])}_{pipe}"
            f"{ARCH_SUFFIX[b['factory']]}")


def supported(arch: str) -> str | None:
    factory = FACTORY.get(arch)
    if factory in ("sm80", "sm90"):
        return f"fwd is not supported on {arch} (CK is AMD only)"
    if factory is None or _fac(factory) is None:
        return f"fwd is not supported on {arch} (CK's fwd codegen has no factory for it)"
    return None


FAMILIES = {
    FAMILY: FamilyRules(
        family=FAMILY,
        fields=("dtype", "hdim", "mode", "vlayout", "pipeline", "tile") + PADS + FEATURES + ("trload",),
        rules=RULES,
        domain=domain,
        ck_name=ck_name,
        supported=supported,
        doc="CK forward attention kernels (FmhaFwdKernel, `generate.py --api fwd`)",
    ),
}
