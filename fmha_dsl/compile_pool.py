"""[build] Run compile jobs in worker processes so that a crashing compiler fails one kernel, not the build.

A compiler can die outright on some input (an LLVM assertion aborts the process; seen with Triton 3.9's AMDGPU
backend).  ``concurrent.futures`` then breaks the whole pool and every pending job with it, and a compile in the
build's own process takes the build down.  :func:`run_isolated` keeps ``workers`` spawned processes, hands each
one job at a time over its own pipe, and watches the processes: when one dies, the job it held -- and only that
one -- fails with the exit status, and a fresh worker takes its place.  Workers are started without re-importing
the caller's main module (the jobs are functions of fmha-dsl's own modules), so a script, a notebook or a ``python -``
session that compiles -- ``fmha_dsl.attention``'s first use included -- needs no ``if __name__ == "__main__":``
guard and is never run again in a worker.  A worker that cannot start is a usage error, not a crashed kernel.

Workers outlive a batch: when it is done they wait, idle, for the process's next batch (first use's next class, a
training step's backward after its forward) and stop after :data:`IDLE_SECONDS`.  Starting one costs 0.8-1 s (the
interpreter, Triton, the compiler's first kernel), which a second batch on fresh workers pays again (a worker's first
compile took 1.8 s, its next ones 0.8 s, on this repository's CPU box).  Idle workers are reused only by the process
that started them, for the same job function, environment, working directory and kernel sources; a reused worker
that dies before it answers a job is replaced and the job retried, so it never fails a kernel it did not compile.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.connection import wait

from .errors import UsageError, error

_READY = "ready"


def _serve(conn, fn) -> None:
    """Worker loop: says it is ready, then ``(index, args)`` in, ``(index, fn(*args))`` out, until ``None``."""
    conn.send(_READY)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone (it may die while this worker waits idle): stop quietly
            return
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
        self.reused = False  # taken from the idle workers of an earlier batch
        self.answered = 0    # results sent back in this batch

    def stop(self, wait: float) -> None:
        """Ask the worker to finish (it is idle), wait up to ``wait`` seconds, then terminate it."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(timeout=wait)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()
        self.conn.close()


IDLE_SECONDS = 30.0  # how long idle workers wait for the process's next batch before they stop


class _IdleWorkers:
    """The workers a finished batch left idle, for the next batch of the same kind (see the module docstring)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.key = None
        self.workers: list[_Worker] = []
        self.timer: threading.Timer | None = None
        self.pid = os.getpid()

    def take(self, key, n: int) -> list[_Worker]:
        """Up to ``n`` live idle workers of kind ``key``, ready for a job (idle workers of another kind stop)."""
        with self.lock:
            if self.pid != os.getpid():  # a forked child: those workers are its parent's, never touched here
                self.pid, self.workers, self.key, self.timer = os.getpid(), [], None, None
            if key != self.key:
                got, stale = [], self._detach()
            else:
                got, self.workers, stale = self.workers[:n], self.workers[n:], []
        alive = [w for w in got if w.proc.is_alive()]
        for w in stale + [w for w in got if w not in alive]:
            w.stop(5.0)
        for w in alive:
            w.reused, w.answered, w.ready, w.job = True, 0, True, None
        return alive

    def give_back(self, key, workers: list[_Worker]) -> None:
        """Keep ``workers`` (live, idle, of kind ``key``) for the next batch, for :data:`IDLE_SECONDS` -- up to one
        per core, or as many as this batch had (concurrent batches do not pile up)."""
        with self.lock:
            stale = []
            if self.pid != os.getpid() or key != self.key:
                stale = self._detach()
                self.key, self.pid = key, os.getpid()
            room = max(0, max(os.cpu_count() or 1, len(workers)) - len(self.workers))
            self.workers += workers[:room]
            stale += workers[room:]
            if self.timer is not None:
                self.timer.cancel()
            self.timer = threading.Timer(IDLE_SECONDS, self.stop)
            self.timer.daemon = True  # never holds up the interpreter's exit
            self.timer.start()
        for w in stale:
            w.stop(5.0)

    def stop(self) -> None:
        """Stop every idle worker now (after :data:`IDLE_SECONDS` without a batch, or when asked)."""
        with self.lock:
            stale = self._detach() if self.pid == os.getpid() else []
        for w in stale:
            w.stop(5.0)

    def _detach(self) -> list[_Worker]:
        """Under the lock: the idle workers, handed over for stopping; none are left and no timer runs."""
        workers, self.workers = self.workers, []
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return workers


_IDLE = _IdleWorkers()


def stop_idle_workers() -> None:
    """Stop the compile workers kept idle for the next batch (they stop by themselves after :data:`IDLE_SECONDS`)."""
    _IDLE.stop()


def _kind_of(fn) -> tuple:
    """What a reused worker must share with the batch: the job function, the environment, the working directory
    and the kernel sources it imported (a template edited on disk needs a fresh worker)."""
    h = hashlib.sha256()
    for k, v in sorted(os.environ.items()):
        h.update(f"{k}={v}\0".encode())
    h.update(f"{os.getcwd()}\0{sys.path}\0".encode())
    kernels = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
    try:
        for name in sorted(os.listdir(kernels)):
            st = os.stat(os.path.join(kernels, name))
            h.update(f"{name}:{st.st_mtime_ns}:{st.st_size}\0".encode())
    except OSError:
        pass
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", None), h.hexdigest()


def run_isolated(fn, jobs: list, workers: int, on_result) -> None:
    """Call ``on_result(i, fn(*jobs[i]))`` for every job, computed in ``workers`` spawned processes (``fn`` must be
    a module-level function).  ``fn`` returns ``(meta, data)``, or ``(None, reason)`` on failure; a job whose
    process dies gets ``(None, reason)`` naming the exit status.  Results arrive in completion order, each job
    exactly once.  Raises :class:`~fmha_dsl.errors.UsageError` when worker processes cannot start."""
    if not jobs:
        return
    ctx = multiprocessing.get_context("spawn")  # compilers in fresh processes, no inherited state
    pending = list(range(len(jobs)))[::-1]
    kind = _kind_of(fn)
    want = max(1, min(workers, len(jobs)))
    pool: list[_Worker] = _IDLE.take(kind, want)

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
        if i is not None and w.reused and not w.answered:  # died idle, before this job could have run: not its crash
            pending.append(i)
        elif i is not None:
            on_result(i, (None, _died(w.proc.exitcode)))
        if pending:
            pool.append(_Worker(ctx, fn))

    done = False
    try:
        while len(pool) < want:
            pool.append(_Worker(ctx, fn))
        for w in pool:  # reused workers are ready: hand them their first job now
            if w.ready:
                feed(w)
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
                            w.answered += 1
                            on_result(*msg)
                        feed(w)
                        continue
                if w.proc.sentinel in ready:
                    died(w)
        done = True
    finally:
        # a finished batch leaves its live, idle workers for the next one; an interrupted one stops them all (a busy
        # one is terminated at once)
        keep = [w for w in pool if done and w.job is None and w.proc.is_alive() and not w.conn.poll()]
        if keep:
            _IDLE.give_back(kind, keep)
        for w in pool:
            if w not in keep:
                w.stop(0 if w.job is not None else 5.0)
