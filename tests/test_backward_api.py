"""The backward family through the public API on the CPU: ``attention_backward`` (NumPy: the reference; torch: the
three-stage plan under Triton's interpreter), autograd through ``attention()``, the dispatcher's backward plans, the
argument checks, and ahead-of-time builds of a backward set for AMD and NVIDIA targets without a GPU."""

import json
import os

import numpy as np
import pytest

from interpreted import run_interpreted

import fmha_dsl
from fmha_dsl.errors import UsageError
from fmha_dsl.reference import attention_fwd
from fmha_dsl.reference_bwd import attention_bwd


def _problem(**kw):
    q = np.random.default_rng(0).standard_normal((1, 2, 8, 16)).astype(np.float32)
    out, lse = attention_fwd(q, q, q, **kw)
    return q, out, lse


def test_numpy_attention_backward_is_the_reference():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 9, 8)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    kw = {"causal": True, "bias": bias, "dropout_p": 0.2, "seed": 5}
    out, lse = attention_fwd(q, k, v, **kw)
    do = rng.standard_normal(out.shape).astype(np.float32)
    got = fmha_dsl.attention_backward(q, k, v, out, lse, do, **kw)
    want = attention_bwd(q, k, v, out, lse, do, **kw)
    assert len(got) == 4
    for g, w in zip(got, want):
        assert np.array_equal(g, w)
    out, lse = attention_fwd(q, k, v, causal=True)
    assert len(fmha_dsl.attention_backward(q, k, v, out, lse, do, causal=True)) == 3   # no bias: no dbias


def test_backward_errors_name_the_function_the_argument_and_a_hint():
    q, out, lse = _problem(dropout_p=0.1, seed=3)
    with pytest.raises(UsageError) as e:
        fmha_dsl.attention_backward(q, q, q, out, lse, out, dropout_p=0.1)
    assert "seed" in str(e.value) and "forward" in str(e.value.hint)
    with pytest.raises(UsageError) as e:
        fmha_dsl.attention_backward(q, q, q, out, lse[:, :1], out)
    assert "lse" in str(e.value) and "return_lse" in str(e.value.hint)
    with pytest.raises(UsageError) as e:
        fmha_dsl.attention_backward("q", q, q, out, lse, out)
    assert "attention_backward()" in str(e.value) and "numpy" in str(e.value.hint)


INTERP = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch, fmha_dsl
from fmha_dsl.keys import Problem
from fmha_dsl.reference import attention_fwd
from fmha_dsl.reference_bwd import attention_bwd
from fmha_dsl.errors import UsageError
from fmha_dsl.runtime.dispatch import Dispatcher, declaration_for

def disp(fwd=None, **bwd):
    reg = fmha_dsl.loads(declaration_for(Problem(family="bwd_dq_dk_dv", **bwd), "sm90")).registry(arch="sm90")
    if fwd is not None:
        for e in fmha_dsl.loads(declaration_for(Problem(**fwd), "sm90")).registry(arch="sm90"):
            reg.add(e)
    return Dispatcher(reg, arch="sm90", launcher="interpret")

def np_(x):
    return None if x is None else (x.detach().float().numpy() if hasattr(x, "detach") else np.asarray(x))

def check(name, got, want, tol=2e-5):
    for i, (g, w) in enumerate(zip(got, want)):
        g = np_(g)
        assert g.shape == w.shape, (name, i, g.shape, w.shape)
        assert np.isfinite(g).all(), (name, i)
        err = float(np.abs(g - w).max()) if g.size else 0.0
        assert err <= tol * max(1.0, float(np.abs(w).max())), (name, i, err)
    print(name, "ok")

torch.manual_seed(0)
# 1. autograd through attention(): batch, BSHD q, GQA 4:2, causal bottom-right with Sq != Sk
B, Hq, Hk, Sq, Sk, D = 2, 4, 2, 37, 23, 24
q = torch.randn(B, Sq, Hq, D).transpose(1, 2).requires_grad_()
k, v = torch.randn(B, Hk, Sk, D, requires_grad=True), torch.randn(B, Hk, Sk, D, requires_grad=True)
d = disp(dict(dtype="fp32", hdim_q=D, hdim_v=D, mask="bottom_right", lse=True), dtype="fp32", hdim_q=D, hdim_v=D,
         mask="bottom_right")
