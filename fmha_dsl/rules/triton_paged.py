"""The serving families as the Triton backend implements them (``fmha_dsl/kernels/triton_paged.py``,
``triton_appendkv.py``).

``batch_prefill`` (prefill over a paged KV cache) and ``fwd_pagedkv`` (the same with the key axis split over
programs: decode) share one template; ``fwd_appendkv`` writes new rows into the cache with RoPE.  The key's
``kv_cache(layout, lookup, page_size)`` is compiled in: the lookup picks vLLM's block table or SGLang's indptr/indices,
the page size the addressing (a key block inside one page, or one page per row).  What fits a target (shared memory,
registers, warps) is the forward family's rules (:mod:`.triton_fwd`), since the loop is the forward's; the tables are
data (``fmha_dsl/data/triton_paged.json``).

CK vocabulary -> Triton (docs/triton.md, "Serving"):
  kv_cache(linear, ...)     -> ``[num_pages, page_size, Hk, D]`` (or any layout with unit head-dim stride: strides
                               are run-time arguments)
  kv_cache(vectorized, ...) -> CK's 16-byte vectors: K ``[pages, Hk, D / x, page_size, x]``, V ``[pages, Hk,
                               page_size / x, D, x]``, x = 8 (fp16/bf16) or 4 (fp32)
  kv_cache(*, vllm|sglang)  -> ``block_table [B, W]`` | ``kv_indptr [B + 1]`` + ``kv_indices``
  kv_cache(*, *, page_size) -> PAGE_SIZE, any power of two
  pipeline qr | qr_async    -> num_stages 1 | staged pointer loads; qr_nwarp_sshuffle -> GQA heads packed in rows
  pipeline qr_async_trload  -> K/V blocks through TMA descriptors over the cache's rows (page_size >= n0, pages
                               contiguous in memory; sm90)
  max_splits_log2           -> fwd_pagedkv's split count (2 ** n, fewer when the key axis is short)
  rope(inter | half)        -> fwd_appendkv's RoPE: pairs (2i, 2i + 1) | (i, i + rotary_dim / 2)
  dtype(fp8bf16) qscale(pertensor) -> FP8: e4m3 Q and caches, per-tensor descales, bf16 output (archs listed under
                               ``fp8`` in ``data/triton_paged.json``); Q.K^T in e4m3, V widened to fp16 after its load;
                               fwd_appendkv: e4m3 caches, bf16 new rows (and q) quantized by the per-tensor descales
  dtype(fp8bf16) qscale(kv_blockscale) -> the same with CK's KV block scales: K/V descales ``[num_pages, Hk]``, one
                               per page and head, any page size (CK's kernels need page_size >= n0; these read a
                               descale per key where a block spans pages); fwd_appendkv quantizes by the row's page
  dtype(fp8bf16) qscale(per_token_head) -> CK's newest: K/V descales ``[num_pages, page_size, Hk]``, one per cached
                               token and head, and q's one per query token and head (or one); attention only
"""

from __future__ import annotations

import functools

from .. import arch as arch_table
from ..data import load
from ..kernels.fwd_abi import block_d, packs_gqa
from ..kernels.paged_abi import APPEND_QSCALES, FP8_DTYPES, FP8_QSCALES, qscales_of, vector_elems
from . import triton_fwd as fwd
from .base import FamilyRules, Rule, Tile, pad_token, tf

FIXED = {"rope": "none", "paged_kv": True, "fp8_static_quant": False, "skip": False, "dbias": False,
         "store_randval": False, "deterministic": False, "trload": False, "kv64": False, "mode": "group",
         "vlayout": "r", "dropout": False, "pad_s": 1, "pad_sk": 1}


def _data() -> dict:
    return load("triton_paged")


@functools.lru_cache(maxsize=None)
def _decode_tiles(arch: str, hq: int, hv: int) -> tuple[Tile, ...]:
    fam = load("triton")["tile_family"][arch]
    dq, dv = block_d(hq), block_d(hv)
    return tuple(Tile((m0, n0, dq, dv, n0, dq), (nw, 1, 1, nw, 1, 1, 1, 1, 1), (16, 16, 16) * 3, -1, 0, True)
                 for m0, n0, nw in _data()["decode_tiles"][fam])


