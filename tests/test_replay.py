"""The serving replay path (fmha_dsl/replay.py) on the CPU with a recording fake kernel: what a recorded call
launched is replayed with the new tensors' addresses (offsets inside a tensor kept), a call of another class is not
replayed, an address that breaks a 16-byte promise is refused; and bench/retune_shipped.py rebuilds every shipped
decision key from a representative problem."""

import json
import os
import sys

import pytest

from fmha_dsl import replay
from fmha_dsl.kernels import paged_abi
from fmha_dsl.kernels.fwd_abi import COMBINE_ARGS


class FakeKernel:
    needs_objects = False

    def __init__(self):
        self.calls = []

    def launch(self, grid, args, stream=0):
        self.calls.append((tuple(grid), list(args)))


class FakeStage:
    def __init__(self, family):
        self.entry = type("E", (), {"sig": {"family": family, "dtype": "fp16"}})()


class FakePlan:
    def __init__(self):
        self.stages = (FakeStage("fwd_pagedkv"), FakeStage("fwd_splitkv_combine"))
        self.entry = self.stages[0].entry
        self._aligned_idx = tuple(paged_abi.ARGS.index(a) for a in paged_abi.ARGS if a[0] in ("Q", "K"))


def _tensors(seed, out=True):
    """A paged_attention call's tensors in the replay order (q, k, v, out, lse, alibi, cu_seqlens_q, seqlens_k,
    block_table, kv_indptr, kv_indices, workspace)."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(4, 8, 64, generator=g).half()
    kc = torch.randn(8, 16, 2, 64, generator=g).half()
    o = torch.empty_like(q) if out else None
    ws = torch.empty(1000)
    return (q, kc, kc.clone(), o, None, None, torch.arange(5).int(), torch.ones(4).int(), torch.zeros(4, 2).int(),
            None, None, ws)


def _steps(t, kern, ckern):
    """Launch arguments as the plan would make them: pointers at the tensors' addresses (the LSE workspace at an
    offset inside the workspace), sizes elsewhere."""
    ptr = [0 if x is None else x.data_ptr() for x in t]
    a = [0] * len(paged_abi.ARGS)
    names = [n for n, _ in paged_abi.ARGS]
    for n, i in (("Q", 0), ("K", 1), ("V", 2), ("cu_seqlens_q", 6), ("seqlens_k", 7), ("Table", 8)):
        a[names.index(n)] = ptr[i]
    a[names.index("Out")], a[names.index("Lse")] = ptr[11], ptr[11] + 4 * 512
    a[names.index("nhead_q")] = 8
    c = [0] * len(COMBINE_ARGS)
    c[0], c[1], c[2] = ptr[11], ptr[11] + 4 * 512, ptr[3]
    c[5] = 7
    return [(kern, (1, 16, 4), a), (ckern, (1, 8, 4), c)]


@pytest.fixture
def python_only(monkeypatch):
    """The Python replay (the extension's Replayer out of the way)."""
    pytest.importorskip("torch")
    replay.start()
    monkeypatch.setitem(replay._STATE, "loaded", lambda: None)
    monkeypatch.delitem(replay._STATE, "replayer", raising=False)


SC = ("paged", 1, 32)


def test_a_recorded_call_replays_with_new_addresses(python_only):
    torch = pytest.importorskip("torch")
    kern, ckern = FakeKernel(), FakeKernel()
    first = _tensors(0)
    replay.record(first, set(), SC, FakePlan(), _steps(first, kern, ckern))
    second = _tensors(1)
    assert replay.run(second, SC) == ()
    want = _steps(second, FakeKernel(), FakeKernel())
    assert kern.calls[-1] == (want[0][1], want[0][2]) and ckern.calls[-1] == (want[1][1], want[1][2])
    n = len(kern.calls)
    assert replay.run(second, ("paged", 1, 64)) is None and len(kern.calls) == n   # another max_seqlen_k
    assert replay.run(second, ("paged", [1], 32)) is None                          # unhashable: never ...
    replay.record(second, set(), ("paged", [1], 32), FakePlan(), _steps(second, kern, ckern))
    assert replay.run(second, ("paged", [1], 32)) is None                          # ... nor recorded
    base = torch.empty(4 * 8 * 64 + 8).half()
    shifted = (base[1:1 + 4 * 8 * 64].view(4, 8, 64),) + second[1:]          # Q 2 bytes past a 16-byte boundary
    assert replay.run(shifted, SC) is None and len(kern.calls) == n       # refused: nothing launched
    # the checked path then records the misaligned call (a binary without the promise) under its own key ...
    plain, cplain = FakeKernel(), FakeKernel()
    unpromised = FakePlan()
    unpromised._aligned_idx = ()
    replay.record(shifted, set(), SC, unpromised, _steps(shifted, plain, cplain))
    assert replay.run(shifted, SC) == () and len(plain.calls) == 1
    assert replay.run(second, SC) == () and len(kern.calls) == n + 1 and len(plain.calls) == 1   # ... not ours


def test_what_a_recorded_call_allocated_is_allocated_again(python_only):
    kern, ckern = FakeKernel(), FakeKernel()
    first = _tensors(3)
    replay.record(first, {3}, ("paged", "alloc"), FakePlan(), _steps(first, kern, ckern))
    second = _tensors(4, out=False)                                           # out=None: the recipe allocates it
    (out,) = replay.run(second, ("paged", "alloc"))
    assert out.shape == first[3].shape and out.dtype == first[3].dtype and out.stride() == first[3].stride()
    assert ckern.calls[-1][1][2] == out.data_ptr()                             # the combine writes the new out
    assert replay.run(_tensors(5), ("paged", "alloc")) is None             # a caller's out is another call


def test_record_declines_what_it_cannot_replay(python_only):
    kern, ckern = FakeKernel(), FakeKernel()
    t = _tensors(2)
    steps = _steps(t, kern, ckern)
    steps[0][2][0] = 12345678  # an address no tensor of the call holds
    replay.record(t, set(), ("paged", "decline"), FakePlan(), steps)
    assert replay.run(t, ("paged", "decline")) is None


def test_views_of_one_buffer_keep_their_own_places(python_only):
    """K and V as views of one buffer (a combined KV cache; V's address lies inside K's span): each launch pointer
    is tied to the tensor it is the base of, so a later call whose K and V come from different buffers replays V at
    its own address (tied by span, V became K's address plus the offset: another buffer's V)."""
    torch = pytest.importorskip("torch")
    kern, ckern = FakeKernel(), FakeKernel()

    def call(k_buf, v_buf, seed):
        t = list(_tensors(seed))
        t[1], t[2] = k_buf[:, 0], v_buf[:, 1]
        return tuple(t)
    kv = [torch.randn(8, 2, 16, 2, 64).half() for _ in range(3)]
    first = call(kv[0], kv[0], 8)
    replay.record(first, set(), ("paged", "fused"), FakePlan(), _steps(first, kern, ckern))
    second = call(kv[1], kv[2], 9)
    assert replay.run(second, ("paged", "fused")) == ()
    names = [n for n, _ in paged_abi.ARGS]
    args = kern.calls[-1][1]
    assert args[names.index("K")] == kv[1][:, 0].data_ptr() and args[names.index("V")] == kv[2][:, 1].data_ptr()


def test_a_tensor_in_two_places_is_not_recorded(python_only):
    """One tensor passed as K and V: which argument a launch pointer came from is ambiguous, and a later call with
    two tensors would replay V at K's address -- such a call is not recorded (the checked path runs it); two empty
    tensors (address 0) are not taken for one."""
    torch = pytest.importorskip("torch")
    kern, ckern = FakeKernel(), FakeKernel()
    t = list(_tensors(10))
    t[2] = t[1]
    t = tuple(t)
    replay.record(t, set(), ("paged", "alias"), FakePlan(), _steps(t, kern, ckern))
    assert replay.run(t, ("paged", "alias")) is None
    assert replay.run(_tensors(11), ("paged", "alias")) is None
    e = list(_tensors(12))
    e[9], e[10] = torch.empty(0, dtype=torch.int32), torch.empty(0, dtype=torch.int32)   # unused table arrays
    e = tuple(e)
    replay.record(e, set(), ("paged", "empty"), FakePlan(), _steps(e, kern, ckern))
    assert replay.run(e, ("paged", "empty")) == ()


def test_the_extensions_replayer_launches_what_the_python_path_recorded(monkeypatch):
    """The C++ Replayer (runtime/torch_replay.h, built with the torch fast path) against a ctypes stand-in for the
    driver: the same parameter slots the recorded launches had, with the new call's addresses and allocations."""
    import struct

    from fakes import FakeDriver

    from fmha_dsl.runtime import native, torch_fast
    from fmha_dsl.runtime.abi import code_of

    torch = pytest.importorskip("torch")
    if torch_fast.compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    mod = torch_fast.load()
    replay.start()
    types = [[t.replace("{dtype}", "fp16") for _, t in abi] for abi in (paged_abi.ARGS, COMBINE_ARGS)]
    kinds = [native.kinds(ts) for ts in types]
    drivers = [FakeDriver(len(k)) for k in kinds]

    class NativeFake(FakeKernel):
        def __init__(self, i):
            super().__init__()
            self.fast_spec = (drivers[i].address, 0x1000 + i, 128, 0, kinds[i], 0)

    monkeypatch.setitem(replay._STATE, "replayer", mod.Replayer(torch.Tensor, lambda dev: 0x5EED, 8))
    kern, ckern = NativeFake(0), NativeFake(1)
    first = _tensors(6)
    replay.record(first, {3}, ("paged", "native"), FakePlan(), _steps(first, kern, ckern))
    second = _tensors(7, out=False)
    (out,) = replay.run(second, ("paged", "native"))
    assert kern.calls == [] and ckern.calls == []            # launched by the extension, not through Python
    full = second[:3] + (out,) + second[4:]
    for drv, ts, (_, grid, args) in zip(drivers, types, _steps(full, FakeKernel(), FakeKernel())):
        call = drv.calls[-1]
        assert call["grid"] == grid and call["stream"] == 0x5EED and call["block"] == (128, 1, 1)
        for slot, ty, value in zip(call["slots"], ts, args):
            fmt = "<" + code_of(ty)[0]
            assert slot[:struct.calcsize(fmt)] == struct.pack(fmt, value), (ty, value)
    assert replay._STATE["replayer"].stats()["hits"] == 1
    assert replay.run(second, ("paged", "other")) is None               # another class: not replayed
    base = torch.empty(4 * 8 * 64 + 8).half()
    shifted = (base[1:1 + 4 * 8 * 64].view(4, 8, 64),) + second[1:]          # Q off a 16-byte boundary
    n = len(drivers[0].calls)
    assert replay.run(shifted, ("paged", "native")) is None and len(drivers[0].calls) == n   # its own class


def test_retune_rebuilds_every_shipped_decision_key():
    from fmha_dsl.keys import Problem
    from fmha_dsl.runtime import decisions

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
    try:
        from retune_shipped import problem_of
    finally:
        sys.path.pop(0)
    path = os.path.join(os.path.dirname(__file__), "..", "fmha_dsl", "data", "tuned", "sm90_nvidia-h200.json")
    keys = json.load(open(path))["decisions"]
    assert len(keys) > 100
    for key in keys:
        c = problem_of(key)
        assert c is not None, key
        p = Problem(family=c["family"], dtype=c["dtype"], batch=c["batch"], nhead_q=c["hq"], nhead_k=c["hk"],
                    seqlen_q=c["sq"], seqlen_k=c["sk"], max_seqlen_q=c["sq"], max_seqlen_k=c["sk"], hdim_q=c["dq"],
                    hdim_v=c["dv"], mode=c["mode"], mask="top_left" if c["causal"] else "no",
                    lse=c["lse"] and c["family"] == "fwd", deterministic=c["deterministic"])
        assert decisions.key(p) == key