o = fmha_dsl.attention(q, k, v, causal="bottom_right", registry=d)
assert o.requires_grad and o.grad_fn is not None
w = torch.randn_like(o)
(o * w).sum().backward()
qn, kn, vn = np_(q), np_(k), np_(v)
oo, ll = attention_fwd(qn, kn, vn, causal="bottom_right")
check("autograd-batch-gqa-causal-bshd", (q.grad, k.grad, v.grad), attention_bwd(qn, kn, vn, oo, ll, w.numpy(),
      causal="bottom_right")[:3])
assert q.grad.transpose(1, 2).is_contiguous()   # the gradient keeps q's memory order
# the custom-op route (what torch.compile traces) gives the eager route's gradients, bit for bit
from fmha_dsl.autograd import ops, _registry_name
q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
o2, _ = ops()[0](q2, k2, v2, None, None, None, None, None, None, "bottom_right", -1, -1, 0.0, 0, 0, None, 0, None,
                 _registry_name(d))
(o2 * w).sum().backward()
assert torch.equal(o2, o) and all(torch.equal(a, b) for a, b in ((q2.grad, q.grad), (k2.grad, k.grad), (v2.grad, v.grad)))
# a loss through the LSE: a clear error, not a gradient silently missing
o3, l3 = fmha_dsl.attention(q, k, v, causal="bottom_right", registry=d, return_lse=True)
try:
    (o3.sum() + l3.sum()).backward()
    raise SystemExit("a gradient through the LSE was accepted")
except UsageError as e:
    assert "lse.detach()" in str(e.hint), e
print("custom-op-route-and-lse ok")
plan = next(p for p in d._plans.values() if type(p).__name__ == "BackwardPlan")
assert [s.family for s in plan.stages] == ["bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"], plan.stages
assert plan.workspace_numel(B, Hq, Sq, Sk, D) >= B * Hq * Sq * (1 + D)

# 2. explicit attention_backward: group mode (max_seqlen given, cu_seqlens as tensors), an empty sequence, ALiBi,
# dropout, window + sink, Dq != Dv, a caller's workspace
cq, ck = [0, 5, 5, 17], [0, 9, 12, 30]
q, k, v = torch.randn(17, 4, 16), torch.randn(30, 2, 16), torch.randn(30, 2, 8)
sl = torch.rand(3, 4)
kw = dict(window=(3, 2), sink=2, dropout_p=0.3, seed=11, offset=5)
cqt, ckt = torch.tensor(cq, dtype=torch.int32), torch.tensor(ck, dtype=torch.int32)
out, lse = attention_fwd(q.numpy(), k.numpy(), v.numpy(), cu_seqlens_q=np.array(cq), cu_seqlens_k=np.array(ck),
                         alibi_slopes=sl.numpy(), **kw)
do = torch.randn(17, 4, 8)
d = disp(dtype="fp32", mode="group", hdim_q=16, hdim_v=8, mask="generic", bias="alibi", dropout=True, sink=True)
ws = torch.empty(100000)
got = fmha_dsl.attention_backward(q, k, v, torch.from_numpy(out), torch.from_numpy(lse), do, cu_seqlens_q=cqt,
                                  cu_seqlens_k=ckt, max_seqlen_q=12, max_seqlen_k=18, alibi_slopes=sl, registry=d,
                                  workspace=ws, **kw)
want = attention_bwd(q.numpy(), k.numpy(), v.numpy(), out, lse, do.numpy(), cu_seqlens_q=np.array(cq),
                     cu_seqlens_k=np.array(ck), alibi_slopes=sl.numpy(), **kw)