def domain(field: str, b: dict):
    if field == "tile":
        if b["family"] == "fwd_pagedkv":
            return _decode_tiles(b["arch"], *b["hdim"])
        return fwd.domain("tile", b)
    if field == "pipeline":
        return tuple(_data()["pipelines"])
    if field == "mask":
        return ("no", "top_left")
    if field == "bias":
        return ("no", "alibi")
    if field == "kv_layout":
        return ("linear", "vectorized")
    if field == "kv_lookup":
        return tuple(_data()["lookups"])
    if field == "page_size":
        return tuple(_data()["page_sizes"])
    if field == "qscale":
        return ("no",) + (APPEND_QSCALES if b.get("family") == "fwd_appendkv" else FP8_QSCALES)
    return fwd.domain(field, b)


def compile_stages(b: dict) -> int:
    """``num_stages`` the compiler gets for a serving key (``arch``, ``pipeline``) so that its K/V loads are staged
    as deep as the forward's (:func:`.triton_fwd.stages` buffers).  The pointer pipelines' K/V addresses come from
    a page-table load in the same loop iteration, one level of indirection, and Triton's pipeliner
    (``AssignLatencies``) divides ``num_stages - 1`` among the levels: the forward's 3 stages gave the K/V loads
    latency 1 -- two buffers where the rule counts three.  ``2 s - 1`` stages give them the forward's latency
    ``s - 1`` and ``s`` buffers (H200, session 13: page-16 decode at batch 128 x 1k 3,159 -> 3,522 GB/s, causal
    prefill at page 1024 +22 %).  The TMA pipelines keep ``s`` (their descriptor loads take the page as a scalar
    coordinate; 3 stages measured 7 % slower), and so do AMD targets (their pipeliner is not measured here)."""
    s = fwd.stages(b)
    if s > 1 and not fwd.uses_tma(b["pipeline"]) and fwd.arch_info(b["arch"])["vendor"] == "nvidia":
        return 2 * s - 1
    return s


def smem_bytes(b: dict) -> int:
    """Shared memory of a serving key: the forward's staged K/V tiles, plus on Hopper the query tile, which its
    warpgroup dot reads from shared memory (compiled sm90 kernels hold it there; the other targets' dots take it
    from registers)."""
    t = b["tile"].tile
    if b["dtype"] in FP8_DTYPES:  # counted as fp16 (the e4m3 V tile is widened to fp16)
        b = dict(b, dtype="fp16")
    q_tile = t[0] * t[2] * fwd.ELEM[b["dtype"]] if fwd.arch_info(b["arch"])["matrix"] == "wgmma" else 0
    return fwd.smem_bytes(b) + q_tile


def _pow2(n) -> bool:
    return isinstance(n, int) and n >= 1 and n & (n - 1) == 0


def _fp8(arch: str) -> list[str]:
    """The FP8 contracts the serving templates take on ``arch`` (the table's ``fp8``)."""
    return _data()["fp8"].get(arch, [])


def _dtype_ok(b: dict) -> bool:
    return b["dtype"] in fwd.arch_info(b["arch"])["dtypes"] or b["dtype"] in _fp8(b["arch"])


def _dtype_hint(b: dict) -> str:
    fp8 = [a for a in arch_table.backend_archs("triton") if b["dtype"] in _fp8(a)]
    if fp8:
        return f"use fp16, bf16 or fp32 (FP8 serving kernels, fp8bf16, are built for {', '.join(fp8)})"
    return "use fp16, bf16 or fp32"


