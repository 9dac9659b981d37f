"""Packaged data: CK's arch specs and the per-operation tile tables (each entry names its source)."""

from __future__ import annotations

import functools
import json
from importlib import resources


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict:
    """Load ``fmha_dsl/data/<name>.json`` once per process."""
    return json.loads(resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8"))


def uses_tma(table: str, pipeline: str | None) -> bool:
    """Whether ``pipeline`` of the pipeline table ``table`` (``triton``: forward and serving, ``triton_bwd``: the
    backward) goes through the TMA copy engine (the table's ``tma`` flag)."""
    return bool(load(table)["pipelines"].get(pipeline or "", {}).get("tma"))
