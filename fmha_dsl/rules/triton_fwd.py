"""The forward family as the Triton backend implements it (``fmha_dsl/kernels/triton_fwd.py``).

One template serves every flag combination, so the rules here are about what the template supports and
what fits the target: dtypes per arch, head dims up to 256, a power-of-two warp count, shared memory and
accumulator registers for the tile, and the staging a CK pipeline name maps to.  Targets and limits are
data (``fmha_dsl/data/triton.json``; the targets' limits: ``fmha_dsl/arch.py``).

CK vocabulary -> Triton (see docs/triton.md):
  tile m0 / n0            -> BLOCK_M / BLOCK_N
  tile k0 = k0max, n1     -> the head dims padded to a power of two (BLOCK_DMODEL, BLOCK_DV)
  wave m0 (warps)         -> num_warps
  warp m/n/k              -> the MFMA/WMMA shape (AMD: matrix_instr_nonkdim = warp m)
  pipeline qr | qr_async  -> num_stages 1 | 2 (AMD) or 3 (NVIDIA), K/V by pointer loads (cp.async when staged)
  pipeline qr_async_trload | qr_async_trload_v3
                          -> K/V through on-device TMA tensor descriptors, num_stages 2 | 3 (sm90)
  pipeline qr_nwarp_sshuffle
                          -> CK's decode pipeline: the query heads of a GQA group packed into one tile's rows
                             (one program per K/V head), staged like qr_async
  block_per_cu            -> waves_per_eu (AMD occupancy hint; -1 = compiler's choice)
"""

from __future__ import annotations

import functools

from .. import arch as arch_table
from ..data import load
from ..data import uses_tma as data_uses_tma
from ..kernels.fwd_abi import block_d, packs_gqa
from .base import FamilyRules, Rule, Tile, pad_token, tf

PADS = ("pad_s", "pad_sk", "pad_d", "pad_dv")
ELEM = {"fp16": 2, "bf16": 2, "fp32": 4}
FIXED = {"qscale": "no", "rope": "none", "paged_kv": False, "fp8_static_quant": False, "skip": False,
         "dbias": False, "store_randval": False, "deterministic": False, "trload": False, "kv64": False}


def _data() -> dict:
    return load("triton")


def arch_info(arch: str) -> dict:
    return arch_table.info(arch)


def stages(b: dict) -> int:
    """num_stages of the key's pipeline on its arch's vendor (1 where the pipeline does not exist there: the
    pipeline rules reject those keys)."""
    vendor = arch_info(b["arch"])["vendor"]
    return _data()["pipelines"].get(b["pipeline"], {}).get(vendor, 1)


def uses_tma(pipeline: str) -> bool:
    """Whether ``pipeline`` loads K/V through tensor descriptors (the TMA copy engine)."""
    return data_uses_tma("triton", pipeline)


def _tma_ok(b) -> bool:
    return not uses_tma(b["pipeline"]) or bool(arch_info(b["arch"]).get("tma"))


@functools.lru_cache(maxsize=None)
def _tiles(arch: str, hq: int, hv: int) -> tuple[Tile, ...]:
    info = arch_info(arch)
    fam = _data()["tile_family"][arch]
    amd = info["vendor"] == "amd"
    out = []
    for m0, n0, nw in _data()["tiles"][fam]:
        dq, dv = block_d(hq), block_d(hv)
        if amd:  # MFMA 32x32 for big tiles, 16x16 otherwise; RDNA's WMMA is 16x16x16
            mi = 32 if (info["matrix"] == "mfma" and m0 >= 128 and n0 >= 64) else 16
            warp = (mi, mi, 8 if mi == 32 else 16) * 2 + (16, 16, 16)
        else:    # mma.sync m16n8k16; wgmma m64nNk16 on Hopper
            warp = ((64, min(n0, 256), 16) * 2 if info["matrix"] == "wgmma" else (16, 8, 16) * 2) + (16, 16, 16)
        out.append(Tile((m0, n0, dq, dv, n0, dq), (nw, 1, 1, nw, 1, 1, 1, 1, 1), warp, -1, 0, True))
    return tuple(out)


def domain(field: str, b: dict):
    if field == "dtype":
        return tuple(arch_info(b["arch"])["dtypes"])
    if field == "hdim":
        return tuple(tuple(h) for h in _data()["hdims"])
    if field == "tile":
        return _tiles(b["arch"], *b["hdim"])
    if field == "pipeline":
        return tuple(_data()["pipelines"])
    if field == "mask":
        return ("no", "top_left")
    if field == "bias":
        return ("no", "bias", "alibi")
    if field == "mode":
        return ("batch", "group")
    if field == "vlayout":
        return ("r", "c")
    if field in PADS:
        return (1, 0)
    if field == "max_splits_log2":
        return SPLITS_LOG2
    return (False, True)


