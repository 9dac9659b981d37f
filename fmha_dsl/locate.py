"""Where the shipped folders are (``grammar/``, ``kernelsets/``).

The wheel installs the source tree's top-level folders as subpackages (``fmha_dsl.grammar``,
``fmha_dsl.kernelsets``: pyproject's ``package-dir``).  A source checkout on ``sys.path`` (``python -m
fmha_dsl.cli`` or ``python bench/...`` from the repository root) has no such subpackages: the folders sit
next to the package there.
"""

from __future__ import annotations

import pathlib
from importlib import resources


def folder(name: str):
    """The shipped folder ``name`` as a Traversable: the installed subpackage ``fmha_dsl.<name>``, else the
    source checkout's top-level ``<name>/`` folder."""
    try:
        return resources.files(f"fmha_dsl.{name}")
    except ModuleNotFoundError:
        top = pathlib.Path(__file__).resolve().parent.parent / name
        if top.is_dir():
            return top
        raise


__all__ = ["folder"]
