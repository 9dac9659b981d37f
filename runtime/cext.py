"""Compile a CPython extension from the package's sources on first use, cache it by content, load it.

Shared by the two native pieces of the runtime: the C launcher (:mod:`.native`) and the torch fast path
(:mod:`.torch_fast`).  They are built the way Triton builds its launcher stubs: with the machine's compiler
against the running interpreter's headers (no build step at install, nothing compiled unless used).

    path = library_path("_fmha_native", key_parts)     # <cache>/native/<key>/_fmha_native<EXT_SUFFIX>
    compile_atomic(cmd_without_output, path, what)     # into a temporary file, renamed into place
    mod = import_from(path, "_fmha_native")

The key hashes the sources, the interpreter (cache tag, ABI suffix, platform, version) and whatever else the
caller passes (compiler command, torch version and location), so a changed source, compiler or interpreter
builds a new object instead of loading a stale one.  A build that fails or is interrupted leaves no partial
file behind; concurrent first uses in several processes each rename a complete file into place.
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

from fmha_dsl.cache import cache_base

HERE = os.path.dirname(os.path.abspath(__file__))


class NativeUnavailable(RuntimeError):
    """A native extension cannot be built or loaded here (the message says why)."""


def source_path(name: str) -> str:
    return os.path.join(HERE, name)


def read_sources(names) -> bytes:
    out = []
    for name in names:
        with open(source_path(name), "rb") as f:
            out.append(name.encode() + b"\0" + f.read())
    return b"\0".join(out)


def find_compiler(env: str, config_var: str, fallbacks: tuple[str, ...]) -> list[str] | None:
    """``$env``, else the interpreter's ``sysconfig`` entry, else the first fallback on PATH; None if absent."""
    for cand in (os.environ.get(env), sysconfig.get_config_var(config_var), *fallbacks):
        if not cand:
            continue
        cmd = shlex.split(cand)
        if cmd and shutil.which(cmd[0]):
            return cmd
    return None


def python_include() -> str:
    """The interpreter's header folder; :class:`NativeUnavailable` (naming the package to install) if absent."""
    include = sysconfig.get_paths().get("include") or ""
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise NativeUnavailable(f"the Python headers are missing ({include}/Python.h): install python3-dev")
    return include


def library_path(module: str, key_parts) -> str:
    """Where ``module``'s shared object for this interpreter and these key parts lives (it may not exist yet)."""
    parts = [sys.implementation.cache_tag or "", sysconfig.get_config_var("EXT_SUFFIX") or "",
             sysconfig.get_platform(), sys.version, *key_parts]
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return os.path.join(cache_base(), "native", h.hexdigest()[:24], module + suffix)


def compile_atomic(cmd: list[str], path: str, what: str, timeout: float = 600) -> None:
    """Run ``cmd + ["-o", tmp]`` and rename ``tmp`` to ``path``; errors name ``what`` and the compiler's last lines."""
    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1] or ".so")
        os.close(fd)
        res = subprocess.run([*cmd, "-o", tmp], capture_output=True, text=True, timeout=timeout, check=False)
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
            raise NativeUnavailable(f"compiling {what} failed ({cmd[0]} exit {res.returncode}): " + " | ".join(tail))
        os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeUnavailable(f"compiling {what} failed: {exc}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def import_from(path: str, module: str):
    loader = importlib.machinery.ExtensionFileLoader(module, path)
    spec = importlib.util.spec_from_file_location(module, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def load_or_build(path: str, module: str, build, what: str):
    """Import ``module`` from ``path``, calling ``build()`` first when it is missing or damaged (once)."""
    try:
        if not os.path.exists(path):
            build()
        try:
            return import_from(path, module)
        except ImportError:  # a damaged cache entry: build it again once
            build()
            return import_from(path, module)
    except ImportError as exc:
        raise NativeUnavailable(f"loading {what} failed: {exc}") from None


def load_once(state: dict, lock, knob, module: str, what: str, library_path, build):
    """The extension module, imported (or built, then imported) once per process; :class:`NativeUnavailable` with
    the reason otherwise, remembered in ``state``.  ``knob`` (a boolean :class:`fmha_dsl.knobs.Knob`) set to ``0``
    turns it off; ``library_path()`` gives ``(path,
    compiler)`` and ``build(path, compiler)`` makes the shared object."""
    mod = state.get("module")
    if mod is not None:
        return mod
    with lock:
        if "module" in state:
            return state["module"]
        if "error" in state:
            raise NativeUnavailable(state["error"])
        try:
            if not knob.get():
                raise NativeUnavailable(f"disabled by {knob.name}=0")
            path, cc = library_path()
            mod = load_or_build(path, module, lambda: build(path, cc), what)
        except NativeUnavailable as exc:
            state["error"] = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001  (anything else -- a source file gone, torch not importable -- is
            # the same answer: remembered, and the caller keeps its Python path instead of a dead background thread)
            state["error"] = f"{what} could not be loaded: {type(exc).__name__}: {exc}"
            raise NativeUnavailable(state["error"]) from None
        state["module"] = mod
        return mod


def available(load) -> tuple[bool, str]:
    """``(True, path)`` when ``load()`` gives the module, else ``(False, reason)``."""
    try:
        mod = load()
    except NativeUnavailable as exc:
        return False, str(exc)
    return True, mod.__file__


__all__ = ["NativeUnavailable", "find_compiler", "python_include", "library_path", "compile_atomic", "import_from",
           "load_or_build", "load_once", "available", "read_sources", "source_path"]
