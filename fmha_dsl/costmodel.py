"""[select] The cost model: a unit-less time estimate of a kernel on a problem, from its tile, the device's compute
units and the build's resource report -- what ranks kernels nothing has measured (seqtune tables rank the measured
ones, first-use selection times its candidates), and the split count a split-KV launch uses.

Pure Python; reads the arch table (:mod:`fmha_dsl.arch`) and an entry's ``build["resources"]``.
"""

from __future__ import annotations

import functools

from .data import uses_tma
from .kernels.fwd_abi import packs_gqa


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def programs(seqlen_q: int, m0: int, nhead_q: int, batch: int) -> int:
    return _cdiv(max(seqlen_q, 1), m0) * nhead_q * batch


def waves(nprog: int, slots: int) -> int:
    return max(1, _cdiv(nprog, max(1, slots)))


def split_limit(entry) -> int:
    """The split count a split-KV kernel runs with (0 for other kernels)."""
    if entry.sig.get("family") not in ("fwd_splitkv", "fwd_pagedkv"):
        return 0
    b = getattr(entry, "build", None) or {}
    return int(b.get("splits") or 1 << int(entry.alg["max_splits_log2"]))


SPLIT_WAVES = 4   # a split-KV launch takes at most twice the splits that fill this many waves of one program per CU
SPLIT_SETUP = 1   # key blocks' worth of time a program spends outside its loop (Q, pipeline fill, partial store)


def splits_at(limit: int, seqlen_k: int, n0: int, nprog: int, cus: int, occupancy: int = 1) -> int:
    """Splits a split-KV launch uses (1 for other kernels: ``limit`` 0): the count with the shortest critical path
    -- waves of programs over the device's ``cus x occupancy`` slots (``occupancy``: programs resident per CU) times
    the key blocks a program runs plus :data:`SPLIT_SETUP` -- and the fewest splits within 5 % of it (each split
    writes and the combine reads back its partial rows).  At most the kernel's ``limit``, the key blocks
    ``ceil(seqlen_k / n0)`` and twice the count whose ``nprog`` programs per split fill :data:`SPLIT_WAVES` waves of
    one program per CU (the workspace bounds rely on that).  So 64 programs of 128 key blocks on 132 SMs with two
    resident each split 4 ways (one full wave of 32 blocks each, as FlashAttention's heuristic), not 10 (2.4 waves).
    The runtime (``fmha_dsl.runtime.plan.SplitLaunch``), the torch fast path's replay and the cost model use this."""
    if not limit:
        return 1
    blocks = _cdiv(max(seqlen_k, 1), n0)
    nprog, cus = max(int(nprog), 1), max(int(cus), 1)
    most = min(int(limit), blocks, 2 * _cdiv(SPLIT_WAVES * cus, nprog))
    return _least_path(max(most, 1), blocks, nprog, cus * max(int(occupancy), 1))


@functools.lru_cache(maxsize=4096)
def _least_path(most: int, blocks: int, nprog: int, slots: int) -> int:
    def path(s: int) -> int:
        per = _cdiv(blocks, s)
        return _cdiv(nprog * _cdiv(blocks, per), slots) * (per + SPLIT_SETUP)  # waves of non-empty programs

    paths = [path(s) for s in range(1, most + 1)]
    least = min(paths)
    return next(s for s, p in enumerate(paths, 1) if p * 20 <= least * 21)


def arch_info(arch: str) -> dict:
    from .arch import get

    return get(arch)


def compute_units(arch: str | None, table=None) -> int:
    """The device's compute units: a seqtune table's measured device, else the arch table's (100 unknown)."""
    if table is not None and table.device.get("compute_units"):
        return int(table.device["compute_units"])
    return int(arch_info(arch).get("compute_units", 100)) if arch else 100


