"""The backward families as the Triton backend implements them (``fmha_dsl/kernels/triton_bwd.py``).

``bwd_dq_dk_dv`` is the kernel a declaration chooses (tile, staging, flags); its two 1-d companions --
``bwd_dot_do_o`` (D = rowsum(dO * O)) and ``bwd_convert_dq`` (dQ from the fp32 accumulator) -- are built with
every such key, as CK's launcher pairs them (a set may also declare them on their own).  Tile tables and
stagings are data (``fmha_dsl/data/triton_bwd.json``); the targets' limits come from ``fmha_dsl/arch.py``.

CK vocabulary -> Triton (docs/triton.md, "Backward"):
  tile bm0 / bn0          -> BLOCK_M (queries per step) / BLOCK_N (keys per program, dK/dV in its registers)
  tile bk0..bk4, bhdq/bhdv -> the head dims padded to a power of two (BLOCK_DMODEL, BLOCK_DV)
  wave (warps)            -> num_warps
  pipeline bwd | bwd_async -> num_stages 1 | 2 (AMD) or 3 (NVIDIA) over the query-block loop
  pipeline bwd_trload     -> bwd_async with Q/dO through TMA descriptors and dQ by TMA bulk reduction (sm90)
  pad(s, sk, d, dv)       -> bounds checks on query rows / key columns / head dims (CK's pad-to-8 is a
                             pad_d / pad_dv value > 1: the head-dim tail is checked alike)
  deterministic           -> dQ summed from one partial per key block, in a fixed order (no atomics)
  dbias                   -> the bias gradient written per (row, column), summed over broadcast dims by the caller
"""

from __future__ import annotations

import functools

from .. import arch as arch_table
from ..data import load, uses_tma
from ..kernels.abis import companion_name
from ..kernels.bwd_abi import block_d
from .base import FamilyRules, Rule, Tile, pad_token, tf

ELEM = {"fp16": 2, "bf16": 2, "fp32": 4}
FIXED = {"qscale": "no", "rope": "none", "paged_kv": False, "fp8_static_quant": False, "skip": False,
         "store_randval": False, "trload": False, "kv64": False, "vlayout": "r", "lse": False}
PADS = ("pad_s", "pad_sk", "pad_d", "pad_dv")


def _data() -> dict:
    return load("triton_bwd")


def arch_info(arch: str) -> dict:
    return arch_table.info(arch)


def stages(arch: str, alg: dict) -> int:
    """num_stages of a backward key's pipeline on its arch's vendor."""
    vendor = arch_info(arch)["vendor"]
    return _data()["pipelines"].get(alg.get("pipeline", "bwd"), {}).get(vendor, 1)


def _vendor_has(arch: str, pipeline: str) -> bool:
    """Whether ``pipeline`` exists on ``arch``'s vendor (and, for TMA pipelines, on ``arch``)."""
    p = _data()["pipelines"].get(pipeline, {})
    info = arch_info(arch)
    return info["vendor"] in p and (not p.get("tma") or bool(info.get("tma")))


@functools.lru_cache(maxsize=None)
def _tiles(arch: str, hq: int, hv: int) -> tuple[Tile, ...]:
    fam = load("triton")["tile_family"][arch]
    dq, dv = block_d(hq), block_d(hv)
    out = []
    for m0, n0, nw in _data()["tiles"][fam]:
        # CK's 9-tuple: bm0, bn0, bk0 (S = Q K^T over hdq), bk1 (dV over bm0), bk2 (dP over hdv),
        # bk3 (dK over bm0), bk4 (dQ over bn0), bhdq, bhdv
        out.append(Tile((m0, n0, dq, m0, dv, m0, n0, dq, dv), (nw, 1, 1) * 3, (16, 16, 16) * 3, -1, 0, True))
    return tuple(out)


def domain(field: str, b: dict):
    if field == "dtype":
        return tuple(arch_info(b["arch"])["dtypes"])
    if field == "hdim":
        return tuple(tuple(h) for h in load("triton")["hdims"])
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
    if field in PADS:
        return (1, 0)
    return (False, True)