COMMON = (
    Rule("triton.paged.dtype", ("arch", "dtype", "family"), _dtype_ok,
         lambda b: f"the triton backend has no {b['dtype']} {b['family']} kernels for {b['arch']}",
         _dtype_hint, blame="dtype"),
    Rule("triton.paged.hdim", ("hdim",), lambda b: 1 <= b["hdim"][0] <= 256 and 1 <= b["hdim"][1] <= 256,
         lambda b: f"head dims above 256 are not supported (got {b['hdim']})", "split the head dim", blame="hdim"),
    Rule("triton.paged.page-size", ("page_size",), lambda b: _pow2(b["page_size"]),
         lambda b: f"page_size must be a positive power of two, got {b['page_size']}",
         "use kv_cache(linear, vllm, 16) (CK has 1, 16 and 1024)", blame="page_size"),
    Rule("triton.paged.vectorized-page", ("kv_layout", "dtype", "paged_kv", "page_size"), lambda b: _vector_fits_page(b),
         lambda b: f"the vectorized layout groups {vector_elems(b['dtype'])} tokens of a page into one 16-byte "
                   f"vector of V; page_size {b['page_size']} is not a multiple of {vector_elems(b['dtype'])}",
         "use kv_cache(linear, ...) for this page size, or pages of 16 or more", blame="kv_layout"),
    Rule("triton.paged.vectorized-hdim", ("kv_layout", "dtype", "hdim"),
         lambda b: b["kv_layout"] != "vectorized" or all(h % vector_elems(b["dtype"]) == 0 for h in b["hdim"]),
         lambda b: f"the vectorized layout splits the head dim into 16-byte vectors of {vector_elems(b['dtype'])}; "
                   f"head dims {b['hdim']} are not multiples", "use kv_cache(linear, ...) for this head dim",
         blame="kv_layout"),
)


def _vector_fits_page(b: dict) -> bool:
    if b["kv_layout"] != "vectorized" or not b.get("paged_kv", True):
        return True
    return b["page_size"] % vector_elems(b["dtype"]) == 0
QSCALE = Rule("triton.paged.qscale", ("family", "dtype", "qscale"),
              lambda b: b["qscale"] in qscales_of(b["dtype"], b["family"]),
              lambda b: (f"{b['dtype']} (FP8) {b['family']} kernels take "
                         + " or ".join(f"qscale({q})" for q in qscales_of(b["dtype"], b["family"]))
                         + f", not qscale({b['qscale']})")
                        if b["dtype"] in FP8_DTYPES else
                        f"qscale({b['qscale']}) scales FP8 inputs; {b['dtype']} kernels have none",
              lambda b: ("per-tensor descales: qscale(pertensor); one per page and K/V head: qscale(kv_blockscale)"
                         + ("" if b["family"] == "fwd_appendkv" else
                            "; one per token and head: qscale(per_token_head)")
                         + (" (an append quantizes by the scales attention reads; per-token ones are the caller's)"
                            if b["qscale"] == "per_token_head" else ""))
                        if b["dtype"] in FP8_DTYPES else "drop qscale, or use dtype(fp8bf16)", blame="qscale")

