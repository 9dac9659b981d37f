"""[build] A registry -> a build directory.

Layout of a build directory (the compile backends of the next stage fill ``kernels/``)::

    DIR/registry.json              the registry (schema: `fmha-dsl schema registry`)
    DIR/kernels/<arch>/<name>.*    one binary per kernel (hsaco / cubin), named by its CK name
                                   and referenced from its registry entry's ``build`` object

With ``backend="none"`` only the registry is written: expansion and validation, no compilation.
"""

from __future__ import annotations

import os

from .errors import UsageError, error
from .registry import Registry

BACKENDS = ("none",)


def build_registry(reg: Registry, out_dir: str | os.PathLike, backend: str = "none") -> str:
    """Write ``out_dir/registry.json`` atomically and return its path."""
    if backend not in BACKENDS:
        raise error("usage.backend", f"unknown backend `{backend}`", None, f"one of: {', '.join(BACKENDS)}",
                    cls=UsageError)
    out = os.fspath(out_dir)
    if os.path.exists(out) and not os.path.isdir(out):
        raise error("usage.output", f"`{out}` exists and is not a directory", None,
                    "pass a directory with -o", cls=UsageError)
    path = os.path.join(out, "registry.json")
    reg.save(path)
    return path
