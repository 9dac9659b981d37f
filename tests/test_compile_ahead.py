"""Compiling ahead: a training step's backward candidates compile behind its forward's, in the same batch of
workers, and the backward's first use takes them instead of compiling them again (fmha_dsl/build_triton.py's
``ahead``, ``Builder.compile_ahead``, ``Dispatcher.compile_ahead``).  The compile workers are replaced by a recorder
here: what is checked is which jobs run in which batch, when each call returns, and what a later call gets."""

import itertools
import threading

import pytest

from fmha_dsl import build_triton as bt
from fmha_dsl import compile_ahead
from fmha_dsl.cache import ArtifactCache
from fmha_dsl.errors import UsageError, error
from fmha_dsl.first_use import Builder, _jobs
from fmha_dsl.keys import Problem
from fmha_dsl.runtime.dispatch import Dispatcher

_KEYS = itertools.count()


@pytest.fixture(autouse=True)
def own_keys(monkeypatch):
    """Each test with keys of its own: nothing it leaves reaches the process's later compiles."""
    monkeypatch.setattr(compile_ahead, "AHEAD", compile_ahead.AheadKeys())
    return compile_ahead.AHEAD


def _key() -> str:  # cache keys of this test only (AHEAD is the process's)
    return f"{next(_KEYS):04d}" + "ab" * 30


def _job(name: str) -> tuple:
    return ("kernel", {"family": name}, None, "sm90")


class _Workers:
    """Stands in for compile_pool.run_isolated: records each batch's jobs; holds back the jobs of ``hold``'s families
    until ``release`` is set; ``fail`` names families that fail to compile."""

    def __init__(self, hold=(), fail=()):
        self.batches, self.hold, self.fail = [], set(hold), set(fail)
        self.release = threading.Event()

    def __call__(self, fn, jobs, workers, on_result):
        self.batches.append([j[1]["family"] for j in jobs])
        for i, j in enumerate(jobs):
            fam = j[1]["family"]
            if fam in self.hold:
                assert self.release.wait(20)
            if fam in self.fail:
                on_result(i, (None, f"{fam} does not compile"))
            else:
                on_result(i, ({"binary_kind": "cubin", "shared": 0, "name": fam}, fam.encode()))


def test_ahead_jobs_run_after_the_wanted_ones_in_one_batch_and_are_taken_not_compiled_again(tmp_path, monkeypatch):
    w = _Workers(hold={"bwd"})
    monkeypatch.setattr(bt, "run_isolated", w)
    cache = ArtifactCache(str(tmp_path))
    kf, kb, kc = _key(), _key(), _key()
    ready, why = bt.compile_through_cache({kf: _job("fwd")}, cache, 16,
                                          ahead={kb: _job("bwd"), kc: _job("bwd_companion"), kf: _job("fwd")})
    # returned with the forward's kernel while the backward's is still held: one batch, the forward's job first
    assert list(ready) == [kf] and ready[kf][1] == b"fwd" and not why
    assert w.batches == [["fwd", "bwd", "bwd_companion"]]
    assert compile_ahead.AHEAD.holds(kb) and compile_ahead.AHEAD.holds(kc)
    got = {}
    wanted = {kb: _job("bwd"), kc: _job("bwd_companion")}
    t = threading.Thread(target=lambda: got.update(r=bt.compile_through_cache(wanted, cache, 16)))
    t.start()
    t.join(0.3)
    assert t.is_alive(), "the backward's call waits for the background batch"
    w.release.set()
    t.join(20)
    ready, why = got["r"]
    assert ready[kb][1] == b"bwd" and ready[kc][1] == b"bwd_companion" and not why
    assert not ready[kb][2]  # compiled in this process, not loaded
    assert w.batches == [["fwd", "bwd", "bwd_companion"]], "nothing compiled twice"
    assert not compile_ahead.AHEAD.holds(kb) and cache.get(kb)[1] == b"bwd"  # cached as it came in


def test_a_kernel_compiled_ahead_that_failed_is_reported_not_compiled_again(tmp_path, monkeypatch):
    w = _Workers(fail={"bwd"})
    monkeypatch.setattr(bt, "run_isolated", w)
    cache = ArtifactCache(str(tmp_path))
    kf, kb = _key(), _key()
    bt.compile_through_cache({kf: _job("fwd")}, cache, 4, ahead={kb: _job("bwd")})
    ready, why = bt.compile_through_cache({kb: _job("bwd")}, cache, 4)  # (waits for the background batch)
    assert not ready and why[kb] == "bwd does not compile" and len(w.batches) == 1


