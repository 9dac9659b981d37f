"""[expand] The tiles a declaration asks for: explicit tile setters (CK's defaults and auto-fill for unset dims), the
table tiles a partly wild ``tile(...)`` keeps, and the hint naming what the table offers when it keeps none.  Used by
:mod:`fmha_dsl.expand`; pure."""

from __future__ import annotations

import itertools

from . import vocab as V
from .declare import Declaration
from .rules.base import Tile


def _explicit_tiles(decl: Declaration) -> tuple[Tile, ...]:
    """The tiles explicit setters ask for (one per combination of alternatives, e.g. ``tile_m0(64 | 128)``),
    with CK's defaults for unset dims and CK's auto_fill (n1 <- n0, k1 <- k0, k0max <- k0 when <= 0)."""
    d = decl.tile.dims
    n = decl.tile.tile_len
    base = list(V.TILE_DEFAULT) + [0, 0, 0]
    nt = max(n, 6)
    keys = ([f"tile{i}" for i in range(nt)] + [f"wave{i}" for i in range(9)] + [f"warp{i}" for i in range(9)]
            + ["block_per_cu", "max_seq_len_q"])
    defaults = base[:nt] + list(V.WAVE_DEFAULT) + list(V.WARP_DEFAULT) + [-1, 0]
    out = []
    for combo in itertools.product(*[d[k] if d.get(k) else (dflt,) for k, dflt in zip(keys, defaults)]):
        t = list(combo[:nt])
        if t[3] <= 0:
            t[3] = t[1]
        if t[4] <= 0:
            t[4] = t[2]
        if t[5] <= 0:
            t[5] = t[2]
        out.append(Tile(tuple(t), tuple(combo[nt:nt + 9]), tuple(combo[nt + 9:nt + 18]), combo[nt + 18],
                        combo[nt + 19], from_table=False))
    return tuple(dict.fromkeys(out))


def _tile_candidates(decl: Declaration, explicit_tiles, missed: dict):
    """The tiles a partly wild ``tile(...)`` leaves of the table; ``missed`` collects, per (arch, hdim), what the
    table offers for the declared dims when it leaves none (the ``decl.empty`` hint names them)."""
    dims = {k: v for k, v in decl.tile.dims.items() if v is not None}

    def cands(fr, b):
        if explicit_tiles is not None:
            return explicit_tiles
        table = fr.domain("tile", b)
        got = [t for t in table if all(t.dim(k) in vals for k, vals in dims.items())]
        if not got and table:
            where = (b.get("arch"), b.get("hdim"))
            if where not in missed:
                missed[where] = (tuple(dims), sorted({tuple(t.dim(k) for k in dims) for t in table}))
        return got

    return cands


def _dim_name(key: str) -> str:
    """A Tile.dim key as the user writes it: ``tile1`` -> ``n0``, ``wave0`` -> ``wave_m0``."""
    kind, idx = key[:4], key[4:]
    if not idx.isdigit():
        return key
    i = int(idx)
    if kind == "tile":
        full = V.TILE_NAMES + ("t6", "t7", "t8")  # tile(...)'s positions (9 for bwd_dq_dk_dv)
        return full[i] if i < len(full) else key
    if kind in ("wave", "warp") and i < len(V.WAVE_NAMES):
        return f"{kind}_{V.WAVE_NAMES[i]}"
    return key


def _missed_tiles_hint(missed: dict) -> str:
    (arch, hdim), (keys, offered) = next(iter(missed.items()))
    names = [_dim_name(k) for k in keys]
    shown = ", ".join("(" + ", ".join(str(x) for x in o) + ")" for o in offered[:12])
    more = f" and {len(offered) - 12} more" if len(offered) > 12 else ""
    hd = f" hdim{tuple(hdim)}" if isinstance(hdim, (tuple, list)) else ""
    return (f"no tile of the {arch}{hd} tile table has the declared {'/'.join(names)}; the table has "
            f"({', '.join(names)}) in {shown}{more}: pick one of those, or `*`")
