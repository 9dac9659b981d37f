"""Canonical vocabulary of kernel keys: field values, CK's aliases, and the setter catalogue.

One table per concept, declared once: the grammar accepts any name, :mod:`fmha_dsl.declare`
canonicalises it here (``no_mask`` -> ``no``, ``causal`` -> ``top_left`` ...), and
:mod:`fmha_dsl.keys` types the fields with the same values.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import arch as _arch

FAMILIES = (
    "fwd", "fwd_pagedkv", "fwd_splitkv", "fwd_splitkv_combine", "fwd_appendkv",
    "batch_prefill", "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq",
)
DTYPES = ("fp16", "bf16", "fp32", "fp8", "bf8", "fp8fp16", "fp8bf16", "fp8fp32", "mxfp8", "mxfp4")
MODES = ("batch", "group")
VLAYOUTS = ("r", "c")
MASKS = ("no", "top_left", "bottom_right", "generic")
BIASES = ("no", "bias", "alibi")
QSCALES = ("no", "pertensor", "blockscale", "kv_blockscale", "mx", "perhead", "per_token_head")
ROPES = ("none", "inter", "half")
KV_LAYOUTS = ("vectorized", "linear")
# which rule set decides what exists: CK's generator rules, or what the Triton templates implement
BACKENDS = ("ck", "triton")
PIPELINES = (
    "qr", "qr_async", "qs", "qr_async_trload", "qr_async_trload_v3", "v3", "qr_pagedkv",
    "qr_nwarp_sshuffle", "appendkv", "splitkv_combine", "batch_prefill_gfx11", "bwd", "qr_hpad",
    "dot_do_o", "convert_dq", "bwd_async", "bwd_trload",
)
ARCHS = _arch.names()  # fmha_dsl/data/archs.json

# alias -> canonical, per field (CK's symbol_map plus the spellings its examples use)
ALIASES: dict[str, dict[str, str]] = {
    "mask": {
        "no": "no", "no_mask": "no", "none": "no", "n": "no",
        "top_left": "top_left", "causal": "top_left", "t": "top_left", "mask_top_left": "top_left",
        "bottom_right": "bottom_right", "b": "bottom_right", "mask_bottom_right": "bottom_right",
        "generic": "generic", "window_generic": "generic", "g": "generic", "window": "generic",
    },
    "bias": {
        "no": "no", "no_bias": "no", "none": "no", "n": "no",
        "bias": "bias", "elementwise": "bias", "elementwise_bias": "bias", "e": "bias",
        "alibi": "alibi", "a": "alibi",
    },
    "qscale": {
        "no": "no", "no_scale": "no", "none": "no", "n": "no",
        "pertensor": "pertensor", "per_tensor": "pertensor",
        "blockscale": "blockscale", "kv_blockscale": "kv_blockscale", "mx": "mx",
        "perhead": "perhead", "per_token_head": "per_token_head",
    },
    "rope": {"none": "none", "no": "none", "inter": "inter", "interleaved": "inter",
             "half": "half", "half_rotated": "half"},
    "vlayout": {"r": "r", "row": "r", "row_major": "r", "c": "c", "col": "c", "col_major": "c"},
    "mode": {"batch": "batch", "group": "group", "varlen": "group"},
    "kv_layout": {"vectorized": "vectorized", "linear": "linear"},
    "kv_lookup": {"vllm": "vllm", "sglang": "sglang", "vllm_block_table_2d": "vllm",
                  "sglang_page_table_1d": "sglang"},
    "pipeline": {p: p for p in PIPELINES},
    "dtype": {d: d for d in DTYPES} | {"float16": "fp16", "half": "fp16", "bfloat16": "bf16",
                                       "float32": "fp32", "float": "fp32"},
    "family": {f: f for f in FAMILIES} | {"fwd_paged_kv": "fwd_pagedkv", "fwd_split_kv": "fwd_splitkv",
                                          "fwd_append_kv": "fwd_appendkv"},
    "mask_impl": {"simplified": "simplified", "generic": "generic"},
    "backend": {"ck": "ck", "triton": "triton"},
}
ALIASES["pipeline"]["v3"] = "qr_async_trload_v3"  # CK treats them as one pipeline

# Profiles (CK receipts) and their numeric aliases
PROFILES = {
    "ck_default": 0, "ck_extended": 1, "flash_fwd": 2, "flash_bwd": 3, "pytorch": 4,
    "aiter_batch": 100, "aiter_group": 200, "aiter_bwd_batch": 300, "aiter_bwd_group": 400,
    "aiter_cpp": 600, "fp32_all": 800, "fp32_min": 801, "fp8_test": 888, "all": -1,
}
RECEIPT_TO_PROFILE = {v: k for k, v in PROFILES.items()}

TILE_NAMES = ("m0", "n0", "k0", "n1", "k1", "k0max")
WAVE_NAMES = ("m0", "n0", "k0", "m1", "n1", "k1", "m2", "n2", "k2")


@dataclass(frozen=True)
class SetterSpec:
    """How one setter's positional/keyword arguments map onto key fields."""

    name: str
    block: str                      # "signature" | "algorithm" | "set" (set/declaration level)
    params: tuple[str, ...]         # parameter names, in order
    required: int                   # how many must be given
    doc: str


SETTERS: dict[str, SetterSpec] = {}