def test_a_batch_whose_workers_cannot_start_raises_and_leaves_the_ahead_kernels_to_whoever_wants_them(tmp_path,
                                                                                                       monkeypatch):
    def no_workers(fn, jobs, workers, on_result):
        raise error("build.workers", "a compile worker process exited (status 1) before it started", None, "",
                    cls=UsageError)

    monkeypatch.setattr(bt, "run_isolated", no_workers)
    cache = ArtifactCache(str(tmp_path))
    kf, kb = _key(), _key()
    with pytest.raises(UsageError, match="before it started"):
        bt.compile_through_cache({kf: _job("fwd")}, cache, 4, ahead={kb: _job("bwd")})
    assert not compile_ahead.AHEAD.holds(kb)
    w = _Workers()
    monkeypatch.setattr(bt, "run_isolated", w)
    ready, _ = bt.compile_through_cache({kb: _job("bwd")}, cache, 4)
    assert ready[kb][1] == b"bwd" and w.batches == [["bwd"]]


def test_a_key_let_go_between_the_looks_at_the_batch_and_the_cache_is_not_compiled_again(tmp_path, monkeypatch):
    """A later call looks for its key in a background batch's and in the artifact cache.  The batch stores the binary
    and then lets the key go: looking at the batch first, the key is in one place or the other whenever it is let
    go.  (Looking at the cache first, a key stored and let go between the two looks was compiled a second time: a
    full suite on two cores saw it.)"""
    w = _Workers()
    monkeypatch.setattr(bt, "run_isolated", w)
    cache = ArtifactCache(str(tmp_path))
    key, meta = _key(), {"binary_kind": "cubin", "shared": 0, "name": "bwd"}
    assert compile_ahead.AHEAD.claim(key)   # a background batch compiles it

    def batch_ends():  # the batch's end: the binary stored, then the key let go
        cache.put(key, meta, b"bwd", "bwd.cubin")
        compile_ahead.AHEAD.done(key)

    real_get = cache.get

    def get(k):  # the batch ends just after the call's first look at the cache, which found nothing
        got = real_get(k)
        if k == key and got is None and compile_ahead.AHEAD.holds(key):
            batch_ends()
        return got

    monkeypatch.setattr(cache, "get", get)
    ready, why = bt.compile_through_cache({key: _job("bwd")}, cache, 4)
    assert ready[key][1] == b"bwd" and not why and w.batches == []


def test_keys_are_let_go_however_a_batch_ends(tmp_path, monkeypatch):
    """An ahead job whose binary is already cached is claimed, found and let go (not compiled); a foreground batch
    claims its own keys while it compiles and lets them go when it ends, by an error too -- a key left claimed would
    make every later call wait for it."""
    w = _Workers()
    monkeypatch.setattr(bt, "run_isolated", w)
    cache = ArtifactCache(str(tmp_path))
    kf, kb = _key(), _key()
    cache.put(kb, {"binary_kind": "cubin", "shared": 0, "name": "bwd"}, b"bwd", "bwd.cubin")
    seen = []
    real = w.__call__
    monkeypatch.setattr(bt, "run_isolated", lambda *a: (seen.append(compile_ahead.AHEAD.holds(kf)), real(*a)))
    ready, _ = bt.compile_through_cache({kf: _job("fwd")}, cache, 4, ahead={kb: _job("bwd")})
    assert w.batches == [["fwd"]] and seen == [True] and ready[kf][1] == b"fwd"
    assert not compile_ahead.AHEAD.holds(kb) and not compile_ahead.AHEAD.holds(kf)

    def crash(fn, jobs, workers, on_result):
        raise KeyboardInterrupt

    monkeypatch.setattr(bt, "run_isolated", crash)
    k2 = _key()
    with pytest.raises(KeyboardInterrupt):
        bt.compile_through_cache({k2: _job("fwd")}, cache, 4)
    assert not compile_ahead.AHEAD.holds(k2)


