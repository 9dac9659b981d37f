"""The torch fast path: ``fmha_dsl.attention``'s repeat calls served in C++ (``torch_fast.cpp``).

    torch_fast.start(on_ready)   # build (or load from the cache) in a background thread, once per process
    torch_fast.loaded()          # the module once loaded, else None (never builds, never waits)
    torch_fast.wait(timeout)     # block until it is ready or has failed; True when ready
    torch_fast.load()            # the extension module, built now if needed (NativeUnavailable with the reason)
    torch_fast.available()       # (True, path) or (False, reason)

Why: a call of attention() on a tiny problem spends most of its ~9-13 us in Python: reading the tensors'
shapes, strides and pointers through torch's Python API, the checks, the 51 kernel arguments, the output
allocation.  The extension reads the tensors through torch's C++ API and replays a *recipe*: the packed
arguments of a call the Python path has already checked and launched, with the pointers and the scale patched
in (see the C file's header for the key and the protocol).  The Python path stays the single source of truth:
the fast path only serves calls identical to one it has seen in everything but the pointers and the scale.

Built with the C++ compiler (``$CXX``, sysconfig's, else ``c++``/``g++``) against the installed torch's headers
and libraries, cached like the native launcher (the key adds torch's version and location).  The build takes
10-30 s, so attention() starts it in a background thread on its first GPU call and keeps using the Python path
until it is ready.  ``FMHA_DSL_TORCH_FAST=0`` turns it off.  Nothing happens at import time.
"""

from __future__ import annotations

import os
import threading

from fmha_dsl import knobs

from . import cext
from .cext import NativeUnavailable

MODULE = "_fmha_torch_fast"
SOURCES = ("torch_fast.cpp", "torch_replay.h", "native_pack.h")
_LOCK = threading.Lock()        # guards start()'s bookkeeping ("thread", "ready"): held for microseconds
_BUILD_LOCK = threading.Lock()  # held by load() for the whole build (10-30 s): start() must never wait on it
_STATE: dict = {}  # "module" | "error" | "thread" | "ready"


def compiler() -> list[str] | None:
    """The C++ compiler command: ``$CXX``, else the interpreter's (sysconfig), else ``c++``/``g++``/``clang++``."""
    return cext.find_compiler("CXX", "CXX", ("c++", "g++", "clang++"))


def _torch_root() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__))


def _cxx11_abi() -> int:
    import torch

    return int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))


def library_path() -> tuple[str, list[str]]:
    """Where the shared object for this interpreter and torch lives (it may not exist yet), and the compiler."""
    cxx = compiler()
    if cxx is None:
        raise NativeUnavailable("no C++ compiler found (set CXX, or install g++/clang++)")
    import torch

    parts = [cext.read_sources(SOURCES), " ".join(cxx), torch.__version__, _torch_root(), _cxx11_abi()]
    return cext.library_path(MODULE, parts), cxx


def build(path: str, cxx: list[str]) -> None:
    """Compile ``torch_fast.cpp`` to ``path`` against torch (atomically)."""
    root = _torch_root()
    inc, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    if not os.path.exists(os.path.join(inc, "torch", "csrc", "autograd", "python_variable.h")):
        raise NativeUnavailable(f"torch's C++ headers are missing under {inc} (a torch build without them)")
    cmd = [*cxx, "-O2", "-shared", "-fPIC", "-std=c++20", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={_cxx11_abi()}",
           f"-I{cext.python_include()}", f"-I{inc}", f"-I{os.path.join(inc, 'torch', 'csrc', 'api', 'include')}",
           f"-I{cext.HERE}", cext.source_path("torch_fast.cpp"), f"-L{lib}", f"-Wl,-rpath,{lib}",
           "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"]
    cext.compile_atomic(cmd, path, "the torch fast path", timeout=600)


def load():
    """The compiled extension module (built now if needed); raises :class:`NativeUnavailable` with the reason."""
    return cext.load_once(_STATE, _BUILD_LOCK, knobs.TORCH_FAST, MODULE, "the torch fast path", library_path, build)


def start(on_ready=None) -> None:
    """Load or build the extension in a daemon thread (once per process); ``on_ready(module)`` runs on success --
    there, or here at once when it is already loaded.  A failure is remembered (:func:`available` says why); the
    callers keep their Python paths.  Never waits for the build: attention() calls this on every new class until
    the extension is ready, and a class's first call must not sit out a 10-30 s compile it does not need."""
    with _LOCK:
        mod = _STATE.get("module")
        if mod is None:
            if "error" in _STATE:  # the build failed (or is off): nothing will call back
                return
            ready = _STATE.setdefault("ready", [])
            if on_ready is not None and on_ready not in ready:  # attention() asks once per new class
                ready.append(on_ready)
            if "thread" in _STATE:
                return

            def work():
                try:
                    m = load()
                except NativeUnavailable:
                    m = None
                with _LOCK:
                    todo = _STATE.pop("ready", [])  # after a failure: dropped, nothing will call them back
                if m is not None:
                    for f in todo:
                        f(m)

            t = _STATE["thread"] = threading.Thread(target=work, name="fmha-dsl-torch-fast", daemon=True)
            t.start()  # under the lock: wait() never finds the thread unstarted
            return
    if on_ready is not None:
        on_ready(mod)


def loaded():
    """The extension module when it is loaded, else None (never builds, never waits)."""
    return _STATE.get("module")


def wait(timeout: float | None = None) -> bool:
    """Wait for :func:`start`'s build; True when the extension is loaded (False: failed, not started, timed out)."""
    t = _STATE.get("thread")
    if t is not None:
        t.join(timeout)
    return "module" in _STATE


def available() -> tuple[bool, str]:
    """``(True, path)`` when the extension loads here (built now if needed), else ``(False, reason)``."""
    return cext.available(load)


__all__ = ["NativeUnavailable", "load", "start", "loaded", "wait", "available", "build", "library_path", "compiler"]
