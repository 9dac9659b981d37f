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


def _pids(folder, n=3, workers=3):
    """The pids of a batch's ``n`` workers (one job each; ``folder``: an empty directory)."""
    got = {}
    folder.mkdir()
    run_isolated(_pid_together, [(str(folder), n)] * n, workers, lambda i, r: got.__setitem__(i, r))
    assert sorted(got) == list(range(n)) and all(r[0] for r in got.values()), got
    return {r[0]["pid"] for r in got.values()}


_RAN_BEFORE: list = []  # in a worker: the batches it served


def _second_batch_kills(folder, n, batch, x):
    """Batch 1: :func:`_pid_together`.  Batch 2: "die" kills a worker that served batch 1 when it is that worker's
    first job of the batch -- what a worker killed while idle looks like to the batch -- and succeeds anywhere else;
    "abort" aborts every worker."""
    _RAN_BEFORE.append(batch)
    if batch == 1:
        return _pid_together(folder, n)
    if x == "abort":
        os.abort()
    if x == "die" and _RAN_BEFORE.count(2) == 1 and 1 in _RAN_BEFORE:
        os._exit(9)
    return {"pid": os.getpid()}, b""


@pytest.fixture
def idle_workers():
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


def test_the_next_batch_reuses_the_idle_workers(idle_workers, tmp_path):
    """A worker costs about a second to start (interpreter, Triton, first kernel): a process's next batch -- the next
    class's first use, a training step's backward -- runs on the workers the last one left idle."""
    first = _pids(tmp_path / "1")
    assert len(first) == 3
    assert _pids(tmp_path / "2") == first
    assert len(_pids(tmp_path / "3", n=2, workers=8) & first) == 2  # fewer needed: two of them


def test_idle_workers_are_not_reused_across_environments_and_stop_when_asked(idle_workers, monkeypatch, tmp_path):
    first = _pids(tmp_path / "1")
    monkeypatch.setenv("FMHA_POOL_TEST_KNOB", "1")  # a knob the compiler might read: fresh workers
    second = _pids(tmp_path / "2")
    assert not first & second
    assert _gone(first)
    idle_workers.stop_idle_workers()
    assert _gone(second)


def test_idle_workers_stop_after_idle_seconds(idle_workers, monkeypatch, tmp_path):
    monkeypatch.setattr(idle_workers, "IDLE_SECONDS", 0.2)
    first = _pids(tmp_path / "1")
    assert _gone(first)
    assert not first & _pids(tmp_path / "2")


def test_idle_workers_left_behind_by_a_take_still_expire(idle_workers, monkeypatch, tmp_path):
    """A batch that takes some idle workers and ends without giving any back (interrupted, or its workers died) must
    not leave the others idle for good."""
    monkeypatch.setattr(idle_workers, "IDLE_SECONDS", 1.0)
    first = _pids(tmp_path / "1")
    taken = idle_workers._IDLE.take(idle_workers._kind_of(_pid_together), 1)
    try:
        assert len(taken) == 1 and {w.proc.pid for w in taken} <= first
        assert _gone(first - {w.proc.pid for w in taken})
    finally:
        idle_workers._stop(taken)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_reused_worker_that_dies_first_thing_fails_no_job(idle_workers, tmp_path, workers):
    """A reused worker that dies before it answers anything in the batch (killed while idle: an OOM killer, a
    user) does not fail the job it was handed: the job goes back to the queue and a fresh worker runs it.  A job
    that crashes every worker is still reported, once, as a crash."""
    folder = str(tmp_path / "b1")
    os.mkdir(folder)
    got = {}

    def batch(jobs):
        got.clear()
        run_isolated(_second_batch_kills, jobs, workers, lambda i, r: (got.__setitem__(i, r) if i not in got
                                                                       else pytest.fail(f"job {i} twice")))
        assert sorted(got) == list(range(len(jobs)))
        return got

    batch([(folder, workers, 1, i) for i in range(workers)])
    res = batch([(folder, workers, 2, "die")] + [(folder, workers, 2, i) for i in range(3)])
    assert all(res[i][0] is not None for i in range(4)), res  # "die" ran again elsewhere: no crash reported
    batch([(folder, workers, 1, i) for i in range(workers)])
    res = batch([(folder, workers, 2, "abort")])
    assert res[0][0] is None and "SIGABRT" in res[0][1] and "compiler crash" in res[0][1]


def test_a_crash_in_a_reused_worker_is_still_reported(idle_workers):
    _check(_collect(_work, 10, 3))
    _check(_collect(_work, 10, 3))  # on the workers the last batch left idle


def test_idle_workers_ignore_ctrl_c(idle_workers, tmp_path):
    """SIGINT goes to the terminal's whole process group (and Jupyter's interrupt to the kernel's): an idle worker
    must neither die of it nor print a traceback; the next batch still reuses it."""
    import signal

    first = _pids(tmp_path / "1")
    for pid in first:
        os.kill(pid, signal.SIGINT)
    time.sleep(0.3)
    assert _pids(tmp_path / "2") == first


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_leaves_the_parents_idle_workers_alone(tmp_path):
    """A child forked by the compiling process (a raw os.fork, exiting normally, through the interpreter's exit
    handlers) must not terminate the parent's idle workers -- multiprocessing's exit handler would, for children it
    believes its own -- and the parent's next batch runs on them.  In a fresh process: pytest must not fork."""
    import subprocess

    (tmp_path / "pool_fork_helpers.py").write_text("import os\ndef pid(x):\n    return {'pid': os.getpid()}, b''\n")
    script = tmp_path / "forks.py"
    script.write_text(
        "import os, sys, warnings\n"
        "from fmha_dsl.compile_pool import run_isolated\n"
        "from pool_fork_helpers import pid\n"
        "def pids():\n"
        "    got = {}\n"
        "    run_isolated(pid, [(1,)], 1, lambda i, r: got.__setitem__(i, r))\n"
        "    return got[0][0]['pid']\n"
        "first = pids()\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    sys.exit(0)\n"
        "_, status = os.waitpid(child, 0)\n"
        "assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status\n"
        "assert pids() == first, 'the idle worker was not reused'\n"
        "print('done')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stdout[-1000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-2000:]


def test_at_interpreter_exit_a_dead_worker_is_not_replaced(monkeypatch):
    """When the interpreter exits, multiprocessing stops the workers; a batch still running in a background thread
    (compiling ahead) must start no replacement, which would outlive its parent and fail with a traceback.  With
    the exit flag set, the worker that dies takes its job's failure with it and the batch ends; the jobs left are
    not run."""
    from fmha_dsl import compile_pool

    flag = threading.Event()
    flag.set()
    monkeypatch.setattr(compile_pool, "_EXITING", flag)
    got = {}
    run_isolated(_work, [(7,), (1,), (2,)], 1, got.__setitem__)
    assert list(got) == [0] and "status 3" in got[0][1]
