"""CK dispatcher validation for tiles a user writes out explicitly, shared by the forward-style families.

Tiles drawn from upstream's tables (``tile(*)``) are what CK's generator instantiates and are taken
as they are (some gfx950 trload tiles would fail these checks, as upstream's own rule factory
exempts them).  A tile given through ``tile(...)`` / ``tile_m0(...)`` setters is checked the way CK's
dispatcher codegen checks a config (``codegen/fmha/validation.py``: ``tile_passes_all_constraints``
and ``validate_config``), with the same limits.
"""

from __future__ import annotations

import functools

from ..data import load
from .base import Rule

# the common dtypes' sizes live in CK's parent arch_specs.json; fmha_arch_specs.json adds the composite ones
_BASE_ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1, "bf8": 1}
ASYNC_PIPELINES = ("qr_async", "qr_async_trload", "qr_async_trload_v3")
LDS_ASYNC_BYTES = 163840            # 160 KiB: CK's async pipelines keep three K/V buffers in flight
FWD_LIKE = ("fwd", "fwd_pagedkv", "fwd_splitkv", "batch_prefill")


@functools.lru_cache(maxsize=None)
def _specs() -> tuple[dict, dict]:
    spec = load("fmha_arch_specs")
    elem = dict(_BASE_ELEM_BYTES)
    elem.update({k: v for k, v in spec["fmha_element_sizes"].items() if not k.startswith("_")})
    lds = {k: v for k, v in spec["lds_limits"].items() if not k.startswith("_")}
    return elem, lds


def _explicit(b) -> bool:
    return not b["tile"].from_table


def _elem(b) -> int:
    return _specs()[0].get(b["dtype"], 2)


def _lds_ok(b) -> bool:
    if not _explicit(b):
        return True
    m0, n0, k0, n1, k1, _ = b["tile"].tile[:6]
    e = _elem(b)
    if b["pipeline"] in ASYNC_PIPELINES:
        single_k = n0 * k0 * e
        single_v = k1 * n1 * e
        return 3 * max(single_k, single_v) <= LDS_ASYNC_BYTES
    return (m0 * k0 + n0 * k0) * e <= _specs()[1].get(b["pipeline"], 65536)


def _lds_msg(b) -> str:
    m0, n0, k0, n1, k1, _ = b["tile"].tile[:6]
    e = _elem(b)
    if b["pipeline"] in ASYNC_PIPELINES:
        need = 3 * max(n0 * k0 * e, k1 * n1 * e)
        return (f"tile {m0}x{n0}x{k0}x{n1}x{k1} needs {need} bytes of LDS for {b['pipeline']} "
                f"(3 K/V buffers), more than {LDS_ASYNC_BYTES}")
    need = (m0 * k0 + n0 * k0) * e
    limit = _specs()[1].get(b["pipeline"], 65536)
    return f"tile {m0}x{n0}x{k0} needs {need} bytes of LDS for {b['pipeline']}, more than {limit}"


def _warps_divide(b) -> bool:
    if not _explicit(b):
        return True
    t, w = b["tile"].tile, b["tile"].warp
    m0, n0, k0 = t[0], t[1], t[2]
    wm, wn, wk = w[0], w[1], w[2]
    return wm > 0 and wn > 0 and wk > 0 and m0 % wm == 0 and n0 % wn == 0 and k0 % wk == 0


def _k0_fits(b) -> bool:
    if not _explicit(b):
        return True
    k0 = b["tile"].tile[2]
    hq = b["hdim"][0]
    return 0 < k0 <= max(hq, b["tile"].tile[5]) and b["tile"].tile[5] % k0 == 0


