"""The native launcher: a small C extension (``native_launch.c``) compiled on first use, cached, and loaded.

    mod = native.load()              # the extension module, or raises NativeUnavailable (with the reason)
    native.driver_launch_address()   # cuLaunchKernel's address in the process's libcuda

Why: ``cuLaunchKernel`` through cuda-python's binding plus packing the arguments in Python costs a few
microseconds per launch; the extension converts the arguments and calls the driver in one C function
(``bench/bench_dispatch.py`` measures both).  It is built the way Triton builds its launcher stubs: with the
interpreter's C compiler (``sysconfig``'s ``CC``, else ``cc``) against the interpreter's headers, and it
includes nothing but ``Python.h`` (the driver entry point's address comes from the loaded libcuda).

The shared object lives at ``<cache>/native/<key>/_fmha_native<EXT_SUFFIX>`` where ``key`` hashes the C
source, the interpreter (cache tag, ABI suffix, platform) and the compiler command; it is compiled into a
temporary file and renamed into place, so concurrent first uses and interrupted builds are safe.

Not available (no compiler, no headers, ``FMHA_DSL_NATIVE_LAUNCH=0``): :func:`load` raises
:class:`NativeUnavailable` with the reason; the default launcher then falls back to cuda-python
(:func:`fmha_dsl.runtime.cuda.load_cubin`), and ``launcher="native"`` given explicitly is an error.
Nothing happens at import time.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading

from fmha_dsl.cache import cache_base

MODULE = "_fmha_native"
_LOCK = threading.Lock()
_STATE: dict = {}  # "module" | "error" | "cuda_launch"


class NativeUnavailable(RuntimeError):
    """The native launcher cannot be built or loaded here (the message says why)."""


def _source() -> bytes:
    with open(os.path.join(os.path.dirname(__file__), "native_launch.c"), "rb") as f:
        return f.read()


def compiler() -> list[str] | None:
    """The C compiler command: ``$CC``, else the interpreter's (sysconfig), else ``cc``/``gcc``; None if absent."""
    for cand in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc"):
        if not cand:
            continue
        cmd = shlex.split(cand)
        if cmd and shutil.which(cmd[0]):
            return cmd
    return None


def _key(src: bytes, cc: list[str]) -> str:
    parts = [src, sys.implementation.cache_tag or "", sysconfig.get_config_var("EXT_SUFFIX") or "",
             sysconfig.get_platform(), " ".join(cc), sys.version]
    return hashlib.sha256("\0".join(p if isinstance(p, str) else p.hex() for p in parts).encode()).hexdigest()[:24]


def library_path() -> tuple[str, list[str]]:
    """Where the shared object for this interpreter lives (it may not exist yet), and the compiler command."""
    cc = compiler()
    if cc is None:
        raise NativeUnavailable("no C compiler found (set CC, or install gcc/clang)")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return os.path.join(cache_base(), "native", _key(_source(), cc), MODULE + suffix), cc


def build(path: str, cc: list[str]) -> None:
    """Compile ``native_launch.c`` to ``path`` (atomically: a temporary file renamed into place)."""
    include = sysconfig.get_paths().get("include") or ""
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise NativeUnavailable(f"the Python headers are missing ({include}/Python.h): install python3-dev")
    folder = os.path.dirname(path)
    src = os.path.join(os.path.dirname(__file__), "native_launch.c")
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1] or ".so")
        os.close(fd)
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-Wall", f"-I{include}", src, "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
            raise NativeUnavailable(f"compiling the native launcher failed ({' '.join(cmd[:1])} exit "
                                    f"{res.returncode}): " + " | ".join(tail))
        os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeUnavailable(f"compiling the native launcher failed: {exc}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _import(path: str):
    loader = importlib.machinery.ExtensionFileLoader(MODULE, path)
    spec = importlib.util.spec_from_file_location(MODULE, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load():
    """The compiled extension module (built on first use); raises :class:`NativeUnavailable` with the reason."""
    mod = _STATE.get("module")
    if mod is not None:
        return mod
    with _LOCK:
        if "module" in _STATE:
            return _STATE["module"]
        if "error" in _STATE:
            raise NativeUnavailable(_STATE["error"])
        try:
            if os.environ.get("FMHA_DSL_NATIVE_LAUNCH", "1") == "0":
                raise NativeUnavailable("disabled by FMHA_DSL_NATIVE_LAUNCH=0")
            path, cc = library_path()
            if not os.path.exists(path):
                build(path, cc)
            try:
                mod = _import(path)
            except ImportError:  # a damaged cache entry: build it again once
                build(path, cc)
                mod = _import(path)
        except NativeUnavailable as exc:
            _STATE["error"] = str(exc)
            raise
        except ImportError as exc:
            _STATE["error"] = f"loading the native launcher failed: {exc}"
            raise NativeUnavailable(_STATE["error"]) from None
        _STATE["module"] = mod
        return mod


def available() -> tuple[bool, str]:
    """``(True, path)`` when the native launcher loads here, else ``(False, reason)``."""
    try:
        mod = load()
    except NativeUnavailable as exc:
        return False, str(exc)
    return True, mod.__file__


def driver_launch_address() -> int:
    """The address of ``cuLaunchKernel`` in the process's NVIDIA driver library (the one torch loaded)."""
    addr = _STATE.get("cuda_launch")
    if addr:
        return addr
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        addr = ctypes.cast(lib.cuLaunchKernel, ctypes.c_void_p).value
    except (OSError, AttributeError) as exc:
        raise NativeUnavailable(f"libcuda.so.1 could not be loaded: {exc}") from None
    if not addr:
        raise NativeUnavailable("libcuda.so.1 has no cuLaunchKernel")
    _STATE["cuda_launch"] = addr
    return addr


def kinds(types) -> bytes:
    """The extension's per-parameter codes for Triton signature types (pointers -> ``p``)."""
    from .abi import code_of

    return "".join("p" if t.startswith("*") else code_of(t)[0] for t in types).encode()


__all__ = ["NativeUnavailable", "load", "available", "build", "library_path", "compiler", "driver_launch_address",
           "kinds"]