def occupancy(entry, arch: str | None) -> int:
    """Programs resident per SM/CU from the build's resource usage (1 when unknown).

    NVIDIA: min over registers (65536 per SM / (regs x threads)), shared memory (the arch's per-block limit taken as
    the per-SM budget / the kernel's ``shared``) and threads (2048 per SM).  AMD: the ``; Occupancy:`` note (waves
    per SIMD) x 4 SIMDs / warps per program.
    """
    b = getattr(entry, "build", None) or {}
    if not b:
        return 1
    res = b.get("resources") or {}
    warps = int(b.get("num_warps") or entry.alg["wave"][0] or 4)
    info = arch_info(arch) if arch else {}
    if info.get("vendor") == "amd" or (arch or "").startswith("gfx"):
        occ = res.get("occupancy")
        return max(1, (int(occ) * 4) // warps) if occ else 1
    threads = warps * int(b.get("warp_size") or 32)
    limits = [2048 // threads]
    if res.get("regs"):
        limits.append(65536 // (int(res["regs"]) * threads))
    if b.get("shared"):
        limits.append(int(info.get("shared_bytes", 232448)) // max(1, int(b["shared"])))
    return max(1, min(limits))


# FLOP-equivalents a K/V element load costs against one multiply-add: the heuristic load/math balance of a tile
LOAD_COST = 16.0
# Multiply-adds one fp32 atomic add of the backward's dQ costs: by the compute warps (``red.global``, a
# read-modify-write in L2 per element), or by the copy engine's bulk reduction of the whole tile from shared memory
# (the TMA pipelines).  The values that order the H100's and H200's measured backward tables best
# (bench/probe_candidate_order.py; tests/test_runtime.py checks the cut against them).
ATOMIC_COST = 512.0
BULK_REDUCE_COST = 128.0
# Rows of the key block a warp's MMA needs to keep its lanes busy (sm80 mma.sync and sm90 wgmma: 16 rows a warp; AMD
# MFMA: 16 or 32): the backward's products take the key block as their M side
ROWS_PER_WARP = 16
# The forward's score tile per thread (BLOCK_M x BLOCK_N fp32 over the program's threads) beyond SCORE_REGS
# registers costs efficiency: SCORE_PRESSURE per further SCORE_REGS with pointer loads (whose addresses take
# registers too), SCORE_PRESSURE_TMA with the TMA pipelines.  Fitted on the H100's and H200's measured forward
# tables (bench/probe_candidate_order.py): 128 x 128 on 8 warps and 64 x 128 on 4 had been ranked first and ran at
# 1.1-2.0x the best.  Fitted on sm90 (wgmma) only: the other families and targets are left as they were.
SCORE_REGS = 32
SCORE_PRESSURE = 0.25
SCORE_PRESSURE_TMA = 0.10
# fp32 problems run their products in IEEE precision, on NVIDIA targets on the FMA units: both products' operands (Q
# and K, P and V) and the accumulator are held in registers, (m0 + n0) x (Dq + Dv) + m0 x n0 fp32 values over the
# program's threads.  Beyond FP32_REGS per thread a tile loses FP32_PRESSURE of its efficiency per further FP32_REGS.
# Measured on an H200 over every candidate (bench/probe_flag_cut.py): most tiles past about 190 ran 6-40x slower
# than the best, and the cost model without this term put them first (fp32 d128 causal: the first 12 candidates
# lost 5.9x, the first 16 1.6x; fp32 d64: the first 24 lost 31 %).  Fitted on two classes, checked on two more.
FP32_REGS = 128
FP32_PRESSURE = 1.0


def cost(entry, p, arch: str | None, cus: int | None = None) -> tuple[float, dict]:
    """A unit-less time estimate of ``entry`` on problem ``p`` (smaller is faster) and its components.

    ``cost = rounds x work_per_program / (efficiency x hiding)`` with

    * tile waste from padding: the work per program uses the padded lengths ``m0`` x ``ceil(sk/n0)*n0`` (the query
      tile waste ``ceil(sq/m0)*m0/sq`` enters through the number of programs; causal: about half the keys);
    * waves over the compute units: ``programs = ceil(sq/m0) x nhead_q x batch`` run in
      ``waves = ceil(programs / (CUs x occupancy))``; a full wave of ``occupancy`` co-resident programs per SM takes
      ``occupancy`` program-times, the partial last one ``ceil(remainder / CUs)``: ``rounds`` is their sum, so a
      partial wave costs as much as its most loaded SM;
    * occupancy (:func:`occupancy`, from the build's resource usage) hides latency: ``hiding = 1 - 0.25 / occupancy``;
    * efficiency ``m0 n0 / (m0 n0 + LOAD_COST (m0 + n0))``: larger tiles reuse each loaded element more (on
      wgmma targets less so where the score tile crowds the registers: :data:`SCORE_REGS`; fp32 on NVIDIA less so
      where the operands of its FMA products do: :data:`FP32_REGS`);
    * split-KV kernels (:func:`splits_at` splits): ``splits`` times the programs, each with ``1/splits`` of the key
      blocks, plus the combine pass: ``2 LOAD_COST splits x padded rows x Dv x heads x batch / CUs`` (the fp32
      partials written and read back).

    The backward (``bwd_dq_dk_dv``) runs one program per key block and K/V head over the query blocks that see it
    (causal: about half; a window: those in its reach, and every one for the sink's key block): per pair of
    blocks its five products, plus -- deterministic dQ -- the two that its dQ programs compute again, or -- atomic dQ
    -- ``ATOMIC_COST`` per fp32 atomic add of dQ's partial (``BULK_REDUCE_COST`` where the copy engine adds it); its
    efficiency also falls where a warp gets fewer than ``ROWS_PER_WARP`` rows of the key block.
    """
    a = entry.alg
    m0, n0 = max(1, int(a["tile"][0])), max(1, int(a["tile"][1]))  # (append-KV: no key block)
    sq = max(int(p.max_seqlen_q or p.seqlen_q), 1)
    sk = max(int(p.max_seqlen_k or p.seqlen_k), 1)
    cus = cus or compute_units(arch)
    occ = occupancy(entry, arch)
    if entry.sig.get("family") == "bwd_dq_dk_dv":  # one program per key block and K/V head, over every query row
        g = max(1, p.nhead_q // max(p.nhead_k, 1))
        nprog = programs(sk, n0, p.nhead_k, p.batch)
        pair = n0 * m0 * (2 * p.hdim_q + 3 * p.hdim_v)   # the five products of one (key block, query block) pair
        if entry.sig.get("deterministic"):  # dQ by its own programs: S and dP computed again, no atomics
            pair += n0 * m0 * (p.hdim_q + p.hdim_v)
        else:  # dQ's m0 x hdim_q partial added to the fp32 workspace by atomics
            bulk = uses_tma("triton_bwd", a.get("pipeline"))  # the TMA pipeline: the copy engine's bulk reduction
            pair += (BULK_REDUCE_COST if bulk else ATOMIC_COST) * m0 * p.hdim_q
        blocks = _cdiv(sq, m0)
        if p.mask != "no":  # causal: half the query blocks, plus the diagonal's; a window: those in its reach
            causal = blocks * (0.5 + 0.5 * min(1.0, n0 / sk))
            reach = min(causal, window_blocks(p, n0, m0))
            nkb = _cdiv(sk, n0)
            if p.sink and reach < causal and nkb > 1:  # the sink's key block is seen by every row after it
                reach = (reach * (nkb - 1) + blocks) / nkb
            blocks = reach
        work = blocks * g * pair
        eff = (m0 * n0) / (m0 * n0 + LOAD_COST * (m0 + n0)) * min(1.0, n0 / _warps(a) / ROWS_PER_WARP)
        full, rem = divmod(nprog, cus * occ)
        rounds = full * occ + _cdiv(rem, cus)
        return rounds * work / (eff * (1.0 - 0.25 / occ)), {"programs": nprog, "rounds": rounds, "occupancy": occ,
                                                             "efficiency": round(eff, 4)}
    g = max(1, p.nhead_q // max(p.nhead_k, 1)) if packs_gqa(a.get("pipeline", "")) else 1
    nprog = programs(sq * g, m0, p.nhead_q // g, p.batch)  # GQA-packed rows: one program per K/V head
    ns = splits_at(split_limit(entry), sk, n0, nprog, cus, occ)
    nprog *= ns
    w = waves(nprog, cus * occ)
    sk_pad = _cdiv(_cdiv(sk, n0), ns) * n0   # keys per program (split-KV: per split)
    keys = sk_pad
    if p.mask != "no":
        keys *= 0.5 + 0.5 * min(1.0, m0 / sq)   # causal: half the keys, plus the diagonal tile
        # a window: the key blocks in reach of the block's rows (a decode's few), shared by the splits; the sink
        # block is the first split's
        reach = window_blocks(p, _cdiv(min(m0, sq * g), g), n0)   # (GQA-packed rows: g to a query position)
        if reach < _cdiv(sk, n0):
            keys = min(keys, (_cdiv(int(reach), ns) + p.sink) * n0)
    work = m0 * keys * (p.hdim_q + p.hdim_v)
    eff = (m0 * n0) / (m0 * n0 + LOAD_COST * (m0 + n0)) / _register_pressure(entry, p, arch, m0, n0)
    full, rem = divmod(nprog, cus * occ)
    rounds = full * occ + _cdiv(rem, cus)
    c = rounds * work / (eff * (1.0 - 0.25 / occ))
    if split_limit(entry):  # the combine pass: write and read back splits x rows x Dv fp32 partials
        c += LOAD_COST * 2 * ns * _cdiv(sq, m0) * m0 * p.hdim_v * p.nhead_q * p.batch / cus
    return c, {"waves": w, "rounds": rounds, "programs": nprog, "occupancy": occ, "splits": ns,
               "tile_waste_q": _cdiv(sq, m0) * m0 / sq,
               "tile_waste_k": sk_pad / sk, "efficiency": round(eff, 4)}


def window_blocks(p, rows: int, block: int) -> float:
    """The blocks of ``block`` keys (forward: the key blocks of ``rows`` query rows) or query rows (backward: the
    query blocks that see a key block of ``rows`` keys) that a bounded window leaves in reach, at most one more for
    an edge off the block grid; infinite when either side of ``p``'s window is unbounded (a causal mask alone).  A
    sliding window of 512 keys makes a 128-row program visit 5-6 key blocks of 128, whatever the length."""
    wl, wr = int(p.window_left), int(p.window_right)
    if wl < 0 or wr < 0:
        return float("inf")
    return float(_cdiv(rows + wl + wr, block) + (1 if (wl + wr) % block else 0))


def forward_fitted(arch: str | None) -> bool:
    """Whether the forward's ranking was fitted to measurements on ``arch`` (wgmma targets: :data:`SCORE_REGS`)."""
    return bool(arch) and arch_info(arch).get("matrix") == "wgmma"


def fma_products(dtype: str, arch: str | None) -> bool:
    """Whether a problem of ``dtype`` runs its products on the FMA units of ``arch`` (fp32, computed in IEEE
    precision, on NVIDIA targets): its ranking weighs the registers its operands take (:data:`FP32_REGS`) and puts
    single-stage loads among the pipelined ones, not after them."""
    return dtype == "fp32" and bool(arch) and arch_info(arch).get("vendor") == "nvidia"


def _warps(alg: dict) -> int:
    return max(1, int(alg["wave"][0]) if alg.get("wave") else 4)


def _register_pressure(entry, p, arch: str | None, m0: int, n0: int) -> float:
    """How much slower a forward tile runs for the registers it holds (1.0: not at all): its score tile on wgmma
    targets (:data:`SCORE_REGS`), and for fp32 on NVIDIA the operands of its FMA products (:data:`FP32_REGS`)."""
    a = entry.alg
    scores, fma = forward_fitted(arch), fma_products(p.dtype, arch)
    if entry.sig.get("family") not in ("fwd", "fwd_splitkv") or not (scores or fma):
        return 1.0
    threads = _warps(a) * int(arch_info(arch).get("warp_size", 32))
    slower = 1.0
    if scores:
        over = max(0.0, m0 * n0 / threads / SCORE_REGS - 1.0)
        slower *= 1.0 + (SCORE_PRESSURE_TMA if uses_tma("triton", a.get("pipeline")) else SCORE_PRESSURE) * over
    if fma:
        held = ((m0 + n0) * (p.hdim_q + p.hdim_v) + m0 * n0) / threads
        slower *= 1.0 + FP32_PRESSURE * max(0.0, held / FP32_REGS - 1.0)
    return slower


__all__ = ["cost", "window_blocks", "forward_fitted", "fma_products", "occupancy", "compute_units", "programs", "waves",
           "split_limit", "splits_at",
           "LOAD_COST", "ATOMIC_COST", "BULK_REDUCE_COST", "ROWS_PER_WARP", "SCORE_REGS", "SCORE_PRESSURE",
           "SCORE_PRESSURE_TMA", "FP32_REGS", "FP32_PRESSURE", "SPLIT_WAVES", "SPLIT_SETUP"]
