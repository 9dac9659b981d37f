"""[build] Reading a cubin's SASS with the ``cuobjdump`` Triton ships: the listing, and the instructions of its loops.

For the tests and probes that check what a template compiles to on sm90 without a GPU (a key block's instruction
count, spills, vector widths, which MMA a dot became).  The build itself reads only the resource report
(:func:`fmha_dsl.compile_triton.cuda_resources`).
"""

from __future__ import annotations

import re
import subprocess
import tempfile

__all__ = ["available", "listing", "loops"]


def available() -> bool:
    """Whether the installed Triton ships ``cuobjdump`` (its NVIDIA backend's ``bin/``)."""
    from .compile_triton import _cuobjdump

    return _cuobjdump() is not None


def listing(cubin: bytes) -> str:
    """``cuobjdump -sass`` of ``cubin`` (:func:`available` must hold)."""
    from .compile_triton import _cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_cuobjdump(), "-sass", f.name], capture_output=True, text=True, timeout=120).stdout


def loops(sass: str, mma: bool = False) -> list[list[str]]:
    """The instructions of each backward-branching loop of a SASS listing (a kernel's key-block loops), in the
    listing's order; ``mma``: only the loops that run a tensor-core MMA (``HMMA``, ``HGMMA``, ``QGMMA`` ...)."""
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    out = []
    for at, text in ins:
        m = re.search(r"BRA\b.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < at:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= at]
            if not mma or any("MMA" in t for t in body):
                out.append(body)
    return out
