"""The torch fast path (runtime/torch_fast.cpp) without a GPU: built against the installed torch, driven with CPU
tensors and a ctypes stand-in for ``cuLaunchKernel`` that records the parameter slots it is handed.  Every slot
is checked against :mod:`struct`'s encoding of the arguments the Python path computes for the same call
(``runtime.plan.fwd_args``, ``fwd_abi.split_args``, ``SplitLaunch.count``): the fast path must launch exactly what
the Python path would -- for a repeated call, for a call whose key length differs within the recipe's span (a
decode loop), and for split-KV plans (two launches and a workspace)."""

import gc
import math
import struct
import weakref

import pytest

torch = pytest.importorskip("torch")

from fakes import FakeDriver  # noqa: E402

from fmha_dsl import costmodel  # noqa: E402
from fmha_dsl.attention_args import _mask  # noqa: E402
from fmha_dsl.kernels.fwd_abi import (ARGS, COMBINE_ARGS, aligned_names, replay_patches, split_args,  # noqa: E402
                                      workspace_strides)
from fmha_dsl.runtime import native, torch_fast  # noqa: E402
from fmha_dsl.runtime.abi import code_of  # noqa: E402
from fmha_dsl.runtime.plan import SplitLaunch, fwd_args  # noqa: E402

pytestmark = pytest.mark.skipif(torch_fast.compiler() is None, reason="no C++ compiler on this machine")

NAMES = [n for n, _ in ARGS]
SCALE = NAMES.index("sm_scale")
TYPES = [t.replace("{dtype}", "fp16") for _, t in ARGS]
KINDS = native.kinds(TYPES) + b"pp"  # + the two trailing scratch pointers Triton adds
SPLIT_TYPES = [t.replace("{dtype}", "fp32" if n in ("Out",) else "fp16") for n, t in ARGS]
COMBINE_TYPES = [t.replace("{dtype}", "fp16") for _, t in COMBINE_ARGS]
COMBINE_KINDS = native.kinds(COMBINE_TYPES) + b"pp"
USUAL = tuple(NAMES.index(n) for n in aligned_names("r"))
EVERY = (1, (1 << 31) - 1, 1, 0, True)  # a span of every key length
STREAM = 0x5EED


class Disp:
    """Stands for runtime.dispatch.Dispatcher (the fast path keys on the dispatcher's identity)."""


class Kernel:
    """Stands for the loaded kernel object a recipe keeps alive."""


@pytest.fixture(scope="module")
def mod():
    return torch_fast.load()  # into the test cache (tests/conftest.py sets FMHA_DSL_CACHE_DIR)


@pytest.fixture
def fp(mod):
    return mod.FastPath(torch.Tensor, Disp, lambda dev: STREAM, "cpu", 64)


def qkv(b=2, hq=4, hk=2, sq=40, sk=56, d=32, dv=None, layout="bhsd", dtype=torch.float16):
    dv = dv or d

    def make(h, s, dd):
        if layout == "bshd":
            return torch.randn(b, s, h, dd).to(dtype).transpose(1, 2)
        return torch.randn(b, h, s, dd).to(dtype)

    return make(hq, sq, d), make(hk, sk, d), make(hk, sk, dv)


def run(fp, q, k, v, *, causal=False, scale=None, return_lse=False, registry=None, jit=None, **other):
    a = dict(window=None, bias=None, alibi_slopes=None, dropout_p=0.0, seed=None, softcap=None, sink=None,
             cu_seqlens_q=None, cu_seqlens_k=None, offset=0, max_seqlen_q=None, max_seqlen_k=None)
    a.update(other)
    return fp.run(q, k, v, causal, a["window"], a["bias"], a["alibi_slopes"], a["dropout_p"], a["seed"],
                  a["softcap"], a["sink"], scale, return_lse, a["cu_seqlens_q"], a["cu_seqlens_k"], registry,
                  a["offset"], a["max_seqlen_q"], a["max_seqlen_k"], {} if jit is None else jit)


def python_args(q, k, v, out, lse, causal, scale, window=None, softcap=None, sink=None):
    """What attention()'s Python path passes for this batch-mode call."""
    b, hq, sq, dq = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr(), 0, 0,
            0, 0]
    mask, wl, wr, br = _mask(causal, window)
    sink = 0 if not sink or mask == "no" else sink
    return fwd_args(ptrs, False, q.stride(), k.stride(), v.stride(), out.stride(),
                    None if lse is None else lse.stride(), None, None, hq, hk, dq, dv, sq, sk, sq, sk, scale, softcap,
                    0.0, None, 0, wl, wr, br, sink)