check("group-alibi-dropout-window-sink-workspace", got, want[:3])
try:
    fmha_dsl.attention_backward(q, k, v, torch.from_numpy(out), torch.from_numpy(lse), do, cu_seqlens_q=cqt,
                                cu_seqlens_k=ckt, max_seqlen_q=12, max_seqlen_k=18, alibi_slopes=sl, registry=d,
                                workspace=torch.empty(10), **kw)
    raise SystemExit("a short workspace was accepted")
except UsageError as e:
    assert "workspace_numel" in str(e.hint), e
print("short-workspace ok")
# a window of another octave is a plan of its own in attention_backward()'s cache
n = len(d.fast_bwd)
kw2 = dict(kw, window=(20, 2))
g = dict(cu_seqlens_q=np.array(cq), cu_seqlens_k=np.array(ck), alibi_slopes=sl.numpy())
out2, lse2 = attention_fwd(q.numpy(), k.numpy(), v.numpy(), **g, **kw2)
got = fmha_dsl.attention_backward(q, k, v, torch.from_numpy(out2), torch.from_numpy(lse2), do, cu_seqlens_q=cqt,
                                  cu_seqlens_k=ckt, max_seqlen_q=12, max_seqlen_k=18, alibi_slopes=sl, registry=d,
                                  **kw2)
check("window-of-another-octave", got, attention_bwd(q.numpy(), k.numpy(), v.numpy(), out2, lse2, do.numpy(), **g,
                                                     **kw2)[:3])
assert len(d.fast_bwd) == n + 1, list(d.fast_bwd)

# 3. a bias broadcast over heads, with its gradient through autograd; soft-cap; deterministic
B, H, S = 2, 2, 20
q, k, v = (torch.randn(B, H, S, 16, requires_grad=True) for _ in range(3))
bias = torch.randn(B, 1, S, S, requires_grad=True)
d = disp(dict(dtype="fp32", hdim_q=16, hdim_v=16, mask="top_left", bias="bias", logits=True, lse=True),
         dtype="fp32", hdim_q=16, hdim_v=16, mask="top_left", bias="bias", logits=True, dbias=True)
torch.use_deterministic_algorithms(False)
o = fmha_dsl.attention(q, k, v, bias=bias, softcap=2.5, causal=True, registry=d)
w = torch.randn_like(o)
(o * w).sum().backward()
qn, kn, vn, bn = np_(q), np_(k), np_(v), np_(bias)
oo, ll = attention_fwd(qn, kn, vn, bias=bn, softcap=2.5, causal=True)
check("autograd-bias-grad-softcap", (q.grad, k.grad, v.grad, bias.grad),
      attention_bwd(qn, kn, vn, oo, ll, w.numpy(), bias=bn, softcap=2.5, causal=True))
assert bias.grad.shape == bias.shape

# 4. deterministic: bit-identical twice
q, k, v = torch.randn(1, 4, 40, 16), torch.randn(1, 1, 50, 16), torch.randn(1, 1, 50, 16)
out, lse = attention_fwd(q.numpy(), k.numpy(), v.numpy(), causal=True)
do = torch.randn(1, 4, 40, 16)
d = disp(dtype="fp32", hdim_q=16, hdim_v=16, mask="top_left", deterministic=True)
a = fmha_dsl.attention_backward(q, k, v, torch.from_numpy(out), torch.from_numpy(lse), do, causal=True,
                                deterministic=True, registry=d)
b = fmha_dsl.attention_backward(q, k, v, torch.from_numpy(out), torch.from_numpy(lse), do, causal=True,
                                deterministic=True, registry=d)
assert all(torch.equal(x, y) for x, y in zip(a, b))
check("deterministic", a, attention_bwd(q.numpy(), k.numpy(), v.numpy(), out, lse, do.numpy(), causal=True)[:3])

