"""[build] Run compile jobs in worker processes so that a crashing compiler fails one kernel, not the build.

A compiler can die outright on some input (an LLVM assertion aborts the process; seen with Triton 3.9's AMDGPU
backend).  ``concurrent.futures`` then breaks the whole pool and every pending job with it, and a compile in the
build's own process takes the build down.  :func:`run_isolated` keeps ``workers`` spawned processes, hands each
one job at a time over its own pipe, and watches the processes: when one dies, the job it held -- and only that
one -- fails with the exit status, and a fresh worker takes its place.  Workers are started without re-importing
the caller's main module (the jobs are functions of fmha-dsl's own modules), so a script, a notebook or a ``python -``
session that compiles -- ``fmha_dsl.attention``'s first use included -- needs no ``if __name__ == "__main__":``
guard and is never run again in a worker.  A worker that cannot start is a usage error, not a crashed kernel.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
import threading
import time
from multiprocessing.connection import wait

from .errors import UsageError, error

_READY = "ready"


def _serve(conn, fn) -> None:
    """Worker loop: says it is ready, then ``(index, args)`` in, ``(index, fn(*args))`` out, until ``None``."""
    conn.send(_READY)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        i, args = msg
        try:
            res = fn(*args)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001  (a failing job is a result, SystemExit included)
            res = (None, f"worker failed: {type(exc).__name__}: {exc}")
        try:
            conn.send((i, res))
        except (TypeError, ValueError, AttributeError) as exc:  # a result that cannot be pickled
            conn.send((i, (None, f"worker failed: its result could not be sent back: {exc}")))


def _died(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the compiler process died ({name}) while compiling this kernel: a compiler crash"
    return f"the compiler process exited (status {code}) while compiling this kernel: a compiler crash"


_HIDING = threading.Lock()  # one thread at a time changes (and restores) __main__


@contextlib.contextmanager
def _main_module_hidden():
    """While a worker starts: the spawn start method re-runs the parent's ``__main__`` (found through its ``__spec__``
    or ``__file__``) in the child unless neither is set; the jobs never need it."""
    with _HIDING:
        yield from _hidden()


def _hidden():
    main = sys.modules.get("__main__")
    saved = {a: vars(main)[a] for a in ("__spec__", "__file__") if main is not None and a in vars(main)}
    try:
        if "__spec__" in saved:
            main.__spec__ = None
        if "__file__" in saved:
            del main.__file__
        yield
    finally:
        for a, v in saved.items():
            setattr(main, a, v)


class _Worker:
    def __init__(self, ctx, fn):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, fn), daemon=True)
        with _main_module_hidden():
            self.proc.start()
        child.close()
        self.ready = False
        self.job = None


def run_isolated(fn, jobs: list, workers: int, on_result) -> None:
    """Call ``on_result(i, fn(*jobs[i]))`` for every job, computed in ``workers`` spawned processes (``fn`` must be
    a module-level function).  ``fn`` returns ``(meta, data)``, or ``(None, reason)`` on failure; a job whose
    process dies gets ``(None, reason)`` naming the exit status.  Results arrive in completion order, each job
    exactly once.  Raises :class:`~fmha_dsl.errors.UsageError` when worker processes cannot start."""
    if not jobs:
        return
    ctx = multiprocessing.get_context("spawn")  # compilers in fresh processes, no inherited state
    pending = list(range(len(jobs)))[::-1]
    pool: list[_Worker] = []

    def feed(w: _Worker) -> None:
        """Hand ``w`` the next job (or nothing); a worker that died meanwhile is handled by the wait loop."""
        w.job = pending.pop() if pending else None
        if w.job is not None:
            try:
                w.conn.send((w.job, jobs[w.job]))
            except OSError:  # died after its last answer: the sentinel reports it, with this job
                pass

    def died(w: _Worker) -> None:
        w.proc.join()
        pool.remove(w)
        if not w.ready:
            raise error("build.workers", f"a compile worker process exited (status {w.proc.exitcode}) before it "
                        "started", None, "check that the Python executable can start (sys.executable) and that fmha_dsl "
                        "imports in a fresh process", cls=UsageError)
        i, w.job = w.job, None
        on_result(i, (None, _died(w.proc.exitcode)))
        if pending:
            pool.append(_Worker(ctx, fn))

    try:
        for _ in range(max(1, min(workers, len(jobs)))):
            pool.append(_Worker(ctx, fn))
        while True:
            live = [w for w in pool if not w.ready or w.job is not None]
            if not live:
                break
            ready = set(wait([w.conn for w in live] + [w.proc.sentinel for w in live]))
            for w in live:
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):  # died after the pipe became readable
                        ready.add(w.proc.sentinel)
                    else:
                        if msg == _READY:
                            w.ready = True
                        else:
                            on_result(*msg)
                        feed(w)
                        continue
                if w.proc.sentinel in ready:
                    died(w)
    finally:
        for w in pool:
            try:
                w.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 5.0  # idle workers stop at once; busy ones (an interrupt) are terminated
        for w in pool:
            w.proc.join(timeout=0 if w.job is not None else max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join()