ATTENTION = COMMON + (
    QSCALE,
    Rule("triton.paged.pipeline", ("pipeline",), lambda b: b["pipeline"] in _data()["pipelines"],
         lambda b: f"the triton serving template implements pipelines {', '.join(_data()['pipelines'])}, not "
                   f"{b['pipeline']} (a page gather has no tensor-descriptor form)",
         "use pipeline(qr_async) or pipeline(*)", blame="pipeline"),
    Rule("triton.paged.tma", ("arch", "pipeline"), fwd._tma_ok,
         lambda b: f"pipeline {b['pipeline']} loads K and V through TMA tensor descriptors; {b['arch']} has no TMA "
                   "copy engine (sm90 has)", "use pipeline(qr_async) on this arch", blame="pipeline"),
    Rule("triton.paged.tma-page", ("pipeline", "tile", "page_size"),
         lambda b: not fwd.uses_tma(b["pipeline"]) or b["page_size"] >= b["tile"].tile[1],
         lambda b: f"pipeline {b['pipeline']} reads each key block from one page through a descriptor: page_size "
                   f"{b['page_size']} must be >= n0 = {b['tile'].tile[1]} (sm90's TMA has no gather)",
         "use pipeline(qr_async) for small pages", blame="pipeline"),
    Rule("triton.paged.tma-layout", ("pipeline", "kv_layout"),
         lambda b: not fwd.uses_tma(b["pipeline"]) or b["kv_layout"] == "linear",
         lambda b: f"pipeline {b['pipeline']} reads K/V blocks through 2-D tensor descriptors over a linear cache's "
                   f"rows; the {b['kv_layout']} layout has none", "use pipeline(qr_async) with kv_cache(vectorized, ...)",
         blame="pipeline"),
    Rule("triton.paged.bias", ("bias",), lambda b: b["bias"] != "bias",
         "the triton serving template has ALiBi but no elementwise bias (a [B, H, Sq, Sk] bias has no place in a "
         "paged cache)", "use bias(no) or bias(alibi)", blame="bias"),
    Rule("triton.paged.pack-gqa", ("pipeline", "bias"), lambda b: not packs_gqa(b["pipeline"]) or b["bias"] == "no",
         lambda b: f"pipeline {b['pipeline']} packs the query heads of a GQA group into one tile's rows; it has no "
                   "ALiBi (a slope per head)", "use pipeline(qr_async) with ALiBi", blame="pipeline"),
    Rule("triton.paged.num-warps", ("arch", "tile"), fwd._warps_ok,
         lambda b: f"num_warps (wave m0 = {b['tile'].wave[0]}) must be a power of two up to "
                   f"{fwd.arch_info(b['arch'])['max_warps']}", "use wave(4, ...)", blame="tile"),
    Rule("triton.paged.block-shape", ("hdim", "tile"), fwd._block_ok,
         lambda b: f"tile {b['tile'].tile[:4]} must be powers of two, m0/n0 >= 16, and k0/n1 must cover the "
                   f"head dims {b['hdim']}", "use tile(*)", blame="tile"),
    Rule("triton.paged.same-kernel", ("mask", "sink"), lambda b: not (b["sink"] and b["mask"] == "no"),
         "sink(true) with mask(no) builds the same kernel as sink(false): sink tokens act only under a mask",
         "pair sink(true) with a mask", blame="sink", filter=True),
    Rule("triton.paged.shared-memory", ("arch", "dtype", "pipeline", "tile"),
         lambda b: smem_bytes(b) <= fwd.arch_info(b["arch"])["shared_bytes"],
         lambda b: f"tile {b['tile'].tile[:4]} with {fwd.stages(b)} stage(s) needs {smem_bytes(b)} bytes of "
                   f"shared memory; {b['arch']} has {fwd.arch_info(b['arch'])['shared_bytes']}",
         "use a smaller n0, or pipeline(qr) (one stage)", blame="tile"),
    Rule("triton.paged.registers", ("arch", "hdim", "tile"), lambda b: fwd.acc_regs(b) <= fwd.reg_budget(b["arch"]),
         lambda b: f"tile {b['tile'].tile[:4]} keeps {fwd.acc_regs(b)} fp32 accumulators per thread on "
                   f"{b['tile'].wave[0]} warps; more than {fwd.reg_budget(b['arch'])} (it would spill)",
         "use a smaller m0 or more warps", blame="tile"),
)


def ck_name(b: dict) -> str:
    t = b["tile"]
    split = f"_s{1 << b['max_splits_log2']}" if b["family"] == "fwd_pagedkv" else ""
    pad = pad_token(b, (("pad_d", "d"), ("pad_dv", "dv")))
    qs = "" if b["qscale"] == "no" else f"_{b['qscale']}"
    return (f"fmha_{b['family']}{split}_d{b['hdim'][0]}x{b['hdim'][1]}_{b['dtype']}{qs}_b{t.tile[0]}x{t.tile[1]}"
            f"_w{t.wave[0]}_{b['pipeline']}_p{b['page_size']}_{b['kv_lookup']}_{b['kv_layout']}_{pad}"
            f"_{tf(b['logits'], 'logits')}_{'alibi' if b['bias'] == 'alibi' else 'nbias'}"
            f"_{'nmask' if b['mask'] == 'no' else 'mask'}_{tf(b['lse'], 'lse')}_{tf(b['sink'], 'sink')}"
            f"_triton_{b['arch']}")


