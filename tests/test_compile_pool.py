"""Compile jobs in worker processes: a job whose process dies (a compiler crash) fails alone."""

import os

from fmha_dsl.compile_pool import run_isolated


def _work(x):
    """A stand-in compile: ``(meta, data)``; 3 aborts its process (an LLVM assertion), 5 raises, 7 exits."""
    if x == 3:
        os.abort()
    if x == 5:
        raise ValueError("bad input")
    if x == 7:
        os._exit(3)
    return {"x": x * 2}, bytes([x])


def _run(workers, n=10):
    got = {}

    def on_result(i, res):
        assert i not in got, f"job {i} reported twice"
        got[i] = res

    run_isolated(_work, [(i,) for i in range(n)], workers, on_result)
    return got


def _check(got, n=10):
    assert sorted(got) == list(range(n))
    assert got[3][0] is None and "SIGABRT" in got[3][1] and "compiler crash" in got[3][1]
    assert got[5] == (None, "worker failed: ValueError: bad input")
    assert got[7][0] is None and "status 3" in got[7][1]
    for i in set(range(n)) - {3, 5, 7}:
        assert got[i] == ({"x": 2 * i}, bytes([i]))


def test_a_crashing_job_fails_alone_with_several_workers():
    _check(_run(3))


def test_a_crashing_job_fails_alone_with_one_worker():
    _check(_run(1))


def test_more_workers_than_jobs_and_no_jobs():
    got = _run(8, n=3)
    assert got == {i: ({"x": 2 * i}, bytes([i])) for i in range(3)}
    run_isolated(_work, [], 4, lambda i, r: (_ for _ in ()).throw(AssertionError("no job, no result")))