# 5. fp16 head dim 40 (padded to 64); rows that see no key get zero gradients, never NaN
q, k, v = torch.randn(1, 2, 20, 40).half(), torch.randn(1, 2, 12, 40).half(), torch.randn(1, 2, 12, 40).half()
out, lse = attention_fwd(q.numpy(), k.numpy(), v.numpy(), window=(1, 0), scale=0.2, causal="top_left")
assert np.isinf(lse).any()
do = torch.randn(1, 2, 20, 40).half()
d = disp(dtype="fp16", hdim_q=40, hdim_v=40, mask="generic")
got = fmha_dsl.attention_backward(q, k, v, torch.from_numpy(out), torch.from_numpy(lse), do, window=(1, 0), scale=0.2,
                                  causal="top_left", registry=d)
want = attention_bwd(q.float().numpy(), k.float().numpy(), v.float().numpy(), out.astype(np.float32), lse,
                     do.float().numpy(), window=(1, 0), scale=0.2, causal="top_left")
check("fp16-hdim40-fully-masked", got, want[:3], 2e-2)
assert not got[0][:, :, 12:].any()

# 6. group mode: the given max_seqlen_q/k are the dropout counter's strides, on the kernels and the reference alike
cq, ck = np.array([0, 2, 6], np.int32), np.array([0, 4, 9], np.int32)
gen = torch.Generator().manual_seed(7)
gq, gk, gv, gdo = (torch.randn(n, 2, 16, generator=gen) for n in (6, 9, 9, 6))
dg = disp(dict(dtype="fp32", mode="group", hdim_q=16, hdim_v=16, lse=True, dropout=True),
          dtype="fp32", mode="group", hdim_q=16, hdim_v=16, dropout=True)
kw = dict(dropout_p=0.5, seed=3, max_seqlen_q=16, max_seqlen_k=16)
tc = dict(cu_seqlens_q=torch.from_numpy(cq), cu_seqlens_k=torch.from_numpy(ck))
nc = dict(cu_seqlens_q=cq, cu_seqlens_k=ck)
o, l = fmha_dsl.attention(gq, gk, gv, return_lse=True, registry=dg, **tc, **kw)
on, ln = fmha_dsl.attention(gq.numpy(), gk.numpy(), gv.numpy(), return_lse=True, **nc, **kw)
check("group-dropout-given-maxima", (o, l), (on, ln))
own = fmha_dsl.attention(gq.numpy(), gk.numpy(), gv.numpy(), dropout_p=0.5, seed=3, **nc)   # true maxima 4, 5
assert np.abs(own - on).max() > 0.1   # another keep-mask: the maxima matter
got = fmha_dsl.attention_backward(gq, gk, gv, o, l, gdo, registry=dg, **tc, **kw)
check("group-dropout-given-maxima-bwd", got,
      fmha_dsl.attention_backward(gq.numpy(), gk.numpy(), gv.numpy(), on, ln, gdo.numpy(), **nc, **kw))