# ---- feasibility -------------------------------------------------------------------------------------
def smem_bytes(b: dict) -> int:
    """Shared memory the template needs: the K and V tiles per stage (Q and P stay in registers)."""
    t = b["tile"].tile
    e = ELEM[b["dtype"]]
    n0, dq, dv = t[1], t[2], t[3]
    return max(1, stages(b)) * n0 * (dq + dv) * e


def acc_regs(b: dict) -> int:
    """fp32 registers per thread for the output accumulator and the score tile."""
    t = b["tile"]
    m0, n0, dv = t.tile[0], t.tile[1], t.tile[3]
    threads = t.wave[0] * arch_info(b["arch"])["warp_size"]
    return (m0 * dv + m0 * n0) // max(1, threads)


def reg_budget(arch: str) -> int:
    """Accumulator registers a tile may keep per thread: 3/4 of the register file's per-thread size (255
    addressable registers on NVIDIA count as 256).  The build's resource report has the real counts and spills."""
    return (arch_info(arch)["max_regs_per_thread"] + 1) // 4 * 3


def _warps_ok(b) -> bool:
    nw = b["tile"].wave[0]
    return nw > 0 and nw & (nw - 1) == 0 and nw <= arch_info(b["arch"])["max_warps"]


def _block_ok(b) -> bool:
    t = b["tile"].tile
    m0, n0, dq, dv = t[0], t[1], t[2], t[3]
    hq, hv = b["hdim"]
    p2 = all(v > 0 and v & (v - 1) == 0 for v in (m0, n0, dq, dv))
    return p2 and m0 >= 16 and n0 >= 16 and dq >= hq and dv >= hv


RULES = (
    Rule("triton.dtype", ("arch", "dtype"), lambda b: b["dtype"] in arch_info(b["arch"])["dtypes"],
         lambda b: f"the triton backend has no {b['dtype']} forward kernels for {b['arch']}",
         "use fp16, bf16 or fp32", blame="dtype"),
    Rule("triton.hdim", ("hdim",), lambda b: 1 <= b["hdim"][0] <= 256 and 1 <= b["hdim"][1] <= 256,
         lambda b: f"head dims above 256 are not supported (got {b['hdim']})", "split the head dim", blame="hdim"),
    Rule("triton.pipeline", ("pipeline",), lambda b: b["pipeline"] in _data()["pipelines"],
         lambda b: f"the triton backend implements pipelines {', '.join(_data()['pipelines'])}, not {b['pipeline']}",
         "use pipeline(qr | qr_async) or pipeline(*)", blame="pipeline"),
    Rule("triton.tma", ("arch", "pipeline"), _tma_ok,
         lambda b: f"pipeline {b['pipeline']} loads K and V through TMA tensor descriptors; {b['arch']} has no TMA "
                   "copy engine (sm90 has)", "use pipeline(qr_async) on this arch", blame="pipeline"),
    Rule("triton.pack-gqa", ("pipeline", "bias", "dropout"),
         lambda b: not packs_gqa(b["pipeline"]) or (b["bias"] == "no" and not b["dropout"]),
         lambda b: f"pipeline {b['pipeline']} packs the query heads of a GQA group into one tile's rows; it has no "
                   "elementwise bias, ALiBi or dropout", "use pipeline(qr_async) for bias, ALiBi or dropout",
         blame="pipeline"),
    Rule("triton.pack-gqa-padding", ("pipeline", "pad_s"), lambda b: not packs_gqa(b["pipeline"]) or b["pad_s"],
         "a GQA-packed pipeline bounds-checks its rows whatever pad_s says: pad_s false would build the same kernel",
         "use padding(true, *, *, *)", blame="pad_s", filter=True),
    Rule("triton.tma-vlayout", ("pipeline", "vlayout"), lambda b: not uses_tma(b["pipeline"]) or b["vlayout"] == "r",
         lambda b: f"pipeline {b['pipeline']} (TMA descriptors) needs row-major V; vlayout(c) is column-major",
         "use pipeline(qr_async) for column-major V", blame="pipeline"),
    Rule("triton.num-warps", ("arch", "tile"), _warps_ok,
         lambda b: f"num_warps (wave m0 = {b['tile'].wave[0]}) must be a power of two up to "
                   f"{arch_info(b['arch'])['max_warps']}", "use wave(4, ...) or wave(8, ...)", blame="tile"),
    Rule("triton.block-shape", ("hdim", "tile"), _block_ok,
         lambda b: f"tile {b['tile'].tile[:4]} must be powers of two, m0/n0 >= 16, and k0/n1 must cover the "
                   f"head dims {b['hdim']}", "use tile(*) or k0 = n1 = the next power of two of the head dim",
         blame="tile"),
    Rule("triton.group-mode-padding", ("mode", "pad_s", "pad_sk"),
         lambda b: b["mode"] != "group" or (b["pad_s"] and b["pad_sk"]),
         "group mode (varlen) kernels always bounds-check seqlen_q and seqlen_k: pad_s/pad_sk false would build "
         "the same kernel as true", "use padding(true, true, *, *)", blame="mode"),
    # sink tokens count only under a mask (SINK = sink and mask; attention() drops the count without one)
    Rule("triton.same-kernel", ("mask", "sink"), lambda b: not (b["sink"] and b["mask"] == "no"),
         "sink(true) with mask(no) builds the same kernel as sink(false): sink tokens act only under a mask",
         "pair sink(true) with a mask (mask(causal), or a window at run time)", blame="sink", filter=True),
    Rule("triton.shared-memory", ("arch", "dtype", "pipeline", "tile"),
         lambda b: smem_bytes(b) <= arch_info(b["arch"])["shared_bytes"],
         lambda b: f"tile {b['tile'].tile[:4]} with {stages(b)} stage(s) needs {smem_bytes(b)} bytes of shared "
                   f"memory; {b['arch']} has {arch_info(b['arch'])['shared_bytes']}",
         "use a smaller n0, or pipeline(qr) (one stage)", blame="tile"),
    Rule("triton.registers", ("arch", "hdim", "tile"),
         lambda b: acc_regs(b) <= reg_budget(b["arch"]),
         lambda b: f"tile {b['tile'].tile[:4]} keeps {acc_regs(b)} fp32 accumulators per thread on "
                   f"{b['tile'].wave[0]} warps; more than {reg_budget(b['arch'])}, 3/4 of {b['arch']}'s "
                   f"{arch_info(b['arch'])['max_regs_per_thread']} registers (it would spill)",
         "use a smaller m0 or more warps", blame="tile"),
)


