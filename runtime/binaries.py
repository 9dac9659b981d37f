"""A build directory's kernel binaries, read safely: an entry's ``build["binary"]`` (relative to the directory) is
opened only where it stays inside the directory once symlinks are resolved, only as a regular file, at most
:data:`MAX_BINARY_BYTES`, and checked against its ``sha256``; what is wrong with one is the directory's fault
(``registry.*``, an input error).  A registry file's paths are already relative without
``..`` (:mod:`fmha_dsl.registry_schema`); an absolute path comes only from a Registry object built in Python."""

from __future__ import annotations

import hashlib
import os
import stat

from fmha_dsl.errors import RegistryError, UsageError, error
from fmha_dsl.registry import Entry

MAX_BINARY_BYTES = 256 << 20   # no kernel binary comes near this; a larger file is not one (``/dev/zero``)


def path_of(entry: Entry, rel: str, root: str | None) -> str:
    """Where ``entry``'s binary ``rel`` is: under ``root``, and -- symlinks resolved -- still inside it."""
    if os.path.isabs(rel):
        return rel
    if root is None:
        raise error("dispatch.no-binary", f"kernel {entry.name}: the binary path `{rel}` is relative and this "
                    "dispatcher has no root", None,
                    "pass the build directory (or root=DIR) instead of a Registry object", cls=UsageError)
    path = os.path.join(root, rel)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
        raise error("registry.binary", f"kernel {entry.name}: its binary `{rel}` leads outside the build directory "
                    f"`{root}`", None, "rebuild the registry into this directory (a symlink or `..` leads out)",
                    cls=RegistryError)
    return path


def read(entry: Entry, root: str | None) -> bytes:
    """The bytes of ``entry``'s binary, checked against the registry's sha256."""
    b = entry.build
    if not b or not b.get("binary"):
        raise error("dispatch.no-binary", f"kernel {entry.name} has no compiled binary in this registry", None,
                    "build the set with `fmha-dsl build FILE --backend triton -o DIR` and pass DIR")
    path = path_of(entry, b["binary"], root)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # (before open: a FIFO would block it)
            raise error("registry.binary", f"kernel {entry.name}: `{path}` is not a regular file", None,
                        "the build directory was modified: rebuild it", cls=RegistryError)
        with open(path, "rb") as f:
            data = f.read(MAX_BINARY_BYTES + 1)
    except OSError as exc:   # (as when a dispatcher opens the directory: registry.binary-missing)
        raise error("registry.binary-missing", f"kernel {entry.name}: cannot read `{path}`: {exc.strerror}", None,
                    "the build directory lost it (a copy or a clean-up): rebuild it with `fmha-dsl build`",
                    cls=RegistryError) from None
    if len(data) > MAX_BINARY_BYTES:
        raise error("registry.binary", f"kernel {entry.name}: `{path}` is larger than a kernel binary can be "
                    f"({MAX_BINARY_BYTES >> 20} MiB)", None, "the build directory was modified: rebuild it",
                    cls=RegistryError)
    want = b.get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise error("registry.binary-hash", f"kernel {entry.name}: `{path}` does not match the sha256 in the "
                    "registry", None, "the build directory was modified: rebuild it", cls=RegistryError)
    return data


def missing(entries, root: str | None) -> list[str]:
    """``name: path`` of the entries whose binary (or a companion kernel's) is not a file under ``root`` (one
    ``stat`` each; binaries held in memory, as first use's, have no path)."""
    out = []
    if root is None:
        return out
    for e in entries:
        build = e.build or {}
        for b in [build] + [v for v in build.values() if isinstance(v, dict) and "binary" in v]:
            rel = b.get("binary")
            if rel and not os.path.isabs(rel) and not os.path.isfile(os.path.join(root, rel)):
                out.append(f"{e.name}: {rel}")
    return out


__all__ = ["MAX_BINARY_BYTES", "path_of", "read", "missing"]