# 7. the dispatcher plans and explains backward problems
p = Problem(family="bwd_dq_dk_dv", dtype="fp16", hdim_q=40, hdim_v=40, mask="generic", seqlen_q=20, seqlen_k=12)
rows = d.explain(p)
assert rows and rows[0]["selected"] and "bwd" in rows[0]["name"], rows[:1]
print("ALL OK")
'''


def test_backward_end_to_end_under_the_interpreter():
    run_interpreted(INTERP, "ALL OK", timeout=300)


BWD_SET = """kernel_set bwd_ci {
    backend(triton)
    arch(gfx942, gfx950, sm90)
    kernel main {
        signature { family(bwd_dq_dk_dv) dtype(bf16) mode(group) hdim(128) mask(causal) bias(no) dropout(false)
                    deterministic(false) }
        algorithm { pipeline(bwd_async) tile(32, 64, 128, 32, 128, 32, 64, 128, 128) wave(4, 1, 1, 4, 1, 1, 4, 1, 1)
                    padding(true, true, false, false) }
    }
}
"""


def test_a_backward_set_builds_for_amd_and_nvidia_without_a_gpu(tmp_path):
    pytest.importorskip("triton")
    from fmha_dsl.build import build

    src = tmp_path / "bwd.fmha"
    src.write_text(BWD_SET)
    res = build(fmha_dsl.load(str(src)), str(tmp_path / "out"), jobs=2, cache_dir=str(tmp_path / "cache"))
    assert not res.failures, res.failures
    assert res.by_arch == {"gfx942": 1, "gfx950": 1, "sm90": 1}
    reg = json.loads((tmp_path / "out" / "registry.json").read_text())
    for k in reg["kernels"]:
        b = k["build"]
        kind = "cubin" if k["gfx_arch"] == "sm90" else "hsaco"
        assert b["binary_kind"] == kind and b["entry"] == "fmha_bwd_dq_dk_dv"
        assert b["params"][:7] == ["Q", "K", "V", "dO", "L2", "D", "DQacc"]
        for role, entry in (("dot_do_o", "fmha_bwd_dot_do_o"), ("convert_dq", "fmha_bwd_convert_dq")):
            assert b[role]["entry"] == entry and b[role]["binary_kind"] == kind
            assert os.path.getsize(tmp_path / "out" / b[role]["binary"]) == b[role]["size"]
        assert b["block_n"] == 64 and b["grid"].startswith("[cdiv(max_seqlen_k, BLOCK_N), nhead_k")


def test_every_target_and_head_dim_has_backward_candidates():
    """The tile tables cover every head dim the Triton backend declares, on every target (fp16 and bf16), without a
    single-stage loop where a staged one exists, and rank the cost model's choice first."""
    from fmha_dsl.data import load
    from fmha_dsl.first_use import Builder
    from fmha_dsl.keys import Problem

    b = Builder()
    for arch in ("sm80", "sm90", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1201"):
        for hq, hv in load("triton")["hdims"]:
            for dt in ("fp16", "bf16"):
                c = b.candidates(Problem(family="bwd_dq_dk_dv", dtype=dt, hdim_q=hq, hdim_v=hv, seqlen_q=1000,
                                         seqlen_k=1000, mask="top_left"), arch)
                assert c, (arch, hq, hv, dt)
                assert all(e.sig["family"] == "bwd_dq_dk_dv" and e.alg["pipeline"] != "bwd" for e in c
                           if arch.startswith("sm")), [e.name for e in c]


def test_a_deterministic_kernel_serves_a_problem_that_does_not_ask_for_one_but_not_the_reverse():
    from fmha_dsl.first_use import Builder
    from fmha_dsl.keys import Problem
    from fmha_dsl.runtime.match import mismatches

    p = Problem(family="bwd_dq_dk_dv", dtype="bf16", hdim_q=128, hdim_v=128, seqlen_q=4096, seqlen_k=4096)
    cands = Builder().candidates(p, "sm90", limit=64)
    kinds = {e.sig["deterministic"] for e in cands}
    assert kinds == {False, True}
    assert all(not mismatches(e, p) for e in cands)
    strict = p.model_copy(update={"deterministic": True})
    assert all(bool(mismatches(e, strict)) == (not e.sig["deterministic"]) for e in cands)
    assert all(e.sig["deterministic"] for e in Builder().candidates(strict, "sm90", limit=64))


def test_the_shape_matrix_takes_backward_classes():
    from fmha_dsl.runtime.tune import expand_shapes, load_shapes

    classes = expand_shapes(load_shapes())
    bwd = [(c, pts) for c, pts in classes if c["family"] == "bwd_dq_dk_dv"]
    assert len(bwd) == 8 and all(not c["lse"] for c, _ in bwd)
    assert all(pts == [(s, s, 16384 // s, 16, 16) for s in (512, 1024, 2048, 4096, 8192, 16384)] for _, pts in bwd)
    with pytest.raises(UsageError, match="unknown family 'back'"):
        expand_shapes({"classes": [{"family": "back", "seqlens": [1]}]})


def test_torch_backward_arguments_get_located_errors():
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 2, 8, 16)
    out, lse = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8)
    cases = [
        (dict(out=out.half()), "usage.dtype", "`out` must have q's dtype"),
        (dict(lse=lse.half()), "usage.dtype", "`lse` must be float32"),
        (dict(dout=torch.randn(1, 2, 8, 8)), "usage.shape", "`dout` must have the forward output's shape"),
        (dict(lse=torch.randn(1, 2, 9)), "usage.shape", "`lse` must be the forward's LSE"),
        (dict(k=torch.randn(1, 3, 8, 16), v=torch.randn(1, 3, 8, 16)), "usage.shape", "multiple of key heads"),
        (dict(), "usage.device", "torch tensors run on a GPU"),
    ]
    for over, rule, words in cases:
        a = dict(q=q, k=q, v=q, out=out, lse=lse, dout=out)
        a.update(over)
        with pytest.raises(UsageError) as e:
            fmha_dsl.attention_backward(a["q"], a["k"], a["v"], a["out"], a["lse"], a["dout"])
        assert e.value.rule == rule and words in str(e.value) and "attention_backward()" in str(e.value), e.value


def test_a_misaligned_forward_output_takes_the_unaligned_plan():
    """The dot_do_o stage of an aligned build promises 16-byte aligned ``out`` rows (``bwd_abi.DOT_ALIGNED``): a call
    whose ``out`` breaks that -- here a view one element into its buffer -- must plan unaligned kernels, not launch
    aligned ones on it (the other tensors alone would allow the aligned build)."""
    torch = pytest.importorskip("torch")
    from fmha_dsl.attention_bwd import _aligned

    def t():
        return torch.zeros(1, 2, 8, 16)
    q, k, v, lse, dout, dq, dk, dv = (t() for _ in range(8))
    out = t()
    assert _aligned((q, k, v, out, lse, dout, dq, dk, dv))
    shifted = torch.zeros(1 * 2 * 8 * 16 + 1)[1:].view(1, 2, 8, 16)
    assert not _aligned((q, k, v, shifted, lse, dout, dq, dk, dv))
    odd_rows = torch.zeros(1, 2, 8, 24)[..., :16]  # row stride 24: not a multiple of 16 elements
    assert not _aligned((q, k, v, odd_rows, lse, dout, dq, dk, dv))


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_backward_workspace_holds_d_l2_and_dq_acc_apart_and_aligned(deterministic):
    """The workspace's parts -- D and the LSE in log2 units (one fp32 per query row each), then the atomic dQ
    accumulator -- never overlap, each starts 64-byte aligned (16 fp32), and the size is exactly theirs: what a caller
    allocating ``workspace_numel`` once relies on."""
    from fmha_dsl.kernels import bwd_abi

    b, h, sq, sk, d = 3, 5, 77, 50, 96
    ws = bwd_abi.workspace(b, h, sq, sk, d, 64, deterministic)
    rows = b * h * sq
    assert ws["d_offset"] == 0 and ws["d_strides"] == (h * sq, sq)
    assert ws["l_offset"] >= rows and ws["l_offset"] % 16 == 0
    assert ws["acc_offset"] >= ws["l_offset"] + rows and ws["acc_offset"] % 16 == 0
    acc = 0 if deterministic else rows * d
    assert ws["numel"] == ws["acc_offset"] + acc and ws["splits"] == (0 if deterministic else 1)
    assert ws["l_offset"] - rows < 16 and ws["acc_offset"] - ws["l_offset"] - rows < 16   # no slack past alignment


def test_unaligned_backward_problems_get_no_tma_candidates():
    """The TMA pipeline (bwd_trload) builds only for aligned arguments: an unaligned problem's candidates never
    include it (they would all fail to compile and leave fewer kernels to time), an aligned one's do."""
    from fmha_dsl.first_use import Builder
    from fmha_dsl.keys import Problem

    p = Problem(family="bwd_dq_dk_dv", dtype="bf16", hdim_q=128, hdim_v=128, seqlen_q=4096, seqlen_k=4096)
    pipes = {al: {e.alg["pipeline"] for e in Builder().candidates(p, "sm90", al, limit=64)} for al in (True, False)}
    assert "bwd_trload" in pipes[True] and pipes[False] == {"bwd_async"}