SPLITS_LOG2 = tuple(range(1, 8))   # split-KV: 2 .. 128 splits
SPLIT_RULES = (
    Rule("triton.splits", ("max_splits_log2",), lambda b: b["max_splits_log2"] in SPLITS_LOG2,
         lambda b: f"a split-KV kernel splits the key axis into up to 2**max_splits_log2 parts, with "
                   f"max_splits_log2 in 1..7; got {b['max_splits_log2']}",
         "use max_splits_log2(4) (16 splits), or max_splits_log2(*) for every count", blame="max_splits_log2"),
)


def ck_name(b: dict) -> str:
    t = b["tile"]
    pad = pad_token(b, (("pad_s", "s"), ("pad_sk", "sk"), ("pad_d", "d"), ("pad_dv", "dv")))
    mask = {"no": "nmask", "top_left": "mask", "bottom_right": "mask", "generic": "mask"}[b["mask"]]
    bias = {"no": "nbias", "bias": "bias", "alibi": "alibi"}[b["bias"]]
    occ = f"_o{t.block_per_cu}" if t.block_per_cu != -1 else ""
    split = f"splitkv_s{1 << b['max_splits_log2']}_" if b["family"] == "fwd_splitkv" else ""
    return (f"fmha_fwd_{split}d{b['hdim'][0]}x{b['hdim'][1]}_{b['dtype']}_{b['mode']}_b{t.tile[0]}x{t.tile[1]}"
            f"_w{t.wave[0]}x{t.warp[0]}{occ}_{b['pipeline']}_v{b['vlayout']}_{pad}_{tf(b['logits'], 'logits')}"
            f"_{bias}_{mask}_{tf(b['lse'], 'lse')}_{tf(b['dropout'], 'dropout')}_{tf(b['sink'], 'sink')}"
            f"_triton_{b['arch']}")


FWD_FIELDS = ("dtype", "hdim", "mode", "vlayout", "pipeline", "tile") + PADS + ("mask", "bias", "logits", "lse",
                                                                               "dropout", "sink")


def _supported(arch: str) -> str | None:
    return None if arch in arch_table.backend_archs("triton") else f"the triton backend has no target {arch}"


FAMILIES = {
    "fwd": FamilyRules(family="fwd", fields=FWD_FIELDS, rules=RULES, domain=domain, ck_name=ck_name, fixed=FIXED,
                       supported=_supported, doc=__doc__),
    # split-KV (docs/triton.md "Split-KV"): the same template with SPLIT, plus a combine kernel built with it;
    # max_splits_log2 is the split count it runs with (fewer when the key axis has fewer blocks)
    "fwd_splitkv": FamilyRules(family="fwd_splitkv", fields=FWD_FIELDS + ("max_splits_log2",),
                               rules=RULES + SPLIT_RULES, domain=domain, ck_name=ck_name, fixed=FIXED,
                               defaults={"max_splits_log2": 4}, supported=_supported, doc=__doc__),
}
