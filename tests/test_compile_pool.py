"""Compile jobs in worker processes: a job whose process dies (a compiler crash) fails alone."""

import os
import sys
import threading
import time
import types

import pytest

from fmha_dsl.compile_pool import run_isolated
from fmha_dsl.errors import UsageError


def _work(x):
    """A stand-in compile: ``(meta, data)``; 3 aborts its process (an LLVM assertion), 5 raises, 7 exits."""
    if x == 3:
        os.abort()
    if x == 5:
        raise ValueError("bad input")
    if x == 7:
        os._exit(3)
    return {"x": x * 2}, bytes([x])


def _odd_result(x):
    """Jobs that end badly without a crash: SystemExit, and a result that cannot be pickled."""
    if x == 2:
        raise SystemExit(0)
    if x == 3:
        return {"f": lambda: 0}, b""
    return {"x": x}, b""


def _dies_after(x):
    """Job 1 kills its process just after answering."""
    if x == 1:
        threading.Thread(target=lambda: (time.sleep(0.2), os._exit(9)), daemon=True).start()
    return {"x": x}, b""


def _collect(fn, n, workers, pause=0.0):
    got = {}

    def on_result(i, res):
        assert i not in got, f"job {i} reported twice"
        got[i] = res
        time.sleep(pause)  # the parent writes files meanwhile

    run_isolated(fn, [(i,) for i in range(n)], workers, on_result)
    assert sorted(got) == list(range(n))
    return got


def _check(got):
    assert got[3][0] is None and "SIGABRT" in got[3][1] and "compiler crash" in got[3][1]
    assert got[5] == (None, "worker failed: ValueError: bad input")
    assert got[7][0] is None and "status 3" in got[7][1]
    for i in set(range(10)) - {3, 5, 7}:
        assert got[i] == ({"x": 2 * i}, bytes([i]))


def test_a_crashing_job_fails_alone_with_several_workers():
    _check(_collect(_work, 10, 3))


def test_a_crashing_job_fails_alone_with_one_worker():
    _check(_collect(_work, 10, 1))


def test_more_workers_than_jobs_and_no_jobs():
    got = _collect(_work, 3, 8)
    assert got == {i: ({"x": 2 * i}, bytes([i])) for i in range(3)}
    run_isolated(_work, [], 4, lambda i, r: (_ for _ in ()).throw(AssertionError("no job, no result")))


@pytest.mark.parametrize("workers", [1, 2])
def test_system_exit_and_unpicklable_results_are_failures(workers):
    got = _collect(_odd_result, 5, workers)
    assert got[2] == (None, "worker failed: SystemExit: 0")
    assert got[3][0] is None and "could not be sent back" in got[3][1]
    assert [got[i] for i in (0, 1, 4)] == [({"x": i}, b"") for i in (0, 1, 4)]


def test_a_worker_that_dies_between_jobs():
    """Job 1's worker dies 0.2 s after answering, while the parent is still busy with the answer: the next send
    meets a dead pipe.  Every job is still reported once; only the job that worker held can fail."""
    got = _collect(_dies_after, 5, 1, pause=0.4)
    assert got[1] == ({"x": 1}, b"")
    crashed = [i for i, r in got.items() if r[0] is None]
    assert len(crashed) <= 1 and all("status 9" in got[i][1] for i in crashed)
    assert all(got[i] == ({"x": i}, b"") for i in got if i not in crashed)


def test_workers_that_cannot_start_are_a_usage_error():
    """A function the spawned worker cannot import."""
    mod = types.ModuleType("fmha_pool_test_nowhere")
    exec("def fn(x):\n    return {}, b''\n", mod.__dict__)
    sys.modules[mod.__name__] = mod
    try:
        with pytest.raises(UsageError, match="before it started") as exc:
            run_isolated(mod.fn, [(1,), (2,)], 2, lambda i, r: None)
        assert "fresh process" in exc.value.hint
    finally:
        del sys.modules[mod.__name__]


