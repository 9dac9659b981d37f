"""The native launcher: a small C extension (``native_launch.c``) compiled on first use, cached, and loaded.

    mod = native.load()              # the extension module, or raises NativeUnavailable (with the reason)
    native.driver_launch_address()   # cuLaunchKernel's address in the process's libcuda
    native.after_prior_launch_address()  # the same launch with programmatic dependent launch (native_launch.c)

Why: ``cuLaunchKernel`` through cuda-python's binding plus packing the arguments in Python costs a few
microseconds per launch; the extension converts the arguments and calls the driver in one C function
(``bench/bench_dispatch.py`` measures both).  It is built the way Triton builds its launcher stubs: with the
interpreter's C compiler (``sysconfig``'s ``CC``, else ``cc``) against the interpreter's headers, and it
includes nothing but ``Python.h`` and ``native_pack.h`` (the driver entry point's address comes from the loaded libcuda).

The shared object lives at ``<cache>/native/<key>/_fmha_native<EXT_SUFFIX>`` where ``key`` hashes the C
sources, the interpreter (cache tag, ABI suffix, platform) and the compiler command (:mod:`.cext`); it is compiled into a
temporary file and renamed into place, so concurrent first uses and interrupted builds are safe.

Not available (no compiler, no headers, ``FMHA_DSL_NATIVE_LAUNCH=0``): :func:`load` raises
:class:`NativeUnavailable` with the reason; the default launcher then falls back to cuda-python
(:func:`fmha_dsl.runtime.cuda.load_cubin`), and ``launcher="native"`` given explicitly is an error.
Nothing happens at import time.
"""

from __future__ import annotations

import threading

from fmha_dsl import knobs

from . import cext
from .cext import NativeUnavailable

MODULE = "_fmha_native"
SOURCES = ("native_launch.c", "native_pack.h")
_LOCK = threading.Lock()
_STATE: dict = {}  # "module" | "error" | "cuda_launch" | "after_prior"


def _source() -> bytes:
    return cext.read_sources(SOURCES)


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC``, else the interpreter's (sysconfig), else ``cc``/``gcc``; None if absent."""
    return cext.find_compiler("CC", "CC", ("cc", "gcc"))


def library_path() -> tuple[str, list[str]]:
    """Where the shared object for this interpreter lives (it may not exist yet), and the compiler command."""
    cc = compiler()
    if cc is None:
        raise NativeUnavailable("no C compiler found (set CC, or install gcc/clang)")
    return cext.library_path(MODULE, [_source(), " ".join(cc)]), cc


def build(path: str, cc: list[str]) -> None:
    """Compile ``native_launch.c`` to ``path`` (atomically: a temporary file renamed into place)."""
    include = cext.python_include()
    cmd = [*cc, "-O2", "-shared", "-fPIC", "-Wall", f"-I{include}", f"-I{cext.HERE}",
           cext.source_path("native_launch.c")]
    cext.compile_atomic(cmd, path, "the native launcher", timeout=120)


def load():
    """The compiled extension module (built on first use); raises :class:`NativeUnavailable` with the reason."""
    return cext.load_once(_STATE, _LOCK, knobs.NATIVE_LAUNCH, MODULE, "the native launcher", library_path, build)


def available() -> tuple[bool, str]:
    """``(True, path)`` when the native launcher loads here, else ``(False, reason)``."""
    return cext.available(load)


def driver_launch_address() -> int:
    """The address of ``cuLaunchKernel`` in the process's NVIDIA driver library (the one torch loaded)."""
    addr = _STATE.get("cuda_launch")
    if not addr:
        addr = _STATE["cuda_launch"] = _driver_symbol("cuLaunchKernel")
    return addr


def after_prior_launch_address() -> int:
    """The address of the extension's programmatic dependent launch (``cuLaunchKernel``'s signature, through
    ``cuLaunchKernelEx``; see native_launch.c): a kernel launched with it may overlap the end of the one before it
    in the stream, and waits for that one's writes in the kernel (``griddepcontrol.wait``)."""
    addr = _STATE.get("after_prior")
    if not addr:
        addr = _STATE["after_prior"] = load().after_prior_address(_driver_symbol("cuLaunchKernelEx"))
    return addr


def _driver_symbol(name: str) -> int:
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise NativeUnavailable(f"libcuda.so.1 could not be loaded: {exc}") from None
    try:
        addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError:
        addr = None
    if not addr:
        raise NativeUnavailable(f"libcuda.so.1 has no {name}")
    return addr


def kinds(types) -> bytes:
    """The extension's per-parameter codes for Triton signature types (pointers -> ``p``)."""
    from .abi import code_of

    return "".join("p" if t.startswith("*") else code_of(t)[0] for t in types).encode()


__all__ = ["NativeUnavailable", "load", "available", "build", "library_path", "compiler", "driver_launch_address",
           "after_prior_launch_address", "kinds"]
