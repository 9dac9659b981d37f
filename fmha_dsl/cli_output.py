"""[cli] Writing to the terminal for ``fmha-dsl``: stdout that refuses data is a usage error, not a traceback;
the exit codes.  Only the ``cli*`` modules print or exit."""

from __future__ import annotations

import sys

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 70

STDOUT_RULE = "output.stdout"


def _write(text: str) -> None:
    """Write to stdout; a stdout that refuses data (a full disk, /dev/full) or is closed is a usage error, not a
    bug."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): Python leaves sys.stdout None
        raise _stdout_error(OSError(9, "it is closed"))
    try:
        sys.stdout.write(text)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _stdout_error(exc) from None


def _flush() -> None:
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _stdout_error(exc) from None


def _stdout_error(exc: OSError):
    from .errors import UsageError, error

    return error(STDOUT_RULE, f"cannot write to standard output: {exc.strerror or exc}", None,
                 "redirect the output to a file on a disk with free space (or to a pipe that reads it)",
                 cls=UsageError)


def _out(text: str = "") -> None:
    _write(text + ("\n" if not text.endswith("\n") else ""))


def _err(text: str) -> None:
    if sys.stderr is not None:  # (closed: nowhere to say it; the exit code still does)
        sys.stderr.write(text.rstrip("\n") + "\n")