def test_a_script_without_a_main_guard_is_not_run_again_in_the_workers(tmp_path):
    """The spawn start method would re-run an unguarded script in every worker (and fail there): workers start
    with the main module hidden, so the script runs once and its compiles succeed."""
    import subprocess

    marks = tmp_path / "runs"
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys\n"
        f"open({str(marks)!r}, 'a').write('run\\n')\n"
        "from fmha_dsl.compile_pool import run_isolated\n"
        "from test_compile_pool_helpers import ok\n"
        "got = {}\n"
        "run_isolated(ok, [(1,), (2,), (3,)], 2, lambda i, r: got.__setitem__(i, r))\n"
        "assert sorted(got) == [0, 1, 2], got\n"
        "print('done')\n")
    (tmp_path / "test_compile_pool_helpers.py").write_text("def ok(x):\n    return {'x': x}, b''\n")
    import os

    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr[-2000:]
    assert marks.read_text() == "run\n"


def _pid(x):
    """A stand-in compile that says which worker ran it."""
    return {"pid": os.getpid(), "x": x}, b""


def _pid_together(folder, n):
    """:func:`_pid`, answering only once ``n`` workers hold a job each: every worker of the batch runs one."""
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 30
    while len(os.listdir(folder)) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"pid": os.getpid()}, b""


def _pids(n=3, workers=3):
    """The pids of a batch's ``n`` workers (one job each)."""
    import tempfile

    folder, got = tempfile.mkdtemp(), {}
    run_isolated(_pid_together, [(folder, n)] * n, workers, lambda i, r: got.__setitem__(i, r))
    assert sorted(got) == list(range(n)) and all(r[0] for r in got.values()), got
    return {r[0]["pid"] for r in got.values()}


@pytest.fixture
def idle_workers(monkeypatch):
    from fmha_dsl import compile_pool

    compile_pool.stop_idle_workers()
    yield compile_pool
    compile_pool.stop_idle_workers()


def _gone(pids, timeout=10.0):
    """True once none of ``pids`` is a live process (reaped or never ours)."""
    import multiprocessing

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = {p.pid for p in multiprocessing.active_children()}  # also reaps the ones that ended
        if not pids & live:
            return True
        time.sleep(0.05)
    return False


def test_the_next_batch_reuses_the_idle_workers(idle_workers):
    """A worker costs about a second to start (interpreter, Triton, first kernel): a process's next batch -- the next
    class's first use, a training step's backward -- runs on the workers the last one left idle."""
    first = _pids()
    assert len(first) == 3
    assert _pids() == first
    assert len(_pids(n=2, workers=8) & first) == 2  # fewer needed: two of them


def test_idle_workers_are_not_reused_across_environments_and_stop_when_asked(idle_workers, monkeypatch):
    first = _pids()
    monkeypatch.setenv("FMHA_POOL_TEST_KNOB", "1")  # a knob the compiler might read: fresh workers
    second = _pids()
    assert not first & second
    assert _gone(first)
    idle_workers.stop_idle_workers()
    assert _gone(second)


def test_idle_workers_stop_after_idle_seconds(idle_workers, monkeypatch):
    monkeypatch.setattr(idle_workers, "IDLE_SECONDS", 0.2)
    first = _pids()
    assert _gone(first)
    assert not first & _pids()


def test_a_reused_worker_that_died_idle_fails_no_job(idle_workers):
    """An idle worker killed between batches (an OOM killer, a user): its job goes to a fresh worker, it is not
    reported as that kernel's compiler crash."""
    import signal

    first = _pids()
    victim = sorted(first)[0]
    os.kill(victim, signal.SIGKILL)
    assert _gone({victim})
    got = _collect(_pid, 6, 3)
    assert all(r[0] is not None for r in got.values()), got
    assert victim not in {r[0]["pid"] for r in got.values()}


def test_a_crash_in_a_reused_worker_is_still_reported(idle_workers):
    _check(_collect(_work, 10, 3))
    _check(_collect(_work, 10, 3))  # on the workers the last batch left idle
