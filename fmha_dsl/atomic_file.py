"""[build] Files written whole or not at all: :func:`write_atomic`, which every writer of this package uses (the
registry, build reports, decision tables, reports, formatted sources)."""

from __future__ import annotations

import errno
import os
import stat
from typing import Iterable

from .errors import UsageError, error


def write_atomic(path: str | os.PathLike, chunks: Iterable[str] | str | bytes) -> str:
    """Write text (a string or chunks) or bytes via a temp file and rename: a killed write never leaves a torn
    file.  A symlink is written through (its target is replaced, the link stays), an existing file keeps its
    permission bits, and a write that fails (read-only folder, full disk) is a :class:`UsageError` naming the
    path, with nothing left behind."""
    p = os.fspath(path)
    real = os.path.realpath(p)  # through symlinks: replace the target, not the link
    check_target(p, real)
    tmp = f"{real}.tmp.{os.getpid()}"
    try:
        if not os.path.islink(p):  # (a link's target folder is the link's business: never made here)
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
        raise _write_error(p, real, exc) from None
    finally:
        if os.path.lexists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


def _write_error(p: str, real: str, exc: OSError) -> UsageError:
    hint = ("the disk is full: free some space and run again" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
            else f"`{p}` is a folder where a file goes: move it away, or choose another output path"
            if exc.errno == errno.EISDIR
            else f"make `{os.path.dirname(real) or '.'}` writable, or choose another output path")
    return error("output.write", f"cannot write `{p}`: {exc.strerror or exc}", None, hint, cls=UsageError)


def stage(dest: str, data: bytes) -> tuple[str, str]:
    """Write ``data`` for ``dest`` whole but not yet in place: into a temp file beside where ``dest`` lands (its
    link's target folder: a rename never crosses filesystems), after the checks :func:`write_atomic` makes.  Returns
    ``(temp path, dest)`` for :func:`publish` (or :func:`discard`): a set of outputs whose writing could fail midway
    (a full disk, an interrupt) is staged first, so that what was there stays whole until all of it is written."""
    real = os.path.realpath(dest)
    check_target(dest, real)   # (before the temp file's folder is made: a link's missing folder is refused)
    tmp = os.path.join(os.path.dirname(real), f".{os.path.basename(dest)}.staged.{os.getpid()}")
    write_atomic(tmp, data)
    return tmp, dest


def publish(staged: list[tuple[str, str]]) -> None:
    """Move :func:`stage`'s files into place, each by one rename onto its destination (a link's target)."""
    for tmp, dest in staged:
        real = os.path.realpath(dest)
        try:
            os.replace(tmp, real)
        except OSError as exc:
            raise _write_error(dest, real, exc) from None


def discard(staged: list[tuple[str, str]]) -> None:
    """Remove what :func:`stage` wrote and :func:`publish` did not move (a failure midway)."""
    for tmp, _ in staged:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def check_target(p: str, real: str) -> None:
    """What the rename would replace is a regular file, or nothing: a device (``/dev/null``), FIFO or socket -- the
    target of ``p`` or of a link ``p`` -- would be replaced by a plain file; a link into a folder that does not
    exist would have that folder made."""
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if os.path.islink(p) and not os.path.isdir(os.path.dirname(real)):
            raise error("output.write", f"cannot write `{p}`: it is a link to `{real}`, whose folder does not exist",
                        None, "point the link at an existing folder, or remove the link", cls=UsageError) from None
        return
    except OSError:
        return   # (unreadable: the write itself reports it)
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):   # (a folder: the write's EISDIR message)
        kind = "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else \
            "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        via = "" if real == os.path.abspath(p) else f" (through a link to `{real}`)"
        raise error("output.write", f"cannot write `{p}`{via}: it is {kind}, which a write would replace with a "
                    "plain file", None, "choose a regular file's path for the output", cls=UsageError)


__all__ = ["write_atomic", "stage", "publish", "discard", "check_target"]