def _mfma_count(b) -> bool:
    """qr with hdim_q 256 on CDNA: (n0/wn)(k0/wk) MFMA instructions per step, a multiple of 8."""
    if not _explicit(b) or b["pipeline"] != "qr" or b["hdim"][0] != 256 or b["factory"] not in ("gfx9", "gfx950"):
        return True
    t, w = b["tile"].tile, b["tile"].warp
    if not (w[1] and w[2]):
        return False
    return ((t[1] // w[1]) * (t[2] // w[2])) % 8 == 0


def _async_dma(b) -> bool:
    """qr_async on gfx9: the K tile must split evenly over the warps' 64-lane vector loads."""
    if not _explicit(b) or b["pipeline"] != "qr_async" or b["factory"] not in ("gfx9", "gfx950"):
        return True
    t, w = b["tile"].tile, b["tile"].warp
    kvector = (16 if b["factory"] == "gfx950" else 4) // _elem(b) or 1
    warps = t[0] // w[0] if w[0] else 0
    unit = warps * 64 * kvector
    return unit > 0 and (t[1] * t[2]) % unit == 0


def _gfx9_tile(b) -> bool:
    if not _explicit(b) or b["factory"] not in ("gfx9", "gfx950") or b["dtype"] == "fp32":
        return True
    if b["pipeline"] not in ("qr", "qr_async", "qs"):
        return True
    m0, n0, k0 = b["tile"].tile[:3]
    if b["hdim"] == (128, 128):
        if n0 != 128:
            return False
        if b["pipeline"] == "qr_async":
            return m0 == 128
        return k0 != 64
    return m0 in (64, 128, 192, 256)


def _gfx950_tile(b) -> bool:
    if not _explicit(b) or b["factory"] != "gfx950":
        return True
    p = b["pipeline"]
    if p == "qr_async_trload":
        return b["hdim"] in ((64, 64), (128, 128)) and not (b["hdim"] == (128, 128) and b["tile"].tile[1] == 128)
    if p == "qr_async_trload_v3":
        return b["tile"].tile[0] == 256
    return True


def _occupancy(b) -> bool:
    bpc = b["tile"].block_per_cu
    return bpc == -1 or bpc > 0


TILE_RULES = (
    Rule("ck.tile.lds-capacity", ("dtype", "pipeline", "tile"), _lds_ok, _lds_msg,
         "use smaller n0/k0 (or n1/k1) tiles, or a pipeline with a larger LDS budget", blame="tile"),
    Rule("ck.tile.warp-divides-tile", ("tile",), _warps_divide,
         lambda b: f"warp tile {b['tile'].warp[:3]} does not divide block tile {b['tile'].tile[:3]}",
         "m0, n0 and k0 must be multiples of the warp tile's m, n and k", blame="tile"),
    Rule("ck.tile.k0-fits-hdim", ("hdim", "tile"), _k0_fits,
         lambda b: f"tile k0={b['tile'].tile[2]} must divide k0max={b['tile'].tile[5]} and not exceed the head dim",
         "pick k0 from 16, 32, 64, 128, 256 dividing k0max", blame="tile"),
    Rule("ck.tile.mfma-count", ("factory", "hdim", "pipeline", "tile"), _mfma_count,
         lambda b: "qr with hdim 256 on CDNA needs (n0/warp_n0)*(k0/warp_k0) MFMA instructions per step "
                   "to be a multiple of 8", "raise n0 or k0, or use a smaller warp tile", blame="tile"),
    Rule("ck.tile.async-dma", ("factory", "dtype", "pipeline", "tile"), _async_dma,
         lambda b: f"qr_async cannot split the {b['tile'].tile[1]}x{b['tile'].tile[2]} K tile evenly over "
                   f"{b['tile'].tile[0] // max(b['tile'].warp[0], 1)} warps' 64-lane vector loads",
         "make n0*k0 a multiple of (m0/warp_m0)*64*kvector", blame="tile"),
    Rule("ck.tile.gfx9", ("factory", "dtype", "hdim", "pipeline", "tile"), _gfx9_tile,
         lambda b: f"tile {b['tile'].tile[:3]} is not one CK's gfx9 rules allow for hdim {b['hdim']} "
                   f"with {b['pipeline']}",
         "hdim 128: n0 = 128 (qr_async: m0 = 128; otherwise k0 != 64); other head dims: m0 in 64..256",
         blame="tile"),
    Rule("ck.tile.gfx950", ("factory", "hdim", "pipeline", "tile"), _gfx950_tile,
         lambda b: f"{b['pipeline']} does not support tile {b['tile'].tile[:3]} for hdim {b['hdim']} on gfx950",
         "qr_async_trload: hdim (64, 64) or (128, 128), not n0 = 128 at 128; qr_async_trload_v3: m0 = 256",
         blame="tile"),
    Rule("ck.tile.block-per-cu", ("tile",), _occupancy,
         lambda b: f"block_per_cu must be positive or -1 (auto), got {b['tile'].block_per_cu}",
         "use block_per_cu(-1) to let the compiler pick", blame="tile"),
)

HDIM_RULE = Rule("ck.hdim.multiple-of-8", ("hdim",), lambda b: b["hdim"][0] % 8 == 0 and b["hdim"][1] % 8 == 0,
                 lambda b: f"head dims must be multiples of 8, got {b['hdim']}",
                 "pad the head dim up to a multiple of 8", blame="hdim")


def common_rules(family: str, fields: tuple[str, ...]) -> tuple[Rule, ...]:
    out = []
    if "hdim" in fields:
        out.append(HDIM_RULE)
    if family in FWD_LIKE and "tile" in fields:
        out.extend(r for r in TILE_RULES if all(d in fields or d in ("factory",) for d in r.deps))
    return tuple(out)
