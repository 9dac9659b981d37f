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
that started them, for the same job function, environment, working directory and package sources; a job whose
reused worker dies before answering anything in the batch goes back to the queue (a fresh worker is started), so an
idle worker killed meanwhile never fails a kernel it did not compile.  A forked child leaves its parent's workers
alone.  Workers run below their parent's priority (:data:`WORKER_NICE`): the process waiting for them -- first use
timing a forward's candidates while its backward's compile behind them -- keeps its core.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import multiprocessing
import os
import signal
import sys
import threading
import time
import weakref
from multiprocessing.connection import wait

from .errors import UsageError, error

_READY = "ready"
WORKER_NICE = 10  # workers' scheduling priority below their parent's (os.nice): the parent's host work goes first


def _serve(conn, fn) -> None:
    """Worker loop: says it is ready, then ``(index, args)`` in, ``(index, fn(*args))`` out, until ``None``.  Ctrl-C
    is the parent's to handle (it terminates a worker busy with an interrupted batch): an idle worker must not die
    of it, with a traceback, whenever the terminal's process group gets one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # below the process that waits for it: first use times kernels while a background batch compiles
        os.nice(WORKER_NICE)
    except (AttributeError, OSError):
        pass
    try:
        conn.send(_READY)
    except OSError:  # the parent is gone already (it exited while this worker started)
        return
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
        except OSError:  # the parent is gone
            return


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
        _LIVE.add(self)


def _stop(workers: list, wait: float = 5.0) -> None:
    """Ask ``workers`` to finish (idle ones stop at once), wait up to ``wait`` seconds for all of them together, then
    terminate whichever is still running (a busy one of an interrupted batch: pass ``wait=0``)."""
    for w in workers:
        try:
            w.conn.send(None)
        except OSError:
            pass
    deadline = time.monotonic() + wait
    for w in workers:
        w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if w.proc.is_alive():
            w.proc.terminate()
            w.proc.join()
        w.conn.close()
        _LIVE.discard(w)


IDLE_SECONDS = 30.0  # how long idle workers wait for the process's next batch before they stop
KEEP_MAX = 32        # idle workers kept at most (each holds its interpreter and Triton: about 180 MB)


class _IdleWorkers:
    """The workers a finished batch left idle, for the next batch of the same kind (see the module docstring)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.key = None
        self.workers: list[_Worker] = []
        self.timer: threading.Timer | None = None
        self.generation = 0  # bumped when workers are given back or detached: an older timer's expiry does nothing

    def take(self, key, n: int) -> list[_Worker]:
        """Up to ``n`` live idle workers of kind ``key``, ready for a job (idle workers of another kind stop)."""
        with self.lock:
            if key != self.key:
                got, stale = [], self._detach()
            else:  # the others keep their expiry: they have been idle as long
                got, self.workers, stale = self.workers[:n], self.workers[n:], []
        alive = [w for w in got if w.proc.is_alive()]
        _stop(stale + [w for w in got if w not in alive])
        for w in alive:
            w.reused, w.answered, w.ready, w.job = True, 0, True, None
        return alive

    def give_back(self, key, workers: list[_Worker]) -> None:
        """Keep ``workers`` (live, idle, of kind ``key``) for the next batch, for :data:`IDLE_SECONDS`, at most
        :data:`KEEP_MAX` of them."""
        with self.lock:
            stale = []
            if key != self.key:
                stale = self._detach()
                self.key = key
            room = max(0, KEEP_MAX - len(self.workers))
            self.workers += workers[:room]
            stale += workers[room:]
            self.generation += 1
            if self.timer is not None:
                self.timer.cancel()
            self.timer = threading.Timer(IDLE_SECONDS, self._expire, (self.generation,))
            self.timer.daemon = True  # never holds up the interpreter's exit
            self.timer.start()
        _stop(stale)

    def stop(self) -> None:
        """Stop every idle worker now."""
        with self.lock:
            stale = self._detach()
        _stop(stale)

    def _expire(self, generation: int) -> None:
        with self.lock:
            stale = self._detach() if generation == self.generation else []
        _stop(stale)

    def _detach(self) -> list[_Worker]:
        """Under the lock: the idle workers, handed over for stopping; none are left and no timer runs."""
        workers, self.workers = self.workers, []
        self.generation += 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return workers

    def forget_after_fork(self) -> None:
        """In a forked child: every worker is the parent's.  The child drops them untouched -- its copies of their
        pipes closed (a worker must see its parent go), and out of multiprocessing's list of this process's children
        (whose exit handler would terminate them) -- with a fresh lock (another thread may have held this one)."""
        self.lock = threading.Lock()
        workers = list(_LIVE)  # before the idle list lets go of them (a weak set)
        self.workers, self.key, self.timer = [], None, None
        children = getattr(multiprocessing.process, "_children", None)
        for w in workers:
            if isinstance(children, set):
                children.discard(w.proc)
            try:
                w.conn.close()
            except OSError:
                pass
        _LIVE.clear()


_LIVE: "weakref.WeakSet[_Worker]" = weakref.WeakSet()  # every worker this process started and has not stopped
# set when the interpreter exits, before multiprocessing's own exit handler (registered earlier, so run later)
# terminates the workers: a batch still running in a background thread then starts no replacement for them (one
# started then would be left behind, failing with a traceback once its parent is gone)
_EXITING = threading.Event()
atexit.register(_EXITING.set)
_IDLE = _IdleWorkers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IDLE.forget_after_fork)


def stop_idle_workers() -> None:
    """Stop the compile workers kept idle for the next batch (they stop by themselves after :data:`IDLE_SECONDS`;
    until then they are among ``multiprocessing.active_children()``)."""
    _IDLE.stop()


def _kind_of(fn) -> tuple:
    """What a reused worker must share with the batch: the job function, the environment, the working directory
    and the kernel sources it imported (a template edited on disk needs a fresh worker)."""
    h = hashlib.sha256()
    for k, v in sorted(os.environ.items()):
        h.update(f"{k}={v}\0".encode())
    h.update(f"{os.getcwd()}\0{sys.path}\0".encode())
    for root, dirs, files in os.walk(os.path.dirname(os.path.abspath(__file__))):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith((".py", ".json"))):
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            h.update(f"{root}/{name}:{st.st_mtime_ns}:{st.st_size}\0".encode())
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
        if pending and not _EXITING.is_set():  # (at exit the workers are stopped, and none is started again)
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
        _stop([w for w in pool if w not in keep and w.job is not None], wait=0)
        _stop([w for w in pool if w not in keep and w.job is None])
