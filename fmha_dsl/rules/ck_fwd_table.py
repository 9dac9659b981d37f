"""[ck_fwd] CK's forward codegen tables as the rules read them: per factory (gfx9, gfx950, gfx11, gfx12) the emitting
dtypes, each dtype's head-dim -> tile table, the pipeline rows of each (dtype, pipeline) set and the conditions under
which a row is generated, and the mask keys.  Lazy and cached lookups over ``fmha_dsl/data/ck_fwd.json`` (upstream
``fmha_fwd.py`` @014d097d, with sources); :mod:`.ck_fwd` holds the rules that use them.
"""

from __future__ import annotations

import functools

from ..data import load
from .base import pad_token
from .ck_shared import table_tile

PADS = ("pad_s", "pad_sk", "pad_d", "pad_dv")


@functools.lru_cache(maxsize=None)
def _data() -> dict:
    return load("ck_fwd")


@functools.lru_cache(maxsize=None)
def _fac(factory: str) -> dict | None:
    return _data()["factories"].get(factory)


@functools.lru_cache(maxsize=None)
def _hdim_tables(factory: str, dtype: str) -> dict:
    """(hdim_q, hdim_v) -> tuple of Tiles (get_hdim_tile_size_dict)."""
    fac = _fac(factory)
    out = {}
    for entry in (fac["tiles"].get(dtype) or []) if fac else []:
        out[tuple(entry["hdim"])] = tuple(table_tile(t) for t in entry["tiles"])
    return out


@functools.lru_cache(maxsize=None)
def _sets(factory: str, dtype: str) -> tuple:
    """The pipeline sets (one get_pipelines branch each) that list this dtype."""
    fac = _fac(factory)
    return tuple(s for s in fac["pipeline_sets"] if dtype in s["dtypes"]) if fac else ()


@functools.lru_cache(maxsize=None)
def _emitting_dtypes(factory: str) -> tuple:
    fac = _fac(factory)
    return tuple(fac["dtypes"]) if fac else ()


@functools.lru_cache(maxsize=None)
def _set_of(factory: str, dtype: str, pipeline: str) -> dict | None:
    """The pipeline set whose rows use this tag (unique per factory, dtype and tag)."""
    for s in _sets(factory, dtype):
        if any(r["pipeline"] == pipeline for r in s["rows"]):
            return s
    return None


@functools.lru_cache(maxsize=None)
def _pipelines(factory: str, dtype: str) -> tuple:
    return tuple(dict.fromkeys(r["pipeline"] for s in _sets(factory, dtype) for r in s["rows"]))


@functools.lru_cache(maxsize=None)
def _vlayouts(factory: str, dtype: str) -> tuple:
    return tuple(dict.fromkeys(r["vlayout"] for s in _sets(factory, dtype) for r in s["rows"]))


def _rows(b: dict) -> list:
    s = _set_of(b["factory"], b["dtype"], b["pipeline"])
    return [r for r in s["rows"] if r["pipeline"] == b["pipeline"]] if s else []


# ----------------------------------------------------------------------------- row guards (get_pipelines branches)
def _when(when: dict, b: dict, with_bias: bool) -> bool:
    """A row's `when` guards: the if/else around each FmhaFwdPipeline(...) append in get_pipelines."""
    hq, hv = b["hdim"]
    for key, val in when.items():
        if key == "hdim_in":                 # `if hdim == 256 and hdim_v == 256`, trload hdim list
            ok = [hq, hv] in val
        elif key == "hdim_not_in":           # the matching `else:`
            ok = [hq, hv] not in val
        elif key == "hdim_q_in":             # fp8bf16/fp8fp32: `if hdim == 64`
            ok = hq in val
        elif key == "hdim_q_not_in":
            ok = hq not in val
        elif key == "hdim_q_gt":             # mx: `if hdim > 64 and dtype in _DT_MXFP8`
            ok = hq > val
        elif key == "dtype_in":
            ok = b["dtype"] in val
        elif key == "receipt_in":            # `if receipt == 1` (profile `all`, -1, includes these rows)
            ok = b["receipt"] in val or b["receipt"] == -1
        elif key == "bias_in":               # gfx9 fp16/bf16: `if bias == "bias"` (rocm 6.2 workaround)
            ok = not with_bias or b["bias"] in val
        elif key == "bias_not_in":
            ok = not with_bias or b["bias"] not in val
        else:
            raise KeyError(f"ck_fwd.json: unknown row guard {key!r}")
        if not ok:
            return False
    return True


def _pads(b: dict) -> list:
    return [b[p] for p in PADS]


def _pad_name(pads) -> str:
    return pad_token(dict(zip(PADS, pads)), tuple(zip(PADS, ("s", "sk", "d", "dv"))))


def _row_ok(b: dict, pads: bool, bias: bool) -> bool:
    for r in _rows(b):
        if r["vlayout"] != b["vlayout"]:
            continue
        if pads and r["pads"] != _pads(b):
            continue
        if _when(r["when"], b, bias):
            return True
    return False


# ----------------------------------------------------------------------------- mask keys
def _mask_keys(b: dict) -> list:
    """Upstream mask keys of the pipeline's set: get_mask_map(mask_impl), or the set's own list (v3)."""
    s = _set_of(b["factory"], b["dtype"], b["pipeline"])
    if s is None:
        return []
    keys = s["features"]["mask"]
    return _data()["mask"]["maps"][b["mask_impl"]] if keys == "$mask_map" else keys


def _mask_key(b: dict) -> str | None:
    info = _data()["mask"]["keys"]
    return next((k for k in _mask_keys(b) if b["mask"] in info[k]["serves"]), None)
