"""[build] Files written whole or not at all: :func:`write_atomic`, which every writer of this package uses (the
registry, build reports, decision tables, reports, formatted sources)."""

from __future__ import annotations

import errno
import os
from typing import Iterable

from .errors import UsageError, error


def write_atomic(path: str | os.PathLike, chunks: Iterable[str] | str | bytes) -> str:
    """Write text (a string or chunks) or bytes via a temp file and rename: a killed write never leaves a torn
    file.  A symlink is written through (its target is replaced, the link stays), an existing file keeps its
    permission bits, and a write that fails (read-only folder, full disk) is a :class:`UsageError` naming the
    path, with nothing left behind."""
    p = os.fspath(path)
    real = os.path.realpath(p)  # through symlinks: replace the target, not the link
    tmp = f"{real}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
        try:
            mode = os.stat(real).st_mode & 0o7777
        except FileNotFoundError:
            mode = None
        if isinstance(chunks, bytes):
            with open(tmp, "wb") as f:
                f.write(chunks)
        else:
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                if isinstance(chunks, str):
                    f.write(chunks)
                else:
                    f.writelines(chunks)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, real)
    except OSError as exc:
        hint = ("the disk is full: free some space and run again" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else f"`{p}` is a folder where a file goes: move it away, or choose another output path"
                if exc.errno == errno.EISDIR
                else f"make `{os.path.dirname(real) or '.'}` writable, or choose another output path")
        raise error("output.write", f"cannot write `{p}`: {exc.strerror or exc}", None, hint,
                    cls=UsageError) from None
    finally:
        if os.path.lexists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


__all__ = ["write_atomic"]