def smem_bytes(b: dict, aligned: bool = False) -> int:
    """An estimate of the shared memory (LDS) a build of backward key ``b`` takes that drops no kernel that fits on
    any of the builds measured (0.5-6.6x of their figures, mostly below); the build reads the compiled kernel's own
    figure and fails one over the arch's limit (``build_triton._over_shared``).  Measured with Triton 3.6 on CPU
    (``bench/results/2026-11-28_cpu_bwd_shared_bytes_s38.json``, ``bench/measure_bwd_shared.py``):
      - on NVIDIA, one Q and dO block -- ``stages`` of them in a build for aligned arguments (``aligned``: pipelined
        loads, TMA), which is what first use checks its aligned candidates against; the rule checks every build;
      - on sm90, K and V too where the products run on wgmma (16-bit dtypes: fp32 is computed in IEEE precision, off
        the tensor cores) or, aligned, come through TMA descriptors, and then in an aligned build of the atomic
        route the fp32 dQ partial, BLOCK_N x dq x 4 bytes;
      - on AMD, one Q and dO block: a build takes that, or the staged blocks on the atomic route."""
    t = b["tile"].tile
    e = ELEM[b["dtype"]]
    m0, n0, dq, dv = t[0], t[1], t[7], t[8]
    info = arch_info(b["arch"])
    if info["vendor"] != "nvidia":
        return m0 * (dq + dv) * e
    need = (max(1, stages(b["arch"], b)) if aligned else 1) * m0 * (dq + dv) * e
    if info["matrix"] == "wgmma" and (e == 2 or (aligned and uses_tma("triton_bwd", b["pipeline"]))):
        need += n0 * (dq + dv) * e + (n0 * dq * 4 if aligned and not b["deterministic"] else 0)
    return need


def acc_regs(b: dict) -> int:
    """fp32 registers per thread that cannot leave the register file: the dK/dV accumulators and two score-sized
    tiles (P^T and dS^T live at once).  The K/V operands may sit in shared memory; the build's resource report has
    the real count and any spills."""
    t = b["tile"]
    m0, n0, dq, dv = t.tile[0], t.tile[1], t.tile[7], t.tile[8]
    threads = t.wave[0] * arch_info(b["arch"])["warp_size"]
    return (n0 * (dq + dv) + 2 * m0 * n0) // max(1, threads)


def reg_budget(arch: str) -> int:
    """The whole per-thread register file (255 addressable registers on NVIDIA count as 256)."""
    return arch_info(arch)["max_regs_per_thread"] + 1


def _block_ok(b) -> bool:
    t = b["tile"].tile
    m0, n0 = t[0], t[1]
    return all(v >= 16 and v & (v - 1) == 0 for v in (m0, n0)) and t[7] >= b["hdim"][0] and t[8] >= b["hdim"][1]


def _warps_ok(b) -> bool:
    nw = b["tile"].wave[0]
    return nw > 0 and nw & (nw - 1) == 0 and nw <= arch_info(b["arch"])["max_warps"]


COMMON = (
    Rule("triton.bwd.dtype", ("arch", "dtype"), lambda b: b["dtype"] in arch_info(b["arch"])["dtypes"],
         lambda b: f"the triton backend has no {b['dtype']} backward kernels for {b['arch']}",
         "use fp16, bf16 or fp32", blame="dtype"),
    Rule("triton.bwd.hdim", ("hdim",), lambda b: 1 <= b["hdim"][0] <= 256 and 1 <= b["hdim"][1] <= 256,
         lambda b: f"head dims above 256 are not supported (got {b['hdim']})", "split the head dim", blame="hdim"),
)
MAIN = COMMON + (
    Rule("triton.bwd.pipeline", ("pipeline",), lambda b: b["pipeline"] in _data()["pipelines"],
         lambda b: f"the triton backward implements pipelines {', '.join(_data()['pipelines'])}, not "
                   f"{b['pipeline']}", "use pipeline(bwd_async) or pipeline(*)", blame="pipeline"),
    Rule("triton.bwd.tma", ("arch", "pipeline"),
         lambda b: not _data()["pipelines"].get(b["pipeline"], {}).get("tma") or bool(arch_info(b["arch"]).get("tma")),
         lambda b: f"pipeline {b['pipeline']} loads through TMA tensor descriptors; {b['arch']} has no TMA copy engine "
                   "(sm90 has)", "use pipeline(bwd_async) on this arch", blame="pipeline"),
    Rule("triton.bwd.num-warps", ("arch", "tile"), _warps_ok,
         lambda b: f"num_warps (wave m0 = {b['tile'].wave[0]}) must be a power of two up to "
                   f"{arch_info(b['arch'])['max_warps']}", "use wave(4, ...) or wave(8, ...)", blame="tile"),
    Rule("triton.bwd.block-shape", ("hdim", "tile"), _block_ok,
         lambda b: f"tile bm0 x bn0 = {b['tile'].tile[0]} x {b['tile'].tile[1]} must be powers of two >= 16 and "
                   f"bhdq/bhdv must cover the head dims {b['hdim']}", "use tile(*)", blame="tile"),
    Rule("triton.bwd.group-mode-padding", ("mode", "pad_s", "pad_sk"),
         lambda b: b["mode"] != "group" or (b["pad_s"] and b["pad_sk"]),
         "group mode (varlen) kernels always bounds-check seqlen_q and seqlen_k: pad_s/pad_sk false would build "
         "the same kernel as true", "use padding(true, true, *, *)", blame="mode"),
    Rule("triton.bwd.dbias", ("bias", "dbias"), lambda b: not b["dbias"] or b["bias"] == "bias",
         "dbias(true) is the gradient of an elementwise bias: it needs bias(bias)",
         "use bias(bias) with dbias(true), or dbias(false)", blame="dbias"),
    Rule("triton.bwd.same-kernel", ("mask", "sink"), lambda b: not (b["sink"] and b["mask"] == "no"),
         "sink(true) with mask(no) builds the same kernel as sink(false): sink tokens act only under a mask",
         "pair sink(true) with a mask", blame="sink", filter=True),
    Rule("triton.bwd.shared-memory", ("arch", "dtype", "pipeline", "tile"),
         lambda b: smem_bytes(b) <= arch_info(b["arch"])["shared_bytes"],
         lambda b: f"tile {b['tile'].tile[:2]} needs about {smem_bytes(b)} bytes of shared memory in any build "
                   f"(estimated); {b['arch']} has {arch_info(b['arch'])['shared_bytes']}",
         "use a smaller bm0 or bn0", blame="tile"),
    Rule("triton.bwd.registers", ("arch", "dtype", "tile"), lambda b: acc_regs(b) <= reg_budget(b["arch"]),
         lambda b: f"tile {b['tile'].tile[:2]} keeps {acc_regs(b)} fp32 values per thread on {b['tile'].wave[0]} "
                   f"warps; more than {b['arch']}'s {reg_budget(b['arch'])} registers per thread (it would spill)",
         "use a smaller bn0 or more warps", blame="tile"),
)


