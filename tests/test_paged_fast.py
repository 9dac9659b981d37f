"""The serving replay path (fmha_dsl/paged_fast.py) on the CPU with a recording fake kernel: what a recorded call
launched is replayed with the new tensors' addresses (offsets inside a tensor kept), a call of another class is not
replayed, an address that breaks a 16-byte promise is refused; and bench/retune_shipped.py rebuilds every shipped
decision key from a representative problem."""

import json
import os
import sys

import pytest

from fmha_dsl import paged_fast
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


def _tensors(seed):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(4, 8, 64, generator=g).half()
    kc = torch.randn(8, 16, 2, 64, generator=g).half()
    out = torch.empty_like(q)
    ws = torch.empty(1000)
    return q, kc, kc.clone(), out, None, None, torch.arange(5).int(), torch.ones(4).int(), torch.zeros(4, 2).int(), \
        None, ws


def _steps(t, kern, ckern):
    """Launch arguments as the plan would make them: pointers at the tensors' addresses (the LSE workspace at an
    offset inside the workspace), sizes elsewhere."""
    ptr = [0 if x is None else x.data_ptr() for x in t]
    a = [0] * len(paged_abi.ARGS)
    names = [n for n, _ in paged_abi.ARGS]
    for n, i in (("Q", 0), ("K", 1), ("V", 2), ("cu_seqlens_q", 6), ("seqlens_k", 7), ("Table", 8)):
        a[names.index(n)] = ptr[i]
    a[names.index("Out")], a[names.index("Lse")] = ptr[10], ptr[10] + 4 * 512
    a[names.index("nhead_q")] = 8
    c = [0] * len(COMBINE_ARGS)
    c[0], c[1], c[2] = ptr[10], ptr[10] + 4 * 512, ptr[3]
    c[5] = 7
    return [(kern, (1, 16, 4), a), (ckern, (1, 8, 4), c)]


def test_a_recorded_call_replays_with_new_addresses():
    torch = pytest.importorskip("torch")
    paged_fast.start()
    kern, ckern = FakeKernel(), FakeKernel()
    first = _tensors(0)
    k = paged_fast.key(first[:3], first[3:], ("paged", 1, 32))
    paged_fast.record(k, FakePlan(), _steps(first, kern, ckern), first, ((4, 8, 64), None), 0)
    second = _tensors(1)
    k2 = paged_fast.key(second[:3], second[3:], ("paged", 1, 32))
    assert k2 == k and paged_fast.get(k2) is not None
    assert paged_fast.get(k2).replay(second)
    want = _steps(second, FakeKernel(), FakeKernel())
    assert kern.calls[-1] == (want[0][1], want[0][2]) and ckern.calls[-1] == (want[1][1], want[1][2])
    other = paged_fast.key(second[:3], second[3:], ("paged", 1, 64))          # another max_seqlen_k: not this class
    assert other != k and paged_fast.get(other) is None
    assert paged_fast.key(second[:3], second[3:], ("paged", [1], 32)) is None   # unhashable: never replayed
    base = torch.empty(4 * 8 * 64 + 8).half()
    shifted = (base[1:1 + 4 * 8 * 64].view(4, 8, 64),) + second[1:]          # Q 2 bytes past a 16-byte boundary
    n = len(kern.calls)
    assert not paged_fast.get(k).replay(shifted) and len(kern.calls) == n     # refused: nothing launched


def test_record_declines_what_it_cannot_replay():
    pytest.importorskip("torch")
    paged_fast.start()
    kern, ckern = FakeKernel(), FakeKernel()
    t = _tensors(2)
    steps = _steps(t, kern, ckern)
    steps[0][2][0] = 12345678  # an address no tensor of the call holds
    k = paged_fast.key(t[:3], t[3:], ("paged", "decline"))
    paged_fast.record(k, FakePlan(), steps, t, ((4, 8, 64), None), 0)
    assert paged_fast.get(k) is None


def test_retune_rebuilds_every_shipped_decision_key():
    from fmha_dsl.keys import Problem
    from fmha_dsl.runtime import autotune

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
        assert autotune.key(p) == key
