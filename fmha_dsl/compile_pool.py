"""[build] Run compile jobs in worker processes so that a crashing compiler fails one kernel, not the build.

A compiler can die outright on some input (an LLVM assertion aborts the process; seen with Triton 3.9's AMDGPU
backend).  ``concurrent.futures`` then breaks the whole pool and every pending job with it, and a compile in the
build's own process takes the build down.  :func:`run_isolated` keeps ``workers`` spawned processes, hands each
one job at a time over its own pipe, and watches the processes: when one dies, the job it held -- and only that
one -- fails with the exit status, and a fresh worker takes its place.
"""

from __future__ import annotations

import multiprocessing
import signal
from multiprocessing.connection import wait


def _serve(conn, fn) -> None:
    """Worker loop: ``(index, args)`` in, ``(index, fn(*args))`` out, until ``None``."""
    while True:
        msg = conn.recv()
        if msg is None:
            return
        i, args = msg
        try:
            res = fn(*args)
        except Exception as exc:  # noqa: BLE001  (a failing job is a result)
            res = (None, f"worker failed: {type(exc).__name__}: {exc}")
        conn.send((i, res))


def _died(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the compiler process died ({name}) while compiling this kernel: a compiler crash"
    return f"the compiler process exited (status {code}) while compiling this kernel: a compiler crash"


class _Worker:
    def __init__(self, ctx, fn):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, fn), daemon=True)
        self.proc.start()
        child.close()
        self.job = None


def run_isolated(fn, jobs: list, workers: int, on_result) -> None:
    """Call ``on_result(i, fn(*jobs[i]))`` for every job, computed in ``workers`` spawned processes (``fn`` must be
    a module-level function).  ``fn`` returns ``(meta, data)``, or ``(None, reason)`` on failure; a job whose
    process dies gets ``(None, reason)`` naming the exit status.  Results arrive in completion order."""
    if not jobs:
        return
    ctx = multiprocessing.get_context("spawn")  # compilers in fresh processes, no inherited state
    pending = list(range(len(jobs)))[::-1]
    pool: list[_Worker] = []

    def feed(w: _Worker) -> None:
        if pending:
            w.job = pending.pop()
            w.conn.send((w.job, jobs[w.job]))
        else:
            w.job = None

    try:
        for _ in range(max(1, min(workers, len(jobs)))):
            w = _Worker(ctx, fn)
            pool.append(w)
            feed(w)
        while True:
            busy = [w for w in pool if w.job is not None]
            if not busy:
                break
            ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy]))
            for w in busy:
                if w.conn in ready:
                    try:
                        i, res = w.conn.recv()
                    except (EOFError, OSError):  # died after the pipe became readable
                        ready.add(w.proc.sentinel)
                    else:
                        on_result(i, res)
                        feed(w)
                        continue
                if w.proc.sentinel in ready:
                    w.proc.join()
                    i, w.job = w.job, None
                    pool.remove(w)
                    on_result(i, (None, _died(w.proc.exitcode)))
                    if pending:
                        fresh = _Worker(ctx, fn)
                        pool.append(fresh)
                        feed(fresh)
    finally:
        for w in pool:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        for w in pool:
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join()
