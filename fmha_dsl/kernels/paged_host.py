"""[kernels] The host side of the paged serving template (:mod:`.triton_paged`), free of Triton: the kernel's constexpr
names and their values for a ``batch_prefill`` / ``fwd_pagedkv`` kernel key.

``CONSTEXPRS`` / ``constexprs(sig, alg) -> dict``
    The constexpr names in order (after :data:`fmha_dsl.kernels.paged_abi.ARGS`), and their values for a kernel
    key's field dicts; a key the template cannot compile is a ``ValueError`` naming the field.
``v_descale_per_key(kv_scale, page, n0) -> bool``
    Whether a key block reads a V descale per key (FP8 per-token-head scales, or block scales over short pages).
"""

from __future__ import annotations

from .fwd_abi import block_d, packs_gqa
from .paged_abi import DTYPES, FP8_DTYPES, KV_SCALES, LOOKUPS, kv_vec, page_size, qscales_of

__all__ = ["CONSTEXPRS", "constexprs", "v_descale_per_key"]

CONSTEXPRS: tuple[str, ...] = (
    "BLOCK_M", "BLOCK_N", "BLOCK_DMODEL", "BLOCK_DV", "HEAD_DIM_Q", "HEAD_DIM_V", "PAD_D", "PAD_DV", "CHECK_D",
    "CHECK_DV", "MASK", "SINK", "ALIBI", "STORE_LSE", "SOFTCAP", "IEEE", "UPCAST_DOT", "SPLIT", "PACK_GQA",
    "PAGE_SIZE", "LOOKUP", "TMA", "KV_VEC", "FP8", "KV_SCALE", "V_ROWS",
)


def v_descale_per_key(kv_scale: int, page: int, n0: int) -> bool:
    """Whether a block of ``n0`` keys reads a V descale per key (the kernel's ``KV_SCALE == 2 or PAGE_SIZE <
    BLOCK_N`` under ``KV_SCALE``): per-token-head scales, or block scales over pages shorter than the block."""
    return kv_scale == 2 or (kv_scale == 1 and page < n0)


def constexprs(sig: dict, alg: dict) -> dict:
    """Constexpr values of a ``batch_prefill`` / ``fwd_pagedkv`` key (tile ``(m0, n0, ...)`` gives BLOCK_M / BLOCK_N;
    the head dims the power-of-two blocks; ``kv_cache(layout, lookup, page_size)`` the addressing; ``fwd_pagedkv``
    splits the key axis; pipeline ``qr_async_trload`` reads K/V blocks through TMA descriptors)."""
    family = sig.get("family", "batch_prefill")
    dtype = sig.get("dtype", "fp16")
    fp8 = dtype in FP8_DTYPES
    if dtype not in DTYPES and not fp8:
        raise ValueError(f"the triton serving templates take dtype fp16, bf16, fp32 or fp8bf16, not {dtype!r}")
    if sig.get("qscale", "no") not in qscales_of(dtype):
        raise ValueError(f"the triton paged template takes qscale={' | '.join(qscales_of('fp8bf16'))} with FP8 "
                         f"(fp8bf16) and no qscale otherwise, not qscale={sig.get('qscale')!r} with {dtype}")
    hq, hv = int(sig["hdim_q"]), int(sig["hdim_v"])
    if not (1 <= hq <= 256 and 1 <= hv <= 256):
        raise ValueError(f"head dims must be in 1..256, got {hq}, {hv}")
    if family not in ("batch_prefill", "fwd_pagedkv"):
        raise ValueError(f"the triton paged template does not implement family={family!r}")
    vec = kv_vec(sig)
    for key, ok in {"rope": "none", "fp8_static_quant": False, "skip": False, "dbias": False,
                    "store_randval": False, "dropout": False, "vlayout": "r"}.items():
        if key in sig and sig[key] != ok:
            raise ValueError(f"the triton paged template does not implement {key}={sig[key]!r}")
    if sig.get("bias", "no") == "bias":
        raise ValueError("the triton paged template has ALiBi but no elementwise bias")
    m0, n0 = int(alg["tile"][0]), int(alg["tile"][1])
    for name, val in (("m0", m0), ("n0", n0)):
        if val < 16 or val & (val - 1):
            raise ValueError(f"tile {name} must be a power of two >= 16, got {val}")
    pack = packs_gqa(alg.get("pipeline", ""))
    from ..rules.triton_fwd import uses_tma

    tma = uses_tma(alg.get("pipeline", ""))
    if tma and vec:
        raise ValueError(f"pipeline {alg['pipeline']} (TMA) reads the linear KV layout only, not vectorized")
    if tma and page_size(sig) < n0:
        raise ValueError(f"pipeline {alg['pipeline']} (TMA) reads a key block from one page: page_size "
                         f"{page_size(sig)} < n0 {n0}")
    if pack and sig.get("bias", "no") != "no":
        raise ValueError(f"pipeline {alg['pipeline']} (GQA-packed rows) has no ALiBi")
    bd, bdv = block_d(hq), block_d(hv)
    pad_d, pad_dv = bool(alg.get("pad_d", 1)), bool(alg.get("pad_dv", 1))
    mask = sig.get("mask", "no") != "no"
    kv_scale = KV_SCALES.get(sig.get("qscale", "no"), 0)
    # a V descale per key (per-token-head scales, or block scales over pages shorter than a key block) multiplies
    # V's rows in tiles of at least 64 query rows and no fewer rows than keys: there it takes fewer instructions
    # and spills less than scaling P by key and keeping P.V in units of the largest descale, which also needs the
    # descales in P's layout and a reduction over the keys (sm90 SASS, bench/probe_sass_paged.py; 64 x 128 tiles
    # take more).  Decode's 16-row tiles keep the units: their V tile is 8x P, and they are bound by memory.
    v_rows = v_descale_per_key(kv_scale, page_size(sig), n0) and not vec and m0 >= max(n0, 64)
    return {
        "BLOCK_M": m0, "BLOCK_N": n0, "BLOCK_DMODEL": bd, "BLOCK_DV": bdv, "HEAD_DIM_Q": hq, "HEAD_DIM_V": hv,
        "PAD_D": pad_d, "PAD_DV": pad_dv, "CHECK_D": pad_d or hq != bd, "CHECK_DV": pad_dv or hv != bdv,
        "MASK": mask, "SINK": bool(sig.get("sink", False)) and mask, "ALIBI": sig.get("bias", "no") == "alibi",
        "STORE_LSE": bool(sig.get("lse", False)), "SOFTCAP": bool(sig.get("logits", False)), "IEEE": dtype == "fp32",
        "UPCAST_DOT": False, "SPLIT": family == "fwd_pagedkv", "PACK_GQA": pack, "PAGE_SIZE": page_size(sig),
        "LOOKUP": LOOKUPS[sig.get("kv_lookup", "vllm")], "TMA": tma, "KV_VEC": vec, "FP8": fp8,
        "KV_SCALE": kv_scale, "V_ROWS": v_rows,
    }
