"""[declare] What a declaration is: per-field constraints (:class:`FieldSpec`), the tile settings
(:class:`TileSpec`) and the :class:`Declaration` that :mod:`fmha_dsl.declare` builds and :mod:`fmha_dsl.expand`
expands.  Plain frozen data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .errors import Span

WILD = "*"


@dataclass(frozen=True)
class FieldSpec:
    values: tuple | None            # None = wildcard
    span: Span | None
    match: Callable[[Any], bool] | None = None   # narrows a wildcard (partial tuples)
    explicit: bool = True           # False for defaults


@dataclass(frozen=True)
class TileSpec:
    """Tile / wave / warp / occupancy / max_seq_len_q settings of one declaration.

    ``dims`` maps ``tile[i]``, ``wave[i]``, ``warp[i]``, ``block_per_cu``, ``max_seq_len_q`` to a
    tuple of allowed values, or WILD.  ``wild`` is true when any dim is a wildcard: the tile
    then comes from the arch's tile tables, narrowed by the explicit dims.
    """

    dims: dict
    spans: dict
    wild: bool
    tile_len: int


@dataclass(frozen=True)
class Declaration:
    set_name: str
    name: str | None
    index: int                       # position of the declaration in its set
    fields: dict                     # field -> FieldSpec
    tile: TileSpec
    archs: FieldSpec
    profile: FieldSpec
    mask_impl: str
    backend: str
    wheres: tuple
    span: Span
    path: str | None
    display: str | None = None       # path shown in registries: relative to the top-level file

    @property
    def label(self) -> str:
        return self.name or f"{self.set_name}#{self.index}"