def encode(args, types=TYPES):
    out = []
    for t, a in zip(types, args):
        code = "Q" if t.startswith("*") else code_of(t)[0]
        raw = struct.pack("<" + code, a)
        out.append(raw + b"\0" * (8 - len(raw)))
    return out + [b"\0" * 8] * 2


def step(drv, args, grid=(3, 4, 2), patches=None, kinds=KINDS, function=0xF00D, splits=False):
    """A launch as attention() hands it to commit(): the native launcher's fast_spec, then grid, args, patches."""
    return (drv.address, function, 128, 4096, kinds, 2, grid, args,
            replay_patches(False)[0] if patches is None else patches, splits)


def commit(fp, tok, disp, kern, steps, out, lse, *, span=EVERY, aligned=True, split=None, usual=USUAL):
    """An aligned class's binary promises the usual arguments 16-divisible, an unaligned one's nothing."""
    fp.commit(tok, disp, (kern,), steps, span, usual, usual if aligned else (), aligned, split, out, lse)


def learn(fp, drv, disp, kern, q, k, v, *, causal=False, scale=None, return_lse=False, grid=(3, 4, 2),
          aligned=True, span=EVERY, **mask):
    """The Python path's side: a miss, then commit what it launched (out allocated like attention() does).
    ``mask``: window, softcap, sink."""
    tok = run(fp, q, k, v, causal=causal, scale=scale, return_lse=return_lse, registry=disp, **mask)
    assert isinstance(tok, bytes)
    out = torch.empty_like(q) if v.shape[3] == q.shape[3] else q.new_empty(q.shape[:3] + (v.shape[3],))
    lse = q.new_empty(q.shape[:3], dtype=torch.float32) if return_lse else None
    args = python_args(q, k, v, out, lse, causal, scale, **mask)
    commit(fp, tok, disp, kern, (step(drv, args, grid),), out, lse, span=span, aligned=aligned)
    return out, lse