def ck_name(b: dict) -> str:
    t = b["tile"]
    pad = pad_token(b, (("pad_s", "s"), ("pad_sk", "sk"), ("pad_d", "d"), ("pad_dv", "dv")))
    mask = "nmask" if b["mask"] == "no" else "mask"
    bias = {"no": "nbias", "bias": "bias", "alibi": "alibi"}[b["bias"]]
    return (f"fmha_bwd_d{b['hdim'][0]}x{b['hdim'][1]}_{b['dtype']}_{b['mode']}_b{t.tile[0]}x{t.tile[1]}"
            f"_w{t.wave[0]}_{b['pipeline']}_{pad}_{tf(b['logits'], 'logits')}_{bias}_{tf(b['dbias'], 'dbias')}"
            f"_{mask}_{tf(b['dropout'], 'dropout')}_{tf(b['sink'], 'sink')}"
            f"_{tf(b['deterministic'], 'deterministic')}_triton_{b['arch']}")


def _one_d_name(b: dict) -> str:
    sig = {"family": b["family"], "dtype": b["dtype"], "mode": b["mode"], "hdim_q": b["hdim"][0],
           "hdim_v": b["hdim"][1]}
    if b["family"] == "bwd_convert_dq":
        sig["deterministic"] = b["deterministic"]
    else:
        sig.pop("hdim_q")
    return companion_name(sig, b["arch"])


def _supported(arch: str) -> str | None:
    return None if arch in arch_table.backend_archs("triton") else f"the triton backend has no target {arch}"


MAIN_FIELDS = ("dtype", "hdim", "mode", "pipeline", "tile") + PADS + ("mask", "bias", "logits", "dropout", "dbias",
                                                                     "deterministic", "sink")
_ONE_D_TILE = Tile((64, 0), (4, 1, 1), (16, 16, 16), -1, 0, True)

FAMILIES = {
    "bwd_dq_dk_dv": FamilyRules(family="bwd_dq_dk_dv", fields=MAIN_FIELDS, rules=MAIN, domain=domain,
                                ck_name=ck_name, fixed=FIXED, supported=_supported, doc=__doc__,
                                defaults={"pipeline": "bwd_async"}),
    "bwd_dot_do_o": FamilyRules(family="bwd_dot_do_o", fields=("dtype", "hdim", "mode"), rules=COMMON,
                                domain=domain, ck_name=_one_d_name, supported=_supported, doc=__doc__,
                                fixed=dict(FIXED, pipeline="dot_do_o", tile=_ONE_D_TILE)),
    "bwd_convert_dq": FamilyRules(family="bwd_convert_dq", fields=("dtype", "hdim", "mode", "deterministic"),
                                  rules=COMMON, domain=domain, ck_name=_one_d_name, supported=_supported,
                                  doc=__doc__, fixed=dict(FIXED, pipeline="convert_dq", tile=_ONE_D_TILE)),
}