def _append_name(b: dict) -> str:
    table = f"p{b['page_size']}_{b['kv_lookup']}_{b['kv_layout']}" if b["paged_kv"] else "contiguous"
    qs = "" if b["qscale"] == "no" else f"_{b['qscale']}"
    return (f"fmha_fwd_appendkv_d{b['hdim'][0]}x{b['hdim'][1]}_{b['dtype']}{qs}_rope{b['rope']}_{table}_triton_"
            f"{b['arch']}")


def _supported(arch: str) -> str | None:
    return None if arch in arch_table.backend_archs("triton") else f"the triton backend has no target {arch}"


def _append_domain(field: str, b: dict):
    if field == "tile":  # one program per 16 new rows of one head (the head dims padded to powers of two)
        m0, _, nw = _data()["append_tile"]
        dq, dv = block_d(b["hdim"][0]), block_d(b["hdim"][1])
        return (Tile((m0, 0, dq, dv, 0, dq), (nw, 1, 1, nw, 1, 1, 1, 1, 1), (16, 16, 16) * 3, -1, 0, True),)
    if field == "rope":
        return ("none", "inter", "half")
    if field == "paged_kv":
        return (True, False)
    return domain(field, b)


ATTN_FIELDS = ("dtype", "qscale", "hdim", "pipeline", "tile", "pad_d", "pad_dv", "mask", "bias", "logits", "lse",
               "sink", "kv_layout", "kv_lookup", "page_size")
_APPEND_RULES = COMMON + (
    QSCALE,
    Rule("triton.appendkv.rope", ("rope",), lambda b: b["rope"] in ("none", "inter", "half"),
         lambda b: f"rope must be none, inter or half, got {b['rope']}", "use rope(half) (GPT-NeoX) or rope(inter)",
         blame="rope"),
    # a contiguous cache has no table: one kernel, whatever kv_cache says (kept as linear, page 1, vllm)
    Rule("triton.appendkv.contiguous", ("paged_kv", "kv_layout", "kv_lookup", "page_size"),
         lambda b: b["paged_kv"] or (b["page_size"] == 1 and b["kv_lookup"] == "vllm" and b["kv_layout"] == "linear"),
         "paged_kv(false) (a contiguous [B, capacity, Hk, D] cache) builds one kernel whatever the table's layout, "
         "lookup and page size", "declare paged_kv(false) without kv_cache(...)", blame="paged_kv", filter=True),
)

FAMILIES = {
    "batch_prefill": FamilyRules(family="batch_prefill", fields=ATTN_FIELDS, rules=ATTENTION, domain=domain,
                                 ck_name=ck_name, fixed=FIXED, supported=_supported, doc=__doc__,
                                 defaults={"kv_layout": "linear", "pipeline": "qr_async"}),
    "fwd_pagedkv": FamilyRules(family="fwd_pagedkv", fields=ATTN_FIELDS + ("max_splits_log2",),
                               rules=ATTENTION + fwd.SPLIT_RULES, domain=domain, ck_name=ck_name, fixed=FIXED,
                               supported=_supported, doc=__doc__,
                               defaults={"kv_layout": "linear", "pipeline": "qr_async", "max_splits_log2": 4}),
    "fwd_appendkv": FamilyRules(family="fwd_appendkv", fields=("dtype", "qscale", "hdim", "tile", "rope", "paged_kv",
                                                               "kv_layout", "kv_lookup", "page_size"),
                                rules=_APPEND_RULES, domain=_append_domain, ck_name=_append_name,
                                fixed={k: v for k, v in FIXED.items() if k not in ("rope", "paged_kv")} | {
                                    "pipeline": "appendkv", "mode": "batch",
                                    "mask": "no", "bias": "no", "lse": False, "logits": False, "sink": False,
                                    "pad_d": 1, "pad_dv": 1},
                                supported=_supported, doc=__doc__, defaults={"kv_layout": "linear"}),
}