def _s(name, block, params, required, doc):
    SETTERS[name] = SetterSpec(name, block, tuple(params), required, doc)


for _f in ("family", "dtype", "mode", "vlayout", "mask", "bias", "qscale", "rope"):
    _s(_f, "signature", ("value",), 1, f"signature {_f}")
for _f in ("lse", "dropout", "logits", "paged_kv", "fp8_static_quant", "skip", "sink", "dbias",
           "store_randval", "deterministic"):
    _s(_f, "signature", ("value",), 0, f"signature flag {_f} (no argument = true)")
_s("hdim", "signature", ("q", "v"), 1, "head dims: hdim(q) or hdim(q, v); hdim(*) or a list of pairs")
_s("kv_cache", "signature", ("layout", "lookup", "page_size"), 1, "KV cache layout, lookup table, page size")
_s("page_size", "signature", ("value",), 1, "KV cache page size")
_s("profile", "set", ("value",), 1, "receipt profile (name or number)")
_s("receipt", "set", ("value",), 1, "receipt number (alias of profile)")
_s("arch", "set", ("archs",), 1, "target architectures")
_s("mask_impl", "set", ("value",), 1, "CK mask implementation: simplified (default) or generic")
_s("backend", "set", ("value",), 1, "rules and compiler: ck (CK's generator rules; default) or triton")
_s("tile", "algorithm", ("m0", "n0", "k0", "n1", "k1", "k0max", "t6", "t7", "t8"), 1,
   "block tile, 6 values (9 for bwd_dq_dk_dv) or tile(*)")
_s("wave", "algorithm", WAVE_NAMES, 1, "warps per block for the 3 gemm stages (9 values)")
_s("warp", "algorithm", WAVE_NAMES, 1, "warp tile (MFMA/WMMA shape) for the 3 gemm stages (9 values)")
for _i, _n in enumerate(TILE_NAMES):
    _s(f"tile_{_n}", "algorithm", ("value",), 1, f"block tile dimension {_n}")
for _n in WAVE_NAMES[:6]:
    _s(f"wave_{_n}", "algorithm", ("value",), 1, f"warps per block, {_n}")
    _s(f"warp_{_n}", "algorithm", ("value",), 1, f"warp tile, {_n}")
_s("pipeline", "algorithm", ("value",), 1, "pipeline")
_s("padding", "algorithm", ("s", "sk", "d", "dv"), 1, "padding flags (seqlen_q, seqlen_k, hdim_q, hdim_v)")
for _p in ("pad_s", "pad_sk", "pad_d", "pad_dv"):
    _s(_p, "algorithm", ("value",), 1, f"padding flag {_p}")
_s("trload", "algorithm", ("value",), 0, "transposed LDS loads (gfx950)")
_s("kv64", "algorithm", ("value",), 0, "64-bit KV cache addressing (batch prefill, >2 GB caches)")
_s("alignments", "algorithm", ("q", "v"), 1, "head-dim alignment guarantees (q, v)")
_s("block_per_cu", "algorithm", ("value",), 1, "occupancy: blocks per CU (-1 = let the compiler pick)")
_s("num_wave_groups", "algorithm", ("value",), 1, "number of wave groups")
_s("max_splits_log2", "algorithm", ("value",), 1, "split-KV: num_splits <= 2**value")
_s("max_seq_len_q", "algorithm", ("value",), 1, "kernel only used when max seqlen_q <= value")
_s("selection_rank", "algorithm", ("value",), 1, "tie-break rank (lower preferred)")
_s("constraint", "algorithm", ("value",), 1, "free-form constraint tag")

# CK's FmhaSignature/FmhaAlgorithm defaults (fmha_arch_specs.json "defaults"), canonical spelling.
SIG_DEFAULTS = {
    "dtype": "fp16", "mode": "batch", "vlayout": "r", "hdim": (128, 128), "mask": "no", "bias": "no",
    "lse": False, "dropout": False, "qscale": "no", "rope": "none", "logits": False, "paged_kv": False,
    "fp8_static_quant": False, "skip": False, "sink": False, "dbias": False, "store_randval": False,
    "deterministic": False, "kv_layout": "vectorized", "kv_lookup": "sglang", "page_size": 1,
}
ALG_DEFAULTS = {
    "pipeline": "qr", "pad_s": 1, "pad_sk": 1, "pad_d": 1, "pad_dv": 1, "trload": False, "kv64": False,
    "hdim_q_alignment": 0, "hdim_v_alignment": 0, "num_wave_groups": 1, "max_splits_log2": 0,
    "selection_rank": 0, "constraint": "",
}
TILE_DEFAULT = (128, 64, 32, 128, 32, 128)
WAVE_DEFAULT = (2, 2, 1, 2, 2, 1, 1, 1, 1)
WARP_DEFAULT = (32, 32, 16, 32, 32, 16, 16, 16, 16)


def receipt_profile(text: str):
    """The profile a receipt number spelled as text names (``"0"``, ``"-1"``: ASCII digits, at most 6, written as
    the number is -- not ``"-0"`` or ``"007"``), else None (other text is a profile name, or nothing)."""
    t = text[1:] if text.startswith("-") else text
    if not (t.isascii() and t.isdigit() and len(t) <= 6) or str(int(text)) != text:
        return None
    return RECEIPT_TO_PROFILE.get(int(text))