def test_a_repeat_call_launches_exactly_what_the_python_path_would(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    learn(fp, drv, disp, kern, *qkv(), causal=True)
    q, k, v = qkv()  # new tensors: other pointers, same shapes
    out = run(fp, q, k, v, causal=True, registry=disp)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.stride() == q.stride()
    assert out.dtype == q.dtype and out.data_ptr() not in (q.data_ptr(), k.data_ptr(), v.data_ptr())
    call = drv.calls[-1]
    assert call["function"] == 0xF00D and call["grid"] == (3, 4, 2) and call["block"] == (128, 1, 1)
    assert call["shared"] == 4096 and call["stream"] == STREAM and call["extra"] is None
    assert call["slots"] == encode(python_args(q, k, v, out, None, True, None))
    assert fp.stats() == {"hits": 1, "misses": 1, "declined": 0, "recipes": 1}


def test_scale_is_patched_per_call_and_the_default_is_the_python_paths(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    q, k, v = qkv(d=80)
    learn(fp, drv, disp, kern, q, k, v, scale=0.3)
    for scale in (0.125, None, -2.5):
        out = run(fp, q, k, v, scale=scale, registry=disp)
        assert drv.calls[-1]["slots"] == encode(python_args(q, k, v, out, None, False, scale))
    got = struct.unpack("<f", drv.calls[-2]["slots"][SCALE][:4])[0]
    assert got == struct.unpack("<f", struct.pack("<f", 1.0 / math.sqrt(80)))[0]


def test_lse_and_a_bshd_layout_with_another_value_head_dim(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    q, k, v = qkv(layout="bshd", d=64, dv=32)
    ref_out, ref_lse = learn(fp, drv, disp, kern, q, k, v, return_lse=True)
    q2, k2, v2 = qkv(layout="bshd", d=64, dv=32)
    out, lse = run(fp, q2, k2, v2, return_lse=True, registry=disp)
    assert out.shape == ref_out.shape and out.stride() == ref_out.stride()
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape and lse.stride() == ref_lse.stride()
    assert drv.calls[-1]["slots"] == encode(python_args(q2, k2, v2, out, lse, False, None))


def test_anything_the_key_covers_makes_a_new_call_a_miss(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    learn(fp, drv, disp, kern, *qkv())
    others = [
        dict(shape=dict(sq=41)), dict(shape=dict(hq=2)), dict(shape=dict(layout="bshd")),
        dict(shape=dict(dtype=torch.bfloat16)), dict(call=dict(causal=True)), dict(call=dict(return_lse=True)),
        dict(call=dict(registry=Disp())),
    ]
    for case in others:
        q, k, v = qkv(**case.get("shape", {}))
        got = run(fp, q, k, v, **{"registry": disp, **case.get("call", {})})
        assert isinstance(got, bytes), case
    # q, k, v no longer 16-byte aligned (an offset of one fp16 element)
    base = torch.empty(2 * 4 * 40 * 32 + 1, dtype=torch.float16)
    q = base[1:].view(2, 4, 40, 32)
    _, k, v = qkv()
    assert isinstance(run(fp, q, k, v, registry=disp), bytes)
    assert drv.calls == []


def test_calls_that_are_not_for_the_fast_path_are_declined(fp):
    disp = Disp()
    q, k, v = qkv()
    declined = [
        dict(bias=torch.zeros(1)), dict(alibi_slopes=torch.ones(4)), dict(dropout_p=0.1), dict(seed=1),
        dict(scale=1), dict(scale=math.inf), dict(return_lse=1), dict(cu_seqlens_q=torch.zeros(3, dtype=torch.int32)),
        dict(registry="build/x"),
        # values the Python path checks (and raises on, or accepts in another type): never keyed here
        dict(causal="diagonal"), dict(causal=1), dict(window=[4, 0]), dict(window=(4,)), dict(window=(4, 0, 1)),
        dict(window=(1 << 40, 0)), dict(window=(4.0, 0)), dict(window=(True, 0)), dict(softcap=30),
        dict(softcap=-1.0), dict(softcap=math.nan), dict(softcap=math.inf), dict(sink=-1), dict(sink=2.0),
        dict(sink=True), dict(sink=1 << 40),
    ]
    for extra in declined:
        assert run(fp, q, k, v, **{"registry": disp, **extra}) is None, extra
    assert run(fp, q.numpy(), k, v, registry=disp) is None
    assert run(fp, torch.nn.Parameter(q), k, v, registry=disp) is None  # subclasses go the Python way
    assert run(fp, q[0], k[0], v[0], registry=disp) is None  # rank 3 without cu_seqlens: the Python path's error
    assert run(fp, q, k.float(), v, registry=disp) is None
    assert run(fp, q, k, v) is None  # no registry and no JIT dispatcher for this device yet
    assert isinstance(run(fp, q, k, v, jit={-1: disp}), bytes)  # CPU tensors: device index -1
    assert fp.stats()["declined"] == len(declined) + 5


MASKED = [dict(causal="bottom_right"), dict(causal="top_left"), dict(window=(16, 0)), dict(window=(-1, 8)),
          dict(causal=True, window=(32, 5)), dict(causal="bottom_right", sink=4), dict(softcap=30.0),
          dict(causal=True, softcap=2.5, sink=3, window=(7, 0)), dict(sink=5)]


@pytest.mark.parametrize("mask", MASKED, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()))
def test_masks_windows_softcaps_and_sinks_replay_what_the_python_path_would(fp, mask):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    learn(fp, drv, disp, kern, *qkv(), **mask)
    q, k, v = qkv()
    out = run(fp, q, k, v, registry=disp, **mask)
    assert isinstance(out, torch.Tensor), mask
    assert drv.calls[-1]["slots"] == encode(python_args(q, k, v, out, None, scale=None, **{"causal": False, **mask}))
    assert fp.stats()["hits"] == 1
    # any other value of these is another class: a miss (the recorded arguments hold them)
    causal, (left, right) = mask.get("causal", False), mask.get("window", (3, 3))
    others = [dict(mask, causal="bottom_right" if causal in (True, "top_left") else True),
              dict(mask, window=(left + 1, right)), dict(mask, window=(left, right + 1)),
              dict(mask, softcap=mask.get("softcap", 1.0) * 2), dict(mask, sink=mask.get("sink", 0) + 1)]
    for other in others:
        assert isinstance(run(fp, q, k, v, registry=disp, **other), bytes), other


def test_true_and_top_left_are_one_class(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    learn(fp, drv, disp, kern, *qkv(), causal=True)
    q, k, v = qkv()
    out = run(fp, q, k, v, registry=disp, causal="top_left")
    assert isinstance(out, torch.Tensor)
    assert drv.calls[-1]["slots"] == encode(python_args(q, k, v, out, None, True, None))


def test_the_jit_dispatcher_is_looked_up_per_call(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    q, k, v = qkv()
    tok = run(fp, q, k, v, jit={-1: disp})
    out = torch.empty_like(q)
    commit(fp, tok, disp, kern, (step(drv, python_args(q, k, v, out, None, False, None)),), out, None)
    assert isinstance(run(fp, q, k, v, jit={-1: disp}), torch.Tensor)
    assert isinstance(run(fp, q, k, v, jit={-1: Disp()}), bytes)  # another JIT dispatcher (e.g. after a reset)


def test_a_failed_launch_hands_the_call_back_to_the_python_path(fp):
    drv, disp, kern = FakeDriver(len(KINDS), status=201), Disp(), Kernel()  # CUDA_ERROR_INVALID_CONTEXT
    q, k, v = qkv()
    learn(fp, drv, disp, kern, q, k, v)
    assert isinstance(run(fp, q, k, v, registry=disp), bytes) and len(drv.calls) == 1
    assert fp.stats()["hits"] == 0


def test_recipes_keep_their_kernel_and_dispatcher_alive_until_cleared(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    learn(fp, drv, disp, kern, *qkv())
    refs = weakref.ref(disp), weakref.ref(kern)
    del disp, kern
    gc.collect()
    assert all(r() is not None for r in refs)  # a recipe's function handle must not outlive its module
    fp.clear()
    gc.collect()
    assert all(r() is None for r in refs) and fp.stats()["recipes"] == 0


def test_the_cache_is_bounded(mod):
    fp = mod.FastPath(torch.Tensor, Disp, lambda dev: 0, "cpu", 3)
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    for sq in range(1, 8):
        learn(fp, drv, disp, kern, *qkv(sq=sq))
        assert 1 <= fp.stats()["recipes"] <= 3


def test_commit_rejects_what_run_did_not_produce(fp):
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    q, k, v = qkv()
    out = torch.empty_like(q)
    args = python_args(q, k, v, out, None, False, None)
    tok = run(fp, q, k, v, registry=disp)
    main = replay_patches(False)[0]

    def attempt(**over):
        a = dict(tok=tok, disp=disp, steps=(step(drv, args),), span=EVERY, usual=USUAL, split=None, out=out, lse=None)
        a.update(over)
        fp.commit(a["tok"], a["disp"], (kern,), a["steps"], a["span"], a["usual"], (), True, a["split"], a["out"],
                  a["lse"])

    with pytest.raises(ValueError, match="token"):
        attempt(tok=b"nope")
    with pytest.raises(ValueError, match="dispatcher"):
        attempt(disp=Disp())
    with pytest.raises(ValueError, match="non-NULL"):
        attempt(steps=((0,) + step(drv, args)[1:],))
    with pytest.raises(TypeError, match="non-empty"):
        attempt(steps=())
    with pytest.raises(ValueError, match=r"patch \(5, 3, 0\)"):  # the scale into a pointer parameter
        attempt(steps=(step(drv, args, patches=main + ((5, 3, 0),)),))
    with pytest.raises(ValueError, match=r"patch \(0, 0, 9\)"):  # no tensor 9
        attempt(steps=(step(drv, args, patches=((0, 0, 9),)),))
    with pytest.raises(ValueError, match="span"):
        attempt(span=(10, 5, 1, 0, True))
    with pytest.raises(ValueError, match="usual index"):
        attempt(usual=(999,))
    with pytest.raises(ValueError, match="split"):
        attempt(split=(0, 64, 1, 132, 1, 32, 4, 2, 40))
    with pytest.raises(TypeError, match="takes 53 arguments"):
        attempt(steps=(step(drv, args[:10]),))
    with pytest.raises(OverflowError, match="kernel argument 14"):
        attempt(steps=(step(drv, args[:14] + [1 << 40] + args[15:]),))  # seqlen_q is an int32
    with pytest.raises(ValueError, match="dtype"):
        attempt(out=out.float())
    with pytest.raises(TypeError, match="lse"):
        attempt(lse=torch.empty(1))
    assert fp.stats()["recipes"] == 0
    attempt()
    assert fp.stats()["recipes"] == 1


def test_unavailable_says_why(monkeypatch):
    monkeypatch.setattr(torch_fast, "_STATE", {})
    monkeypatch.setenv("FMHA_DSL_TORCH_FAST", "0")
    ok, why = torch_fast.available()
    assert not ok and "FMHA_DSL_TORCH_FAST=0" in why
    monkeypatch.setattr(torch_fast, "_STATE", {})
    monkeypatch.delenv("FMHA_DSL_TORCH_FAST")
    monkeypatch.setattr(torch_fast, "compiler", lambda: None)
    ok, why = torch_fast.available()
    assert not ok and "no C++ compiler" in why
    # start() with a failing build: the callback never runs, wait() says False
    monkeypatch.setattr(torch_fast, "_STATE", {})
    seen = []
    torch_fast.start(seen.append)
    assert torch_fast.wait(60) is False and seen == []


@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
def test_start_never_waits_for_a_build_in_progress(monkeypatch, tmp_path, outcome):
    """attention() calls start() on each new class's first call while the extension builds (10-30 s on a fresh
    machine): those calls must return at once, and their callbacks run once each when the build succeeds (none when
    it fails).  They used to wait for the build on its lock: a fresh H200's second class took 14.8 s instead of
    4.4 s (bench/profile_firstcall.py --empty, session 36)."""
    import threading

    from fmha_dsl.runtime import cext

    monkeypatch.setattr(torch_fast, "_STATE", {})
    monkeypatch.setattr(torch_fast, "_BUILD_LOCK", threading.Lock())  # not a real build's, should one be running
    entered, release = threading.Event(), threading.Event()
    stub = object()

    def slow_load_or_build(path, module, build, what):
        entered.set()
        release.wait(30)
        if outcome == "fails":
            raise cext.NativeUnavailable("stand-in build failed")
        return stub

    monkeypatch.setattr(torch_fast, "library_path", lambda: (str(tmp_path / "x.so"), ["c++"]))
    monkeypatch.setattr(cext, "load_or_build", slow_load_or_build)
    first, second = [], []
    try:
        torch_fast.start(first.append)
        assert entered.wait(30)
        mid_build = threading.Thread(target=lambda: [torch_fast.start(second.append) for _ in range(3)])
        mid_build.start()  # a second class's first calls (three of them), mid-build
        mid_build.join(5)
        assert not mid_build.is_alive(), "start() waited for the build"
        assert torch_fast.loaded() is None and first == second == []
    finally:
        release.set()
    assert torch_fast.wait(30) is (outcome == "succeeds")
    if outcome == "succeeds":
        assert first == second == [stub]  # each callback once, not once per start()
        torch_fast.start(first.append)  # once loaded: at once, here
        assert first == [stub, stub]
    else:
        assert first == second == []
        torch_fast.start(first.append)  # after a failure: returns at once, queues nothing
        assert "ready" not in torch_fast._STATE and first == []


def test_a_build_that_raises_anything_is_remembered_as_unavailable(monkeypatch):
    """An error other than NativeUnavailable in the build (a source file gone, a broken torch) must not kill the
    background thread with a traceback and leave start() queuing callbacks forever: it is the same answer."""
    monkeypatch.setattr(torch_fast, "_STATE", {})

    def broken():
        raise OSError("torch_fast.cpp: No such file or directory")

    monkeypatch.setattr(torch_fast, "library_path", broken)
    ok, why = torch_fast.available()
    assert not ok and "OSError" in why and "No such file" in why
    seen = []
    torch_fast.start(seen.append)
    assert torch_fast.wait(5) is False and seen == [] and "ready" not in torch_fast._STATE


def test_a_declined_call_goes_to_the_python_path_without_a_token(fp):
    """Calls the Python path launches in stages (split-KV) or through another launcher are declined once, so they
    do not pay for a token on every call."""
    disp = Disp()
    q, k, v = qkv()
    tok = run(fp, q, k, v, registry=disp)
    with pytest.raises(ValueError, match="dispatcher"):
        fp.decline(tok, Disp(), EVERY)
    fp.decline(tok, disp, EVERY)
    before = fp.stats()
    assert run(fp, q, k, v, registry=disp) is None
    assert fp.stats()["declined"] == before["declined"] + 1 and fp.stats()["misses"] == before["misses"]
    assert isinstance(run(fp, q, k, v, registry=disp, causal=True), bytes)  # another key is still learnt


def test_a_decode_loop_whose_keys_grow_by_one_stays_on_the_fast_path(fp):
    """One recipe serves every key length of its span: the key length, K's and V's strides (a contiguous K/V's batch
    and head strides follow the length) are re-read per call; lengths outside the span are misses."""
    drv, disp, kern = FakeDriver(len(KINDS)), Disp(), Kernel()
    span = (32, 63, 128, 0, False)  # an octave's lengths that are not multiples of 128 (Dispatcher.seq_span)
    learn(fp, drv, disp, kern, *qkv(sq=1, sk=40), span=span)
    q = qkv(sq=1)[0]
    for sk in range(32, 64):
        _, k, v = qkv(sq=1, sk=sk)  # contiguous: stride_kb = Hk * sk * D
        out = run(fp, q, k, v, registry=disp)
        assert isinstance(out, torch.Tensor), sk
        assert drv.calls[-1]["slots"] == encode(python_args(q, k, v, out, None, False, None)), sk
    # the same loop over a preallocated cache (fixed strides, a growing view)
    kc, vc = torch.randn(2, 2, 64, 32).half(), torch.randn(2, 2, 64, 32).half()
    for sk in (33, 34, 63):
        k, v = kc[:, :, :sk], vc[:, :, :sk]
        out = run(fp, q, k, v, registry=disp)
        assert drv.calls[-1]["slots"] == encode(python_args(q, k, v, out, None, False, None)), sk
    assert fp.stats()["hits"] == 32 + 3 and fp.stats()["misses"] == 1
    for sk in (31, 64, 128):  # another octave
        assert isinstance(run(fp, q, *qkv(sq=1, sk=sk)[1:], registry=disp), bytes), sk
    # a K/V whose batch stride breaks the 16-divisibility the recipe's class was planned with: a miss
    k = torch.randn(2, 2 * 40 * 32 + 8).half()[:, :2 * 40 * 32].view(2, 2, 40, 32)
    assert k.stride(0) % 16 == 8
    assert isinstance(run(fp, q, k, qkv(sq=1, sk=40)[2], registry=disp), bytes)
    # mismatched K/V lengths or an empty key axis: the Python path's answer (an error / zeros)
    assert run(fp, q, *qkv(sq=1, sk=40)[1:2], qkv(sq=1, sk=41)[2], registry=disp) is None
    assert run(fp, q, torch.empty(2, 2, 0, 32).half(), torch.empty(2, 2, 0, 32).half(), registry=disp) is None


def test_a_span_per_alignment_class_and_residue(fp):
    """Recipes of one key side by side: multiples of 128 and the rest of an octave, and an unaligned class."""
    drv, disp = FakeDriver(len(KINDS)), Disp()
    learn(fp, drv, disp, Kernel(), *qkv(sq=1, sk=100), span=(64, 127, 128, 0, False), grid=(1, 1, 1))
    learn(fp, drv, disp, Kernel(), *qkv(sq=1, sk=128), span=(128, 255, 128, 0, True), grid=(2, 2, 2))
    learn(fp, drv, disp, Kernel(), *qkv(sq=1, sk=200), span=(128, 255, 128, 0, False), grid=(3, 3, 3))
    q = qkv(sq=1)[0]
    for sk, grid in ((64, (1, 1, 1)), (127, (1, 1, 1)), (128, (2, 2, 2)), (129, (3, 3, 3)), (255, (3, 3, 3))):
        assert isinstance(run(fp, q, *qkv(sq=1, sk=sk)[1:], registry=disp), torch.Tensor)
        assert drv.calls[-1]["grid"] == grid, sk
    assert isinstance(run(fp, q, *qkv(sq=1, sk=256)[1:], registry=disp), bytes)
    # the unaligned class: q off a 16-byte boundary gets its own recipe, the aligned ones stay
    qm = torch.empty(2 * 4 * 32 + 1).half()[1:].view(2, 4, 1, 32)
    tok = run(fp, qm, *qkv(sq=1, sk=100)[1:], registry=disp)
    out = torch.empty_like(qm)
    _, k, v = qkv(sq=1, sk=100)
    commit(fp, tok, disp, Kernel(), (step(drv, python_args(qm, k, v, out, None, False, None), (9, 9, 9)),), out, None,
           span=(64, 127, 128, 0, False), aligned=False)
    assert isinstance(run(fp, qm, *qkv(sq=1, sk=70)[1:], registry=disp), torch.Tensor)
    assert drv.calls[-1]["grid"] == (9, 9, 9)
    assert isinstance(run(fp, q, *qkv(sq=1, sk=70)[1:], registry=disp), torch.Tensor)
    assert drv.calls[-1]["grid"] == (1, 1, 1)
    assert fp.stats()["recipes"] == 4


def test_split_kv_plans_replay_both_launches_with_their_workspace(fp):
    """A split-KV plan: the split kernel into a fresh fp32 workspace with the call's split count, then the combine
    kernel into out -- slot by slot what runtime/plan.py's SplitLaunch launches for the same call."""
    d_split, d_comb, disp, kern = FakeDriver(len(KINDS)), FakeDriver(len(COMBINE_KINDS)), Disp(), Kernel()
    b, hq, hk, sq, n0, cus, limit, block_dv = 2, 4, 2, 1, 64, 8, 64, 32
    heads, gx = hk, 1  # GQA-packed: one program per K/V head
    sl = SplitLaunch(None, 16, n0, block_dv, cus, 2)
    q, k, v = qkv(b=b, hq=hq, hk=hk, sq=sq, sk=1000)
    tok = run(fp, q, k, v, return_lse=True, registry=disp)
    out, lse = torch.empty_like(q), q.new_empty((b, hq, sq), dtype=torch.float32)

    def program(k, v, out, lse, ws=0):
        """SplitLaunch.launch's split count and arguments (the workspace at ``ws``: O, then the LSE)."""
        s = sl.count(limit, b, hq, sq, k.shape[2], gx * heads * b)
        wst, lst = workspace_strides(b, hq, s, sq, block_dv)
        lws = ws + 4 * b * wst[0] if ws else 0
        return (s,) + tuple(split_args(python_args(q, k, v, out, lse, False, None), ws, lws, wst, lst, hq, s))

    _, a, c = program(k, v, out, lse)
    main, comb = replay_patches(True)
    steps = (step(d_split, a, (gx, heads, b), main, splits=True),
             step(d_comb, c, (sq, hq, b), comb, kinds=COMBINE_KINDS, function=0xC0))
    commit(fp, tok, disp, kern, steps, out, lse, span=(512, 1023, 128, 0, False),
           split=(limit, n0, gx * heads * b, cus, 2, block_dv, hq, b, sq))
    counts = set()
    for sk in (513, 700, 1000, 1023):
        _, k, v = qkv(b=b, hq=hq, hk=hk, sq=sq, sk=sk)
        out, lse = run(fp, q, k, v, return_lse=True, registry=disp)
        ws = struct.unpack("<Q", d_split.calls[-1]["slots"][NAMES.index("Out")])[0]
        s, a, c = program(k, v, out, lse, ws)
        counts.add(s)
        assert d_split.calls[-1]["grid"] == (gx, heads * s, b), sk
        assert d_split.calls[-1]["slots"] == encode(a, SPLIT_TYPES), sk
        assert d_comb.calls[-1]["grid"] == (sq, hq, b) and d_comb.calls[-1]["function"] == 0xC0
        assert d_comb.calls[-1]["slots"] == encode(c, COMBINE_TYPES), sk
    assert len(counts) > 1  # the split count follows the key length within the span
    assert fp.stats()["hits"] == 4


def test_the_split_count_is_the_cost_models(mod):
    cases = [(limit, sk, n0, nprog, cus, occ) for limit in (1, 8, 64, 128)
             for sk in (1, 63, 64, 65, 1000, 8191, 131072) for n0 in (32, 64, 128) for nprog in (1, 8, 64, 200, 2000)
             for cus in (1, 8, 132) for occ in (1, 2, 3)]
    assert all(mod.splits_at(*c) == costmodel.splits_at(*c) for c in cases)
    assert mod.splits_at(0, 8192, 64, 8, 132) == 1  # not a split plan