def test_a_calls_own_failed_compile_is_not_replayed_and_nothing_of_it_is_kept(tmp_path, monkeypatch):
    """A call's own jobs keep no result in memory: a compile that failed (a worker killed for memory, say) is tried
    again by the next call, not handed its reason; with a cache that cannot be written nothing is held either."""
    w = _Workers(fail={"fwd"})
    monkeypatch.setattr(bt, "run_isolated", w)
    cache = ArtifactCache(str(tmp_path))
    key = _key()
    for _ in range(2):
        ready, why = bt.compile_through_cache({key: _job("fwd")}, cache, 4)
        assert key in why and key not in ready
    assert w.batches == [["fwd"], ["fwd"]] and not compile_ahead.AHEAD.results
    monkeypatch.setattr(cache, "put", lambda *a: False)   # an unwritable cache folder
    w.fail = set()
    k2 = _key()
    ready, _ = bt.compile_through_cache({k2: _job("bwd")}, cache, 4)
    assert ready[k2][1] == b"bwd" and not compile_ahead.AHEAD.holds(k2) and not compile_ahead.AHEAD.results


def test_a_batch_lets_go_only_of_the_keys_it_still_holds(tmp_path, monkeypatch):
    """A key done early in a batch is let go then; when the batch ends it lets go of what it still holds, not of a
    claim another call has made on that key meanwhile (that call's waiters would compile it again)."""
    cache = ArtifactCache(str(tmp_path))
    kx, ky = _key(), _key()

    def run(fn, jobs, workers, on_result):
        on_result(0, (None, "does not compile"))          # kx done: let go
        assert compile_ahead.AHEAD.claim(kx)              # another call claims it to try again
        on_result(1, ({"binary_kind": "cubin", "shared": 0, "name": "y"}, b"y"))

    monkeypatch.setattr(bt, "run_isolated", run)
    bt.compile_through_cache({kx: _job("x"), ky: _job("y")}, cache, 4)
    assert kx in compile_ahead.AHEAD.events and not compile_ahead.AHEAD.holds(ky)   # the other call's claim stands
    compile_ahead.AHEAD.done(kx)


def test_a_key_stored_by_another_batch_before_the_claim_is_not_compiled(tmp_path, monkeypatch):
    """Between a call's first look at the cache and its claim, another batch may store the key and let it go: the
    call looks again once it holds the claim, and takes the binary."""
    w = _Workers()
    monkeypatch.setattr(bt, "run_isolated", w)
    cache = ArtifactCache(str(tmp_path))
    key = _key()
    real = compile_ahead.AHEAD.claim

    def claim(k):  # the other batch finishes just before this call claims the key
        cache.put(key, {"binary_kind": "cubin", "shared": 0, "name": "fwd"}, b"fwd", "fwd.cubin")
        return real(k)

    monkeypatch.setattr(compile_ahead.AHEAD, "claim", claim)
    ready, why = bt.compile_through_cache({key: _job("fwd")}, cache, 4)
    assert ready[key][1] == b"fwd" and ready[key][2] and w.batches == [] and not compile_ahead.AHEAD.holds(key)


def _problems():
    common = dict(dtype="bf16", arch="sm90", batch=2, nhead_q=8, nhead_k=8, seqlen_q=2048, seqlen_k=2048,
                  max_seqlen_q=2048, max_seqlen_k=2048, hdim_q=128, hdim_v=128, mode="batch", mask="top_left")
    return Problem(family="fwd", lse=True, **common), Problem(family="bwd_dq_dk_dv", **common)


