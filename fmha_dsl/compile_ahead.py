"""[build] Compiling ahead: kernels compiled in a background batch, for a later call that will want them.

:func:`fmha_dsl.build_triton.compile_through_cache` takes ``ahead`` jobs -- a training step's backward candidates,
handed over while its forward compiles -- and runs them after its own jobs in one batch of worker processes, on the
workers its own jobs leave idle and then on all of them.  The batch runs in a background thread
(:func:`run_in_background`) and the call returns once its own jobs are in.  :data:`AHEAD` holds the cache keys
batches are compiling -- such a batch's, and a call's own in the foreground -- so that a later call that wants one
waits for it instead of compiling it a second time.

A finished key's binary is in the artifact cache, where the waiting call reads it.  A job compiled ahead keeps its
result in memory only when the cache cannot give it back (a failed compile's reason, or a cache folder that cannot
be written); a call's own jobs keep nothing (a waiter then compiles the key itself).
"""

from __future__ import annotations

import os
import threading

KEPT = 64  # results held at most for calls that have not come yet (the oldest are dropped)


class AheadKeys:
    """The cache keys batches are compiling: each one's event until its batch is done with it, and the results of
    jobs compiled ahead that the artifact cache cannot give back (see the module docstring)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: dict[str, threading.Event] = {}
        self.results: dict[str, tuple] = {}

    def claim(self, key: str) -> bool:
        """Mark ``key`` as being compiled by the caller's batch; False when another batch has it."""
        with self.lock:
            if key in self.events:
                return False
            self.events[key] = threading.Event()
            return True

    def holds(self, key: str) -> bool:
        """Whether ``key`` is being compiled in a batch, or its result waits to be taken."""
        with self.lock:
            return key in self.events or key in self.results

    def done(self, key: str, result: tuple | None = None) -> None:
        """The batch that claimed ``key`` is done with it: ``result`` -- ``(meta, data)`` or ``(None, reason)`` --
        when the artifact cache does not hold it, else None (a waiter reads the cache, or compiles the key when the
        batch stopped before it).  Done twice: the second time does nothing."""
        with self.lock:  # (the event set under the lock too: an interrupt cannot leave it popped and never set)
            ev = self.events.pop(key, None)
            if ev is not None and result is not None:
                self.results[key] = result
                while len(self.results) > KEPT:
                    self.results.pop(next(iter(self.results)))
            if ev is not None:
                ev.set()

    def wait(self, key: str) -> tuple | None:
        """Once ``key``'s batch is done with it: its kept result (taken), or None (read the cache)."""
        with self.lock:
            ev = self.events.get(key)
        if ev is not None:
            ev.wait()
        with self.lock:
            return self.results.pop(key, None)

    def forget_after_fork(self) -> None:
        """In a forked child: no batch of the parent's runs here (a fresh lock: another thread may have held it)."""
        self.lock = threading.Lock()
        self.events, self.results = {}, {}


AHEAD = AheadKeys()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=AHEAD.forget_after_fork)


def run_in_background(run, fn, jobs: list, workers: int, on_result, first: int, claimed) -> None:
    """``run(fn, jobs, workers, on_result)`` (:func:`~fmha_dsl.compile_pool.run_isolated`) in a background thread;
    returns once the ``first`` jobs have their results (an error of the batch before that is raised here).  The
    keys ``claimed`` (claimed by the caller in :data:`AHEAD`) are released when the batch ends, however it ends:
    those it did not compile are compiled by whichever call wants them."""
    left, done, failed = first, threading.Event(), []

    def result(i, res):
        nonlocal left
        on_result(i, res)
        if i < first:
            left -= 1
            if not left:
                done.set()

    def batch():
        try:
            run(fn, jobs, workers, result)
        except BaseException as exc:  # noqa: BLE001  (the waiting caller's, while it waits; else the batch just ends)
            failed.append(exc)
        finally:
            for key in claimed:
                AHEAD.done(key)
            done.set()

    if not first:
        done.set()
    try:
        threading.Thread(target=batch, name="fmha-dsl-compile-ahead", daemon=True).start()
    except BaseException:
        for key in claimed:
            AHEAD.done(key)
        raise
    done.wait()
    if failed and left:
        raise failed[0]


__all__ = ["AHEAD", "AheadKeys", "run_in_background", "KEPT"]
