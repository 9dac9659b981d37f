"""CK backward's codegen tables as the rules of :mod:`.ck_bwd` read them: per factory and
dtype the head dims, the dq_dk_dv tiles (with their tr_load flag) and the convert_dq tiles, the 1-d kernels' tile, and
each field's domain.  Lazy lookups over ``fmha_dsl/data/ck_bwd.json`` (upstream ``fmha_bwd.py`` @1d30ef29).
"""

from __future__ import annotations

import functools

from .. import data
from .base import Tile
from .ck_shared import mask_domain

DOT, DQ, CONVERT = "bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"
M0_1D = 64           # fmha_bwd.py M0_1D: block size (bm0) of the 1-d dot/convert kernels
ONE_D_OCCUPANCY = 2  # FmhaBwdApiTrait.dot_do_o_kernel / convert_dq_kernel: get_occupancy() returns 2
_BOOLS = (False, True)


# ---------------------------------------------------------------- data (loaded on first use)

def _d() -> dict:
    return data.load("ck_bwd")


@functools.lru_cache(maxsize=None)
def _table(factory: str) -> dict:
    """{dtype: ((Tile, trload), ...)} of a factory; {} for targets get_factory rejects."""
    rows = _d()["tiles"].get(factory) if factory in _d()["factories"] else None
    out = {}
    for dtype, tiles in (rows or {}).items():
        entries = []
        for r in tiles:
            t, w = r["tile9"], r["warp6"]
            # FMHA_BWD_DQ_DK_DV_KERNEL_BODY: gemm4 warp tile = (wm0, wn0, min(wk0, bk4))
            warp9 = tuple(w) + (w[0], w[1], min(w[2], t[6]))
            entries.append((Tile(tuple(t), tuple(r["wave9"]), warp9, block_per_cu=r["occupancy"],
                                 max_seq_len_q=r["maxq"]), r["trload"]))
        out[dtype] = tuple(entries)
    return out


@functools.lru_cache(maxsize=None)
def _dq_tiles(factory: str, dtype: str, hdim: tuple) -> tuple:
    # hdim = (bhdq, bhdv) of the tile (get_bwd_blobs: hdim = tile.F_bhdq)
    return tuple(t for t, _ in _table(factory).get(dtype, ()) if (t.tile[7], t.tile[8]) == hdim)


@functools.lru_cache(maxsize=None)
def _hdims(factory: str, dtype: str) -> tuple:
    return tuple(dict.fromkeys((t.tile[7], t.tile[8]) for t, _ in _table(factory).get(dtype, ())))


@functools.lru_cache(maxsize=None)
def _trload_of(factory: str, dtype: str) -> dict:
    """Table tile -> the tr_load list upstream lists it in."""
    return {t: tr for t, tr in _table(factory).get(dtype, ())}


@functools.lru_cache(maxsize=None)
def _has_trload_tiles(factory: str, dtype: str) -> bool:
    return any(tr for _, tr in _table(factory).get(dtype, ()))


@functools.lru_cache(maxsize=None)
def _convert_tiles(factory: str, dtype: str, hdim: tuple) -> tuple:
    # FmhaBwdApiTrait.convert_dq_bn0: the dq_dk_dv tile's bn0 when deterministic, else 0;
    # convert_dq is disabled for max_seq_q tiles
    bn0s = sorted({0} | {t.tile[1] for t in _dq_tiles(factory, dtype, hdim) if t.max_seq_len_q == 0})
    return tuple(_one_d_tile(bn0) for bn0 in bn0s)


def _one_d_tile(bn0: int) -> Tile:
    # 1-d kernels: b{M0_1D}[x{bn0}], occupancy 2; no wave/warp (CK's defaults stand in)
    return Tile((M0_1D, bn0, 0, 0, 0, 0), (1,) * 9, (16,) * 9, block_per_cu=ONE_D_OCCUPANCY)


DOT_TILE = _one_d_tile(0)


def _suffix(b) -> str:
    return _d()["factories"][b["factory"]]["arch_suffix"]


# ---------------------------------------------------------------- domains

def _trload_domain(b):
    # a table tile comes from one get_dq_dk_dv_tiles(dtype, tr_load) list; explicit tiles: both
    if not _has_trload_tiles(b["factory"], b["dtype"]):
        return (False,)
    t = b["tile"]
    tr = _trload_of(b["factory"], b["dtype"]).get(t) if t.from_table else None
    return _BOOLS if tr is None else (tr,)


def domain(field: str, b: dict):
    if field == "dtype":
        return tuple(_table(b["factory"]))
    if field == "hdim":
        return _hdims(b["factory"], b["dtype"])
    if field == "mode":
        return ("batch", "group")
    if field == "tile":
        if b["family"] == CONVERT:
            return _convert_tiles(b["factory"], b["dtype"], b["hdim"])
        return _dq_tiles(b["factory"], b["dtype"], b["hdim"])
    if field in ("pad_d", "pad_dv"):
        return tuple(_d()["pads"]["dq_dk_dv" if b["family"] == DQ else "one_d"])
    if field == "pad_s":
        return tuple(_d()["pads"]["one_d"])
    if field == "mask":
        return mask_domain(b["mask_impl"])
    if field == "bias":
        return ("no", "bias", "alibi")
    if field == "trload":
        return _trload_domain(b)
    return _BOOLS   # dropout, store_randval, dbias, deterministic