def test_the_builder_puts_the_queued_backward_behind_the_next_forward_compile(tmp_path, monkeypatch):
    pytest.importorskip("triton")  # Builder.compile checks that it is installed
    w = _Workers()
    monkeypatch.setattr(bt, "run_isolated", w)
    fwd, bwd = _problems()
    b = Builder(cache_dir=str(tmp_path))
    fc, bc = b.candidates(fwd, "sm90"), b.candidates(bwd, "sm90")
    b.compile_ahead(bc, True)
    got = b.compile(fc, True)
    assert [e.identifier for e, _ in got] == [e.identifier for e in fc]
    [batch] = w.batches
    n_fwd = len(_jobs(fc, True)[0])  # the forward's kernels and companions (split-KV's combine) first
    assert not any(f.startswith("bwd") for f in batch[:n_fwd])
    assert set(batch[n_fwd:]) == {"bwd_dq_dk_dv", "bwd_dot_do_o", "bwd_convert_dq"}
    assert batch.count("bwd_dq_dk_dv") == len(bc)
    got = b.compile(bc, True)  # the backward's first use: every candidate, with its companions, no new batch
    assert all(isinstance(bins, dict) and e.build["dot_do_o"] and e.build["convert_dq"] for e, bins in got)
    assert len(w.batches) == 1
    # queued while nothing compiles (the forward was decided): start_ahead starts it alone, in the background
    other = Problem(**dict(bwd.model_dump(), hdim_q=64, hdim_v=64))
    b.compile_ahead(b.candidates(other, "sm90"), True)
    b.start_ahead()
    b.compile(b.candidates(other, "sm90"), True)  # waits for that batch, compiles nothing itself
    assert len(w.batches) == 2 and set(w.batches[1]) == {"bwd_dq_dk_dv", "bwd_dot_do_o", "bwd_convert_dq"}


class _Queue(Builder):
    """Records what the dispatcher queues; compiles nothing."""

    def __init__(self):
        super().__init__()
        self.queued = []

    def compile_ahead(self, entries, aligned=True):
        self.queued.append(([e.identifier for e in entries], aligned))


def test_the_dispatcher_queues_what_first_use_would_compile_and_nothing_once_decided(tmp_path, monkeypatch):
    for knob in ("FMHA_DSL_AUTOTUNE", "FMHA_DSL_NO_BUILD", "FMHA_DSL_TUNED_CONFIRM", "FMHA_DSL_COMPILE_AHEAD"):
        monkeypatch.delenv(knob, raising=False)
    _, bwd = _problems()
    b = _Queue()
    d = Dispatcher(None, arch="sm90", builder=b, tuned_dir="")
    assert d.compile_ahead(bwd, True)
    assert b.queued == [([e.identifier for e in b.candidates(bwd, "sm90", True)], True)]
    monkeypatch.setenv("FMHA_DSL_AUTOTUNE", "0")
    assert not d.compile_ahead(bwd, True)  # measuring off: first use compiles a few, one at a time
    monkeypatch.delenv("FMHA_DSL_AUTOTUNE")
    monkeypatch.setenv("FMHA_DSL_NO_BUILD", "1")
    assert not d.compile_ahead(bwd, True)
    monkeypatch.delenv("FMHA_DSL_NO_BUILD")
    monkeypatch.setenv("FMHA_DSL_COMPILE_AHEAD", "0")
    assert not d.compile_ahead(bwd, True)
    monkeypatch.delenv("FMHA_DSL_COMPILE_AHEAD")
    from fmha_dsl.runtime.decisions import key

    d._decided[key(bwd, True)] = object()
    assert not d.compile_ahead(bwd, True) and len(b.queued) == 1
    assert not Dispatcher(Dispatcher(None, arch="sm90", builder=b, tuned_dir="").registry, arch="sm90",
                          tuned_dir="").compile_ahead(bwd, True)  # a prebuilt registry: nothing compiles


def test_a_recorded_decision_queues_its_winner_only(tmp_path, monkeypatch):
    """A decision recorded on this device: the backward's first use compiles (or loads) its winner alone, so that is
    what the forward queues."""
    from fmha_dsl.runtime import decisions

    for knob in ("FMHA_DSL_AUTOTUNE", "FMHA_DSL_NO_BUILD", "FMHA_DSL_COMPILE_AHEAD"):
        monkeypatch.delenv(knob, raising=False)
    _, bwd = _problems()
    b = _Queue()
    win = b.candidates(bwd, "sm90", True)[3]
    rec = dict(decisions.record_of(win, {win.identifier: 1.0}, {win.identifier: win.name}),
               space=b.fingerprint("bwd_dq_dk_dv"))
    decisions.TunedTable("sm90", None, str(tmp_path)).record(decisions.key(bwd, True), rec)
    d = Dispatcher(None, arch="sm90", builder=b, tuned_dir=str(tmp_path))
    assert d.compile_ahead(bwd, True)
    [(ids, aligned)] = b.queued
    assert ids == [b.entry_for(win.sig, win.alg, "sm90").identifier] == [win.identifier] and aligned
