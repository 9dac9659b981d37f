"""fmha_dsl.attention on a GPU: every feature against the NumPy reference, and against torch SDPA where SDPA has
the feature.  Kernels are compiled on first use (registry=None) -- a session fixture compiles the ones these
tests need in parallel first -- except in the prebuilt-registry tests.

    python3 -P -m pytest -q tests/test_gpu.py -p no:cacheprovider      (see bench/README_device.md)
"""

import math
import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

import fmha_dsl  # noqa: E402
from fmha_dsl.first_use import Builder
from fmha_dsl.errors import FmhaError  # noqa: E402
from fmha_dsl.keys import Problem  # noqa: E402
from fmha_dsl.reference import attention_fwd, philox_uniform  # noqa: E402

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-4}
LSE_TOL = 2e-3


def P(dtype="fp16", d=64, dv=None, **kw):
    return Problem(dtype=dtype, hdim_q=d, hdim_v=dv or d, **kw)


# the kernels the tests below use (compiled in parallel up front; a missing one is compiled on first use)
NEEDED = (
    [P(dtype=dt, d=d, mask=m, lse=True) for dt in ("fp16", "bf16") for d in (64, 128) for m in ("no", "top_left")]
    + [P(mask=m) for m in ("no", "top_left")]
    + [P(d=128), P(d=128, mask="top_left"), P(mode="group", lse=True), P(mode="group", mask="top_left", lse=True),
       P(mask="top_left", sink=True, lse=True), P(bias="bias"), P(bias="alibi"), P(bias="alibi", mask="top_left"),
       P(mask="top_left", logits=True), P(dtype="fp32", dropout=True), P(dropout=True),
       P(mode="group", dropout=True), P(vlayout="c"), P(dtype="fp32", lse=True), P(d=80, lse=True),
       P(dtype="bf16", d=96, dv=64)]
)


@pytest.fixture(scope="session", autouse=True)
def warm_kernels():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from fmha_dsl.precompile import precompile
    from fmha_dsl.runtime.dispatch import detect_arch

    # first-use selection times its candidates: a few per class keep the suite short (bench_default measures the
    # default of 24)
    os.environ.setdefault("FMHA_DSL_TUNE_CANDIDATES", "4")
    n = precompile(NEEDED, detect_arch(), jobs=min(16, os.cpu_count() or 1), limit=4)
    print(f"\n[test_gpu] compiled {n} kernels into the artifact cache")
    # the torch fast path (built in the background on the first GPU call): wait for it, so that every repeat
    # call below runs through it, whatever the build's speed
    from fmha_dsl.runtime import torch_fast

    fmha_dsl.attention(*(rnd(1, 2, 16, 64) for _ in range(3)))
    assert torch_fast.wait(600), torch_fast.available()


def rnd(*shape, dtype=torch.float16, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def npy(x):
    return None if x is None else x.detach().float().cpu().numpy()


def reference(q, k, v, **kw):
    """The NumPy reference on the same (rounded) inputs, as float32 torch tensors on the GPU."""
    for name in ("bias", "alibi_slopes"):
        if kw.get(name) is not None:
            kw[name] = npy(kw[name])
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        if kw.get(name) is not None:
            kw[name] = np.asarray(kw[name].cpu() if torch.is_tensor(kw[name]) else kw[name])
    out, lse = attention_fwd(npy(q), npy(k), npy(v), **kw)
    return torch.from_numpy(out).cuda(), torch.from_numpy(lse).cuda()


def close(got, want, dtype, what="out"):
    got, want = got.float(), want.float()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert not torch.isnan(got).any(), f"{what}: NaN"
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin), f"{what}: -inf pattern differs"
    assert torch.equal(got[~fin], want[~fin]), what
    tol = TOL[dtype] if what == "out" else LSE_TOL
    err = (got[fin] - want[fin]).abs().max().item() if fin.any() else 0.0
    assert err <= tol * (1 + want[fin].abs().max().item() if fin.any() else 1), f"{what}: max error {err}"


def build_set(tmp_path, name: str, body: str) -> str:
    """Build ``kernel_set NAME { backend(triton) arch(<this GPU>) BODY }`` into ``tmp_path/out``; the directory."""
    from fmha_dsl.build import build
    from fmha_dsl.runtime.dispatch import detect_arch

    src = tmp_path / f"{name}.fmha"
    src.write_text(f"kernel_set {name} {{\n    backend(triton)\n    arch({detect_arch()})\n{body}}}\n")
    res = build(fmha_dsl.load(str(src)), str(tmp_path / "out"), jobs=min(16, os.cpu_count() or 1))
    assert not res.failures, res.failures
    return str(tmp_path / "out")


def check_group_mode(disp, cu_q, cu_k, heads, d, **kw):
    """fp16 varlen attention through ``disp`` (with LSE) against the reference."""
    cq, ck = (torch.tensor(c, dtype=torch.int32, device="cuda") for c in (cu_q, cu_k))
    q, k, v = rnd(cu_q[-1], heads, d), rnd(cu_k[-1], heads, d), rnd(cu_k[-1], heads, d)
    out, lse = fmha_dsl.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True, registry=disp, **kw)
    r_out, r_lse = reference(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **kw)
    close(out, r_out, torch.float16)
    close(lse, r_lse, torch.float16, "lse")


# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_sdpa_and_the_reference(dtype, d, causal):
    dt = DT[dtype]
    q, k, v = rnd(2, 4, 256, d, dtype=dt), rnd(2, 4, 256, d, dtype=dt), rnd(2, 4, 256, d, dtype=dt)
    out, lse = fmha_dsl.attention(q, k, v, causal=causal, return_lse=True)
    assert out.dtype == dt and lse.dtype == torch.float32 and lse.shape == (2, 4, 256)
    close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal), dt)
    r_out, r_lse = reference(q, k, v, causal=causal)
    close(out, r_out, dt)
    close(lse, r_lse, dt, "lse")
    out2 = fmha_dsl.attention(q, k, v, causal=causal)  # the no-LSE kernel
    close(out2, r_out, dt)


@pytest.mark.parametrize("sq,sk,causal", [(77, 131, "bottom_right"), (131, 77, "top_left"), (1, 200, True),
                                          (200, 1, "bottom_right"), (300, 300, "top_left")])
def test_unaligned_lengths_and_both_corners(sq, sk, causal):
    q, k, v = rnd(1, 3, sq, 64), rnd(1, 3, sk, 64), rnd(1, 3, sk, 64)
    out, lse = fmha_dsl.attention(q, k, v, causal=causal, return_lse=True)
    r_out, r_lse = reference(q, k, v, causal=causal)
    close(out, r_out, torch.float16)
    close(lse, r_lse, torch.float16, "lse")


def test_fully_masked_rows_give_zero_and_minus_infinity():
    q, k, v = rnd(2, 2, 70, 64), rnd(2, 2, 30, 64), rnd(2, 2, 30, 64)
    out, lse = fmha_dsl.attention(q, k, v, causal="bottom_right", return_lse=True)
    assert torch.all(out[:, :, :40] == 0) and torch.all(lse[:, :, :40] == -math.inf)
    assert not torch.isnan(out).any()
    close(out, reference(q, k, v, causal="bottom_right")[0], torch.float16)


@pytest.mark.parametrize("hk", [2, 1])
def test_gqa_and_mqa(hk):
    q, k, v = rnd(2, 8, 128, 64), rnd(2, hk, 128, 64), rnd(2, hk, 128, 64)
    out = fmha_dsl.attention(q, k, v)
    close(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True), torch.float16)
    close(out, reference(q, k, v)[0], torch.float16)


def test_bshd_views_keep_their_layout():
    q, k, v = (rnd(2, 200, 4, 128).transpose(1, 2) for _ in range(3))
    out = fmha_dsl.attention(q, k, v)
    assert out.shape == (2, 4, 200, 128) and out.transpose(1, 2).is_contiguous()
    close(out, F.scaled_dot_product_attention(q, k, v), torch.float16)


def test_column_major_v():
    q, k = rnd(2, 4, 96, 64), rnd(2, 4, 96, 64)
    v = rnd(2, 4, 64, 96).transpose(2, 3)  # logical [B, H, S, D], key axis contiguous
    assert v.stride(2) == 1
    out = fmha_dsl.attention(q, k, v)
    close(out, F.scaled_dot_product_attention(q, k, v), torch.float16)


@pytest.mark.parametrize("with_max", [False, True])
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
def test_group_mode(with_max, causal):
    lens_q, lens_k = [5, 0, 130, 64, 1], [9, 7, 100, 64, 0]
    cq = torch.tensor([0] + np.cumsum(lens_q).tolist(), dtype=torch.int32, device="cuda")
    ck = torch.tensor([0] + np.cumsum(lens_k).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = rnd(sum(lens_q), 4, 64), rnd(sum(lens_k), 2, 64), rnd(sum(lens_k), 2, 64)
    kw = dict(max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k)) if with_max else {}
    out, lse = fmha_dsl.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=causal, return_lse=True, **kw)
    assert out.shape == (sum(lens_q), 4, 64) and lse.shape == (4, sum(lens_q))
    r_out, r_lse = reference(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=causal)
    close(out, r_out, torch.float16)
    close(lse, r_lse, torch.float16, "lse")
    if not causal:  # each sequence against SDPA
        for b in range(len(lens_q)):
            if lens_q[b] and lens_k[b]:
                qs = q[cq[b]:cq[b + 1]].transpose(0, 1)[None]
                ks = k[ck[b]:ck[b + 1]].transpose(0, 1)[None]
                vs = v[ck[b]:ck[b + 1]].transpose(0, 1)[None]
                want = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)[0].transpose(0, 1)
                close(out[cq[b]:cq[b + 1]], want, torch.float16)


@pytest.mark.parametrize("kw", [dict(window=(16, 8)), dict(window=(32, 0), causal=True),
                                dict(window=(8, 0), sink=4), dict(window=(-1, 5), causal="top_left"),
                                dict(causal="bottom_right", sink=3), dict(window=(0, 0)),
                                dict(window=(8, 0), sink=np.int64(4)), dict(window=(np.int32(8), 0), sink=np.int8(0))])
def test_windows_and_sinks(kw):   # (NumPy integers: as Python's)
    q, k, v = rnd(2, 2, 150, 64), rnd(2, 2, 170, 64), rnd(2, 2, 170, 64)
    out, lse = fmha_dsl.attention(q, k, v, return_lse=True, **kw)
    r_out, r_lse = reference(q, k, v, **kw)
    close(out, r_out, torch.float16)
    close(lse, r_lse, torch.float16, "lse")


def test_elementwise_bias():
    q, k, v = rnd(2, 4, 128, 64), rnd(2, 4, 160, 64), rnd(2, 4, 160, 64)
    bias = rnd(2, 1, 128, 160)
    out = fmha_dsl.attention(q, k, v, bias=bias)
    close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias), torch.float16)
    close(out, reference(q, k, v, bias=bias)[0], torch.float16)
    full = rnd(2, 4, 128, 160)
    close(fmha_dsl.attention(q, k, v, bias=full), reference(q, k, v, bias=full)[0], torch.float16)


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi(per_batch, causal):
    q, k, v = rnd(2, 4, 100, 64), rnd(2, 4, 120, 64), rnd(2, 4, 120, 64)
    slopes = torch.rand(2, 4, device="cuda") if per_batch else torch.rand(4, device="cuda")
    out = fmha_dsl.attention(q, k, v, alibi_slopes=slopes, causal=causal)
    close(out, reference(q, k, v, alibi_slopes=slopes, causal=causal)[0], torch.float16)


def test_softcap():
    q, k, v = rnd(2, 4, 128, 64, scale=3.0), rnd(2, 4, 128, 64, scale=3.0), rnd(2, 4, 128, 64)
    out = fmha_dsl.attention(q, k, v, softcap=5.0, causal=True)
    close(out, reference(q, k, v, softcap=5.0, causal=True)[0], torch.float16)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_dropout_is_bit_exact(dtype):
    """q = 0 makes every probability 1/Sk; V = identity makes out[i, j] = keep(i, j) / (Sk (1 - p))."""
    dt = DT[dtype]
    B, H, S, p, seed, offset = 2, 3, 64, 0.3, (1 << 64) - 12345, 77
    q = torch.zeros(B, H, S, S, device="cuda", dtype=dt)
    k = rnd(B, H, S, S, dtype=dt)
    v = torch.eye(S, device="cuda", dtype=dt).expand(B, H, S, S).contiguous()
    out = fmha_dsl.attention(q, k, v, dropout_p=p, seed=seed, offset=offset)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    for b in range(B):
        for h in range(H):
            keep = philox_uniform(seed, offset + ((b * H + h) * S + i) * S + j) >= np.float32(p)
            assert np.array_equal(npy(out[b, h]) > 0, keep), (b, h)
    # and on random inputs, against the reference
    q, k, v = rnd(B, H, 100, 64, dtype=dt), rnd(B, H, 90, 64, dtype=dt), rnd(B, H, 90, 64, dtype=dt)
    out = fmha_dsl.attention(q, k, v, dropout_p=p, seed=seed, offset=offset)
    close(out, reference(q, k, v, dropout_p=p, seed=seed, offset=offset)[0], dt)


def test_dropout_in_group_mode_and_seed_from_torch():
    lens = [33, 0, 70]
    cu = torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = rnd(sum(lens), 2, 64), rnd(sum(lens), 2, 64), rnd(sum(lens), 2, 64)
    out = fmha_dsl.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, dropout_p=0.2, seed=5)
    close(out, reference(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, dropout_p=0.2, seed=5)[0], torch.float16)
    torch.manual_seed(1)
    a = fmha_dsl.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, dropout_p=0.2)
    torch.manual_seed(1)
    b = fmha_dsl.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, dropout_p=0.2)
    assert torch.equal(a, b)


def test_fp32_is_ieee():
    q, k, v = (rnd(2, 2, 96, 64, dtype=torch.float32) for _ in range(3))
    out, lse = fmha_dsl.attention(q, k, v, return_lse=True)
    r_out, r_lse = reference(q, k, v)
    close(out, r_out, torch.float32)
    close(lse, r_lse, torch.float32, "lse")


@pytest.mark.parametrize("dtype,dq,dv", [("fp16", 80, 80), ("bf16", 96, 64)])
def test_head_dims_that_are_not_powers_of_two(dtype, dq, dv):
    dt = DT[dtype]
    q, k, v = rnd(2, 4, 100, dq, dtype=dt), rnd(2, 4, 100, dq, dtype=dt), rnd(2, 4, 100, dv, dtype=dt)
    kw = dict(return_lse=True) if dq == dv else {}
    res = fmha_dsl.attention(q, k, v, **kw)
    out = res[0] if kw else res
    assert out.shape == (2, 4, 100, dv)
    close(out, reference(q, k, v)[0], dt)
    close(out, F.scaled_dot_product_attention(q, k, v), dt)


def test_empty_problems():
    q, k = rnd(2, 4, 0, 64), rnd(2, 4, 50, 64)
    out, lse = fmha_dsl.attention(q, k, k, return_lse=True)
    assert out.shape == (2, 4, 0, 64) and lse.shape == (2, 4, 0)
    q, k = rnd(2, 4, 10, 64), rnd(2, 4, 0, 64)
    out, lse = fmha_dsl.attention(q, k, k, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)
    cq = torch.tensor([0, 4, 9], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, 0, 0], dtype=torch.int32, device="cuda")
    out, lse = fmha_dsl.attention(rnd(9, 4, 64), rnd(0, 4, 64), rnd(0, 4, 64), cu_seqlens_q=cq, cu_seqlens_k=ck,
                                  return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


def test_large_problem_against_sdpa():
    q, k, v = rnd(2, 16, 4096, 128), rnd(2, 16, 4096, 128), rnd(2, 16, 4096, 128)
    out = fmha_dsl.attention(q, k, v, causal=True)
    close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), torch.float16)


# ---------------------------------------------------------------------------------------------------------
# the run-time machinery
# ---------------------------------------------------------------------------------------------------------
def test_every_launcher_agrees():
    from fmha_dsl.runtime import native
    from fmha_dsl.runtime.dispatch import Dispatcher

    q, k, v = rnd(2, 4, 128, 64), rnd(2, 4, 128, 64), rnd(2, 4, 128, 64)
    a = fmha_dsl.attention(q, k, v, causal=True)
    outs = {}
    for name in ("native", "cuda", "triton"):
        d = Dispatcher(None, builder=Builder(), launcher=name)
        outs[name] = fmha_dsl.attention(q, k, v, causal=True, registry=d)
        [plan] = d.fast.values()
        assert plan._stage.kernel(0).kind == name
        assert torch.equal(a, outs[name]), name
    # the default ("auto") is the native launcher wherever it compiles (it does on this machine)
    auto = Dispatcher(None, builder=Builder())
    fmha_dsl.attention(q, k, v, registry=auto)
    assert native.available()[0] and next(iter(auto.fast.values()))._stage.kernel(0).kind == "native"
    # a value that does not fit its 32-bit parameter is a located error before anything is launched
    from fmha_dsl.runtime.abi import FWD_NAMES

    bad = [0] * len(FWD_NAMES)
    bad[FWD_NAMES.index("seqlen_q")] = 1 << 40
    with pytest.raises(FmhaError) as ei:
        next(iter(auto.fast.values()))._stage.kernel(0).launch((1, 1, 1), bad, 0)
    assert ei.value.rule == "runtime.args" and "1099511627776" in ei.value.message


def test_plan_run_directly():
    from fmha_dsl.runtime.dispatch import Dispatcher

    disp = Dispatcher(None, builder=Builder())
    q, k, v = rnd(2, 4, 200, 64), rnd(2, 4, 200, 64), rnd(2, 4, 200, 64)
    plan = disp.plan(P(mask="bottom_right", lse=True, batch=2, nhead_q=4, nhead_k=4, seqlen_q=200, seqlen_k=200))
    out, lse = torch.empty_like(q), torch.empty(2, 4, 200, device="cuda")
    plan.run(q, k, v, out, lse, window=(-1, 0), bottom_right=True)
    r_out, r_lse = reference(q, k, v, causal="bottom_right")
    close(out, r_out, torch.float16)
    close(lse, r_lse, torch.float16, "lse")


def test_streams_and_cuda_graphs():
    q, k, v = rnd(2, 4, 128, 64), rnd(2, 4, 128, 64), rnd(2, 4, 128, 64)
    want = fmha_dsl.attention(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = fmha_dsl.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(got, want)
    # capture into a graph, replay on new data
    sq, sk, sv = q.clone(), k.clone(), v.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        fmha_dsl.attention(sq, sk, sv)  # warm-up outside capture
        with torch.cuda.graph(g, stream=s):
            gout = fmha_dsl.attention(sq, sk, sv)
    torch.cuda.synchronize()
    q2 = rnd(2, 4, 128, 64)
    sq.copy_(q2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(gout, fmha_dsl.attention(q2, k, v))


def fast_path():
    import sys

    return sys.modules["fmha_dsl.attention"]._fast_path


@pytest.mark.parametrize("kw,shape", [
    (dict(), dict()), (dict(causal=True, return_lse=True), dict()), (dict(scale=0.3), dict(hk=1)),
    (dict(causal=True), dict(layout="bshd", d=128)), (dict(return_lse=True), dict(d=40, sq=77, sk=131)),
    (dict(), dict(dtype=torch.bfloat16, d=96, dv=64)),
    (dict(causal="bottom_right"), dict(sq=64, sk=200)), (dict(causal=True, window=(32, 0)), dict()),
    (dict(softcap=20.0, window=(16, 16)), dict()), (dict(causal="bottom_right", sink=4, window=(24, 0)),
                                                     dict(sq=48, sk=160, dtype=torch.bfloat16)),
])
def test_the_torch_fast_path_replays_the_python_path(kw, shape):
    """A repeat call (same shapes and strides, new tensors) runs in C++: bit-identical to the Python path's launch
    of the same kernel, and right against the reference."""
    fp = fast_path()
    b, hq, hk, sq, sk = 2, 4, shape.get("hk", 2), shape.get("sq", 128), shape.get("sk", 96)
    d, dv, dt = shape.get("d", 64), shape.get("dv", shape.get("d", 64)), shape.get("dtype", torch.float16)

    def make(h, s, dd):
        if shape.get("layout") == "bshd":
            return rnd(b, s, h, dd, dtype=dt).transpose(1, 2)
        return rnd(b, h, s, dd, dtype=dt)

    q, k, v = make(hq, sq, d), make(hk, sk, d), make(hk, sk, dv)
    for _ in range(2):  # the first launch of a kernel on a device loads it; the next one is learnt
        fmha_dsl.attention(q, k, v, **kw)
    before = fp.stats()
    other = fmha_dsl.attention(q.clone(), k.clone(), v.clone(), **kw)  # hit: new pointers
    fast = fmha_dsl.attention(q, k, v, **kw)
    after = fp.stats()
    import sys

    amod = sys.modules["fmha_dsl.attention"]
    assert after["hits"] == before["hits"] + 2 and after["misses"] == before["misses"]  # split-KV plans too
    saved, amod._fast_run = amod._fast_run, None
    try:
        python = fmha_dsl.attention(q, k, v, **kw)  # the Python path alone
    finally:
        amod._fast_run = saved
    pairs = list(zip(*(r if isinstance(r, tuple) else (r,) for r in (python, other, fast))))
    for p, o, f in pairs:
        assert torch.equal(p, o) and torch.equal(p, f) and p.stride() == f.stride()
    ref = reference(q, k, v, **{key: val for key, val in kw.items() if key != "return_lse"})
    close(pairs[0][2], ref[0], dt)
    if kw.get("return_lse"):
        close(pairs[1][2], ref[1], dt, "lse")


def test_the_torch_fast_path_refuses_what_the_python_path_refuses():
    """A scale beyond float32's range (after the kernels' multiply by log2(e)) and a batch-mode max_seqlen below
    the length: the C++ fast path declines them, so the checked path raises -- never a NaN output replayed."""
    from fmha_dsl import UsageError

    fp = fast_path()
    q, k, v = rnd(1, 2, 128, 64), rnd(1, 2, 128, 64), rnd(1, 2, 128, 64)
    for _ in range(3):   # learnt by the fast path
        want = fmha_dsl.attention(q, k, v, scale=0.2)
    hits = fp.stats()["hits"]
    fmha_dsl.attention(q, k, v, scale=0.2)
    assert fp.stats()["hits"] == hits + 1   # (replayed in C++)
    declined = fp.stats()["declined"]
    for kw, text in ((dict(scale=1e39), "scale must be a finite number of magnitude"),
                     (dict(scale=-3e38), "scale must be a finite number of magnitude"),
                     (dict(max_seqlen_q=64), "max_seqlen_q=64 is below the longest sequence (128)")):
        with pytest.raises(UsageError, match=__import__("re").escape(text)):
            fmha_dsl.attention(q, k, v, **{"scale": 0.2, **kw})
    assert fp.stats()["declined"] == declined + 3
    hits = fp.stats()["hits"]   # upper bounds are fine, and stay on the fast path
    got = fmha_dsl.attention(q, k, v, scale=0.2, max_seqlen_q=128, max_seqlen_k=200)
    assert fp.stats()["hits"] == hits + 1 and torch.equal(got, want)


def test_the_torch_fast_path_on_side_streams_in_graphs_and_with_misaligned_pointers():
    fp = fast_path()
    q, k, v = rnd(1, 4, 256, 64), rnd(1, 4, 256, 64), rnd(1, 4, 256, 64)
    want = fmha_dsl.attention(q, k, v)
    hits = fp.stats()["hits"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = fmha_dsl.attention(q, k, v)
        got.record_stream(s)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(got, want) and fp.stats()["hits"] == hits + 1
    sq = q.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        fmha_dsl.attention(sq, k, v)
        with torch.cuda.graph(g, stream=s):
            gout = fmha_dsl.attention(sq, k, v)  # a hit, captured
    assert fp.stats()["hits"] >= hits + 3
    q2 = rnd(1, 4, 256, 64)
    sq.copy_(q2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(gout, fmha_dsl.attention(q2, k, v))
    # the same shapes and strides at a 2-byte offset: another key (the 16-byte promise), the unaligned kernel
    base = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
    qm = base[1:].view_as(q)
    qm.copy_(q)
    first = fmha_dsl.attention(qm, k, v)  # its own first-use decision: maybe another tile, so not bit-equal to want
    close(first, want, torch.float16)
    assert torch.equal(fmha_dsl.attention(qm, k, v), first)  # the repeat runs the same kernel
    # another launcher: declined once learnt, so its calls pay no token
    from fmha_dsl.runtime.dispatch import Dispatcher

    d = Dispatcher(None, builder=Builder(), launcher="cuda")
    for _ in range(3):
        assert torch.equal(fmha_dsl.attention(q, k, v, registry=d), want)
    st = fp.stats()
    fmha_dsl.attention(q, k, v, registry=d)
    assert fp.stats()["declined"] == st["declined"] + 1 and fp.stats()["misses"] == st["misses"]


def test_prebuilt_registry_prefers_unpadded_kernels(tmp_path):
    reg = build_set(tmp_path, "gpu_test", """\
    kernel exact {
        signature { family(fwd) dtype(fp16) mode(batch) hdim(64) mask(no | causal) lse(true) }
        algorithm { pipeline(qr_async) tile(128, 64, *, *, *, *) padding(false, false, false, false) }
    }
    kernel padded {
        signature { family(fwd) dtype(fp16) mode(batch) hdim(64) mask(no | causal) lse(true) }
        algorithm { pipeline(qr_async) tile(128, 64, *, *, *, *) padding(true, true, true, true) }
    }
""")
    from fmha_dsl.runtime.dispatch import Dispatcher

    disp = Dispatcher(reg)
    for s, padded in ((256, 0), (200, 1)):
        q, k, v = rnd(2, 4, s, 64), rnd(2, 4, s, 64), rnd(2, 4, s, 64)
        out, lse = fmha_dsl.attention(q, k, v, causal=True, return_lse=True, registry=disp)
        plan = disp.plan(P(mask="top_left", lse=True, seqlen_q=s, seqlen_k=s))
        assert plan.entry.alg["pad_s"] == padded
        r_out, r_lse = reference(q, k, v, causal=True)
        close(out, r_out, torch.float16)
        close(lse, r_lse, torch.float16, "lse")
    # a path works too, and a problem the set does not cover names the closest kernels
    q = rnd(1, 2, 64, 128)
    with pytest.raises(FmhaError) as ei:
        fmha_dsl.attention(q, q, q, registry=reg)
    assert ei.value.rule == "dispatch.no-kernel" and "hdim(128, 128)" in ei.value.hint


def test_no_build_makes_a_missing_kernel_an_error(monkeypatch, tmp_path):
    import sys

    monkeypatch.setenv("FMHA_DSL_CACHE_DIR", str(tmp_path))  # an empty cache: the kernel is missing
    monkeypatch.setenv("FMHA_DSL_NO_BUILD", "1")
    jit = {}
    monkeypatch.setattr(sys.modules["fmha_dsl.attention"], "_JIT", jit)
    monkeypatch.setattr(sys.modules["fmha_dsl.api_dispatch"], "_JIT", jit)
    monkeypatch.setattr(sys.modules["fmha_dsl.api_dispatch"], "_DISPATCHERS", {})  # no dispatcher from earlier tests
    q = rnd(1, 2, 64, 48)
    with pytest.raises(FmhaError) as ei:
        fmha_dsl.attention(q, q, q, bias=rnd(1, 1, 64, 64))
    assert ei.value.rule == "dispatch.no-kernel"


def test_device_mismatch_is_a_usage_error():
    q = rnd(1, 2, 64, 64)
    with pytest.raises(fmha_dsl.UsageError) as ei:
        fmha_dsl.attention(q, q.cpu(), q)
    assert ei.value.rule == "usage.device"


@pytest.mark.parametrize("d", [40, 72])
def test_arguments_without_16_divisible_strides(d):
    """Head dims whose row strides are not multiples of 16 elements (and an unaligned view) get a binary
    compiled without the 16-divisibility promise, and the same result as the reference."""
    q, k, v = rnd(1, 2, 96, d), rnd(1, 2, 96, d), rnd(1, 2, 96, d)
    out, lse = fmha_dsl.attention(q, k, v, causal=True, return_lse=True)
    r_out, r_lse = reference(q, k, v, causal=True)
    close(out, r_out, torch.float16)
    close(lse, r_lse, torch.float16, "lse")
    base = rnd(1 * 2 * 64 * 64 + 1)[1:].view(1, 2, 64, 64)  # a pointer 2 bytes off a 16-byte boundary
    out = fmha_dsl.attention(base, base, base)
    close(out, reference(base, base, base)[0], torch.float16)


def test_alignment_is_decided_per_argument():
    """Each of q, k, v made misaligned on its own (base pointer, or one row stride) selects the unaligned
    variant; aligned arguments the aligned binary; both agree with the reference."""
    from fmha_dsl.runtime.dispatch import Dispatcher

    def shifted(t):  # same values, base pointer 2 bytes past a 16-byte boundary
        flat = torch.empty(t.numel() + 1, device="cuda", dtype=t.dtype)
        view = flat[1:].view(t.shape)
        view.copy_(t)
        return view

    def wide_rows(t):  # same values, row stride 72 elements (not a multiple of 16)
        w = torch.zeros(*t.shape[:-1], 72, device="cuda", dtype=t.dtype)
        w[..., : t.shape[-1]] = t
        return w[..., : t.shape[-1]]

    q, k, v = rnd(1, 2, 64, 64), rnd(1, 2, 64, 64), rnd(1, 2, 64, 64)
    want = reference(q, k, v)[0]
    cases = [("none", (q, k, v), False)]
    for i, name in enumerate("qkv"):
        for how, fn in (("pointer", shifted), ("stride", wide_rows)):
            args = [q, k, v]
            args[i] = fn(args[i])
            cases.append((f"{name} {how}", tuple(args), True))
    for what, args, unaligned in cases:
        d = Dispatcher(None, builder=Builder())
        close(fmha_dsl.attention(*args, registry=d), want, torch.float16, what)
        [plan] = d.fast.values()
        assert (plan.entry.alg["constraint"] == "unaligned") == unaligned, what


def test_prebuilt_aligned_registry_rejects_unaligned_arguments_clearly(tmp_path):
    from fmha_dsl.build import build
    from fmha_dsl.runtime.dispatch import detect_arch

    src = tmp_path / "one.fmha"
    src.write_text("kernel_set one { backend(triton) arch(*) kernel k { signature { family(fwd) dtype(fp16) hdim(64) } "
                   "algorithm { pipeline(qr_async) tile(64, 64, *, *, *, *) padding(true, true, true, true) } } }")
    arch = detect_arch()
    build(fmha_dsl.load(str(src)), str(tmp_path / "b"), arch=arch, jobs=1)
    base = rnd(1 * 2 * 64 * 64 + 1)[1:].view(1, 2, 64, 64)
    with pytest.raises(FmhaError) as ei:
        fmha_dsl.attention(base, base, base, registry=str(tmp_path / "b"))
    assert ei.value.rule == "dispatch.no-kernel" and "16-divisible" in ei.value.render()


def test_attention_follows_a_tuned_table_and_ignores_another_devices(tmp_path):
    """Build two padded kernels of one class (16 and 128 query rows per program), tune them on this GPU over a
    decode and a prefill point, then: attention(registry=...) runs the kernel the table ranks first at each point
    (its output checked against SDPA), explain() reports measured and predicted times; the same table relabelled
    as another GPU's is ignored with a SeqtuneDeviceWarning and the cost model decides."""
    import json
    import warnings

    from fmha_dsl.build import build
    from fmha_dsl.registry import Registry
    from fmha_dsl.runtime.dispatch import Dispatcher, detect_arch
    from fmha_dsl.runtime.tune import tune
    from fmha_dsl.seqtune import SeqtuneDeviceWarning

    arch = detect_arch()
    src = tmp_path / "two.fmha"
    src.write_text(f"""
kernel_set two {{
    backend(triton) arch({arch}) family(fwd) dtype(fp16) mode(batch) hdim(64) mask(no)
    pipeline(qr_async) padding(true, true, true, true)
    kernel small {{ algorithm {{ tile(16, 64, 64, 64, 64, 64) wave_m0(4) }} }}
    kernel large {{ algorithm {{ tile(128, 64, 64, 64, 64, 64) wave_m0(8) }} }}
}}
""")
    out_dir = tmp_path / "b"
    res = build(fmha_dsl.load(str(src)), str(out_dir), arch=arch, jobs=2)
    assert not res.failures, res.failures
    shapes = tmp_path / "m.json"
    shapes.write_text(json.dumps({"name": "t", "classes": [
        {"dtype": "fp16", "hdim": 64, "mask": "no", "nhead_q": 16, "seqlens": [1], "seqlens_k": [8192],
         "batch": [4]},
        {"dtype": "fp16", "hdim": 64, "mask": "no", "nhead_q": 16, "seqlens": [4096], "batch": [4]}]}))
    r = tune(str(out_dir), shapes=str(shapes), warmup_ms=5, rep_ms=20)
    assert r.measured == 4 and r.failed == 0
    reg = Registry.load(str(out_dir / "registry.json"))
    assert reg.seqtune["device"]["name"] == torch.cuda.get_device_name()
    names = {e.identifier: e.name for e in reg}
    for sq, sk in ((1, 8192), (4096, 4096)):
        disp = Dispatcher(str(out_dir))
        prob = P(seqlen_q=sq, seqlen_k=sk, batch=4, nhead_q=16, nhead_k=16)
        rows = disp.explain(prob)
        measured = {row["name"]: row["measured_us"] for row in rows if not row.get("excluded")}
        assert all(t and t > 0 for t in measured.values()) and len(measured) == 2
        fastest = min(measured, key=measured.get)
        assert rows[0]["selected"] and rows[0]["name"] == fastest and rows[0]["source"] == "seqtune"
        q, k, v = rnd(4, 16, sq, 64), rnd(4, 16, sk, 64), rnd(4, 16, sk, 64)
        out = fmha_dsl.attention(q, k, v, registry=disp)
        [plan] = disp.fast.values()
        assert names[plan.entry.identifier] == fastest
        close(out, F.scaled_dot_product_attention(q, k, v), torch.float16)
    # the same table, said to be from another GPU: ignored with a warning, the cost model decides
    doc = json.loads((out_dir / "registry.json").read_text())
    doc["seqtune"]["device"]["name"] = "Some Other GPU"
    (out_dir / "registry.json").write_text(json.dumps(doc))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        disp = Dispatcher(str(out_dir))
    assert any(issubclass(w.category, SeqtuneDeviceWarning) and "Some Other GPU" in str(w.message) for w in seen)
    assert disp.table is None
    rows = disp.explain(P(seqlen_q=1, seqlen_k=8192, batch=4, nhead_q=16, nhead_k=16))
    assert rows[0]["source"] == "cost-model"
    q, k, v = rnd(4, 16, 1, 64), rnd(4, 16, 8192, 64), rnd(4, 16, 8192, 64)
    close(fmha_dsl.attention(q, k, v, registry=disp), F.scaled_dot_product_attention(q, k, v), torch.float16)


def test_split_kv_kernels_against_the_reference(tmp_path):
    """A built split-KV set (split kernel + combine): decode, GQA, causal bottom-right, window + sink, group mode,
    an explicit num_splits problem, a user stream and CUDA graph capture; only split kernels in the registry."""
    from fmha_dsl.runtime.dispatch import Dispatcher

    out = build_set(tmp_path, "gpu_split", """\
    family(fwd_splitkv)
    dtype(fp16 | bf16)
    mode(batch | group)
    mask(no | causal)
    lse(true)
    sink(false | true)
    pipeline(qr_async)
    padding(true, true, true, true)
    max_splits_log2(3)
    kernel d64 {
        signature { hdim(64) }
        algorithm { tile_m0(16) tile_n0(64) tile_k0(64) tile_n1(64) tile_k0max(64) wave_m0(4) }
    }
    kernel d128 {
        signature { hdim(128) }
        algorithm { tile_m0(16) tile_n0(64) tile_k0(128) tile_n1(128) tile_k0max(128) wave_m0(4) }
    }
""")
    disp = Dispatcher(out)
    for dt, d, hk, sq, sk, kw in (("fp16", 128, 8, 1, 5000, {}), ("bf16", 64, 2, 7, 3001, {"causal": "bottom_right"}),
                                  ("fp16", 64, 8, 40, 777, {"window": (100, 0), "sink": 4}),
                                  ("fp16", 128, 1, 3, 20, {})):
        dtype = DT[dt]
        q, k, v = rnd(2, 8, sq, d, dtype=dtype), rnd(2, hk, sk, d, dtype=dtype), rnd(2, hk, sk, d, dtype=dtype)
        out, lse = fmha_dsl.attention(q, k, v, return_lse=True, registry=disp, **kw)
        plan = next(p for p in disp.fast.values() if p.entry.sig["dtype"] == dt and p.entry.sig["hdim_q"] == d)
        assert plan.splits == 8 and len(plan.stages) == 2
        r_out, r_lse = reference(q, k, v, **kw)
        close(out, r_out, dtype)
        close(lse, r_lse, dtype, "lse")
    check_group_mode(disp, [0, 1, 1, 9], [0, 900, 1000, 4000], 8, 64, causal="bottom_right")
    # an explicit split-KV problem with 3 splits, on a side stream, then captured in a CUDA graph
    q, k, v = rnd(1, 8, 4, 64), rnd(1, 8, 2048, 64), rnd(1, 8, 2048, 64)
    plan = disp.plan(Problem(family="fwd_splitkv", dtype="fp16", hdim_q=64, hdim_v=64, lse=True, num_splits=3,
                             seqlen_q=4, seqlen_k=2048, nhead_q=8, nhead_k=8))
    assert plan.splits == 3
    o, l = torch.empty_like(q), torch.empty(1, 8, 4, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    plan.run(q, k, v, o, l, stream=s)
    torch.cuda.current_stream().wait_stream(s)
    r_out, r_lse = reference(q, k, v)
    close(o, r_out, torch.float16)
    close(l, r_lse, torch.float16, "lse")
    o.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.run(q, k, v, o, l)
    g.replay()
    torch.cuda.synchronize()
    close(o, r_out, torch.float16)


def test_tma_pipelines_against_the_reference(tmp_path):
    """pipeline qr_async_trload / qr_async_trload_v3 (K/V through on-device TMA descriptors, Triton's global scratch
    allocated per launch): batch and group mode, padded lengths and head dims, GQA, both corners, LSE, repeat calls
    (the torch fast path declines kernels with scratch), a CUDA graph; unaligned arguments never reach them."""
    from fmha_dsl.runtime.dispatch import Dispatcher, detect_arch
    from fmha_dsl.rules.triton_fwd import arch_info

    if not arch_info(detect_arch()).get("tma"):
        pytest.skip("this GPU has no TMA")
    out = build_set(tmp_path, "gpu_tma", """\
    kernel tma {
        signature { family(fwd) dtype(fp16 | bf16) mode(batch | group) hdim(64 | 80 | 128) mask(no | causal)
                    lse(true) }
        algorithm { pipeline(qr_async_trload | qr_async_trload_v3) tile(64, 64, *, *, *, *) padding(true, true, true, true) }
    }
""")
    disp = Dispatcher(out)
    assert all(e.alg["pipeline"].startswith("qr_async_trload") for e in disp.entries)
    for dt, d, hk, sq, sk, kw in (("fp16", 64, 4, 256, 256, {}), ("bf16", 128, 2, 200, 333, {"causal": "bottom_right"}),
                                  ("fp16", 80, 1, 131, 77, {"causal": True}), ("bf16", 64, 4, 1, 1000, {})):
        dtype = DT[dt]
        q, k, v = rnd(2, 4, sq, d, dtype=dtype), rnd(2, hk, sk, d, dtype=dtype), rnd(2, hk, sk, d, dtype=dtype)
        r_out, r_lse = reference(q, k, v, **kw)
        for _ in range(3):
            o, lse = fmha_dsl.attention(q, k, v, return_lse=True, registry=disp, **kw)
            close(o, r_out, dtype)
            close(lse, r_lse, dtype, "lse")
        plan = disp.plan(P(dtype=dt, d=d, nhead_q=4, nhead_k=hk, seqlen_q=sq, seqlen_k=sk, lse=True,
                           mask="top_left" if kw else "no"))
        assert plan.entry.alg["pipeline"].startswith("qr_async_trload")
        assert plan.entry.build["global_scratch"] > 0
    check_group_mode(disp, [0, 5, 5, 300], [0, 70, 400, 401], 4, 128, causal="bottom_right")
    # a CUDA graph: the scratch comes from the graph's pool
    q, k, v = rnd(1, 4, 512, 64), rnd(1, 4, 512, 64), rnd(1, 4, 512, 64)
    plan = disp.plan(P(seqlen_q=512, seqlen_k=512, nhead_q=4, nhead_k=4, lse=True))
    o, l = torch.empty_like(q), torch.empty(1, 4, 512, device="cuda")
    plan.run(q, k, v, o, l)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan.run(q, k, v, o, l)
    o.zero_()
    g.replay()
    torch.cuda.synchronize()
    r_out, _ = reference(q, k, v)
    close(o, r_out, torch.float16)
    # a key stride that is not 16-divisible: no TMA kernel may serve it (clear error, no wrong result)
    kk = rnd(1, 4, 512, 72)[..., :64]
    with pytest.raises(FmhaError) as ei:
        fmha_dsl.attention(q, kk, v, registry=disp)
    assert ei.value.rule == "dispatch.no-kernel" and "16-divisible" in ei.value.render()


class _PackedOnly(Builder):
    """First-use candidates restricted to the GQA-packed pipeline (and split-KV, when the builder offers it and
    ``split`` is True)."""

    def __init__(self, split=True):
        super().__init__()
        self.split = split

    def candidates(self, problem, arch, aligned=True, limit=None):
        return [e for e in super().candidates(problem, arch, aligned, 100) if e.alg["pipeline"] == "qr_nwarp_sshuffle"
                and (self.split or e.sig["family"] == "fwd")]


class _SplitOnly(Builder):
    """First-use candidates restricted to two split-KV kernels."""

    def candidates(self, problem, arch, aligned=True, limit=None):
        return [e for e in super().candidates(problem, arch, aligned, 100) if e.sig["family"] == "fwd_splitkv"][:2]


def test_a_decode_loop_with_growing_keys_stays_on_the_torch_fast_path():
    """Decode: one query token per step and K/V one token longer each step (views of a preallocated cache, or
    contiguous), on a split-KV plan: after the first call of the decision's span every step is replayed in C++ --
    both launches, a fresh workspace, the split count of that length --, bit-identical to the Python path's launch
    (so with the same split count) and right against the reference."""
    import sys

    from fmha_dsl.runtime.dispatch import Dispatcher

    fp = fast_path()
    amod = sys.modules["fmha_dsl.attention"]
    d = Dispatcher(None, builder=_SplitOnly(), tuned_dir="")
    q = rnd(2, 8, 1, 128, dtype=torch.bfloat16)
    kc, vc = rnd(2, 2, 2100, 128, dtype=torch.bfloat16), rnd(2, 2, 2100, 128, dtype=torch.bfloat16)
    fmha_dsl.attention(q, kc[:, :, :1500], vc[:, :, :1500], registry=d)  # decides the span [1024, 2047] \ 128Z
    [plan] = d.fast.values()
    assert plan.splits
    before = fp.stats()
    lengths = list(range(1501, 1530)) + [1100, 1700, 2047]
    for i, sk in enumerate(lengths):
        k, v = kc[:, :, :sk], vc[:, :, :sk]
        if i % 2:
            k, v = k.contiguous(), v.contiguous()
        fast = fmha_dsl.attention(q, k, v, registry=d)
        saved, amod._fast_run = amod._fast_run, None
        try:
            python = fmha_dsl.attention(q, k, v, registry=d)
        finally:
            amod._fast_run = saved
        assert torch.equal(fast, python), sk
        if sk in (1501, 2047):
            close(fast, reference(q, k, v)[0], torch.bfloat16)
    after = fp.stats()
    assert after["hits"] == before["hits"] + len(lengths) and after["misses"] == before["misses"]
    assert list(d.fast.values()) == [plan]  # one decision served them all


def test_the_combine_overlaps_the_split_kernel_and_still_reads_every_partial():
    """On archs with programmatic dependent launch (sm90) the split-KV combine is built to wait for the split kernel
    in the kernel and is launched to overlap its end (native_launch.c's after_prior launch, on the Python path and
    the torch fast path alike).  If the wait were missing, back-to-back decode calls would combine partials not yet
    written: 64 calls over 8 different inputs, launched without a synchronisation between them, each equal to its
    input's first result and to the reference."""
    from fmha_dsl.runtime import native
    from fmha_dsl.runtime.dispatch import Dispatcher, detect_arch

    d = Dispatcher(None, builder=_SplitOnly(), tuned_dir="")
    qs = [rnd(4, 16, 1, 128, dtype=torch.bfloat16) for _ in range(8)]
    kvs = [(rnd(4, 4, 3000, 128, dtype=torch.bfloat16), rnd(4, 4, 3000, 128, dtype=torch.bfloat16)) for _ in range(8)]
    first = [fmha_dsl.attention(q, k, v, registry=d) for q, (k, v) in zip(qs, kvs)]
    [plan] = set(d.fast.values())  # one decision for the 8 same-shaped inputs
    assert plan.splits and len(plan.stages) == 2
    combine = plan.stages[1].kernel(torch.cuda.current_device())
    overlaps = bool(plan.stages[1].entry.build.get("after_prior"))
    assert overlaps == (detect_arch() == "sm90")
    if overlaps and getattr(combine, "kind", "") == "native":
        assert combine.fast_spec[0] == native.after_prior_launch_address()
    outs = [fmha_dsl.attention(qs[i % 8], *kvs[i % 8], registry=d) for i in range(64)]
    torch.cuda.synchronize()
    for i, o in enumerate(outs):
        assert torch.equal(o, first[i % 8]), i
    for j in (0, 7):
        close(first[j], reference(qs[j], *kvs[j])[0], torch.bfloat16)


@pytest.mark.parametrize("sq,causal", [(1, False), (4, "bottom_right"), (37, True)])
def test_gqa_packed_rows_on_the_gpu(sq, causal):
    """The GQA-packed pipeline (one program per K/V head) against the reference, with its split-KV variants when the
    problem has few query blocks; every kernel the restricted builder compiled is run."""
    from fmha_dsl.runtime.dispatch import Dispatcher

    q = rnd(2, 8, sq, 128, dtype=torch.bfloat16)
    k, v = rnd(2, 2, 300, 128, dtype=torch.bfloat16), rnd(2, 2, 300, 128, dtype=torch.bfloat16)
    want, want_lse = reference(q, k, v, causal=causal)
    d = Dispatcher(None, builder=_PackedOnly(), tuned_dir="")
    out, lse = fmha_dsl.attention(q, k, v, causal=causal, return_lse=True, registry=d)
    assert d.entries and all(e.alg["pipeline"] == "qr_nwarp_sshuffle" for e in d.entries)
    close(out, want, torch.bfloat16)
    close(lse, want_lse, torch.bfloat16, "lse")
    from fmha_dsl.keys import Problem

    p = Problem(dtype="bf16", batch=2, nhead_q=8, nhead_k=2, seqlen_q=sq, seqlen_k=300, hdim_q=128, hdim_v=128,
                mask="no" if not causal else "top_left", lse=True)
    kw = {} if not causal else {"window": (-1, 0), "bottom_right": causal == "bottom_right"}
    for e in d.candidates(p):  # every compiled packed kernel, split or not
        o, l = torch.empty_like(q), torch.empty(2, 8, sq, device="cuda")
        d.plan_for(e, p).run(q, k, v, o, l, **kw)
        close(o, want, torch.bfloat16, "out")
        close(l, want_lse, torch.bfloat16, "lse")


def test_gqa_packed_plans_replay_on_the_torch_fast_path():
    """A packed plan has its own grid (one program per K/V head): its repeat calls are replayed in C++ with that
    grid, giving the Python path's result."""
    from fmha_dsl.runtime.dispatch import Dispatcher

    fp = fast_path()
    q = rnd(4, 8, 1, 128, dtype=torch.bfloat16)
    k, v = rnd(4, 2, 1024, 128, dtype=torch.bfloat16), rnd(4, 2, 1024, 128, dtype=torch.bfloat16)
    d = Dispatcher(None, builder=_PackedOnly(split=False), tuned_dir="")
    first = fmha_dsl.attention(q, k, v, registry=d)
    [plan] = d.fast.values()
    assert plan.packed and not plan.splits
    hits = fp.stats()["hits"]
    for _ in range(3):
        assert torch.equal(fmha_dsl.attention(q, k, v, registry=d), first)
    assert fp.stats()["hits"] >= hits + 2
    close(first, reference(q, k, v)[0], torch.bfloat16)


def test_first_use_times_the_kernels_not_the_host_path_that_launches_them():
    """Plans whose Python launch path takes 250-300 us of host time (a busy wait) before a kernel of a few us: the
    first-use timer reads the kernel, not the host -- also on a slow plan's second launch (the reading the race
    prunes on) after a fast plan was timed (before, the flush covered about 30 us of host time, and a split-KV decode
    plan read 33-114 us for a 10 us plan and lost to a slower one-kernel plan)."""
    import time

    from fmha_dsl.api_dispatch import timer

    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("this torch has no torch.cuda._sleep: the timer cannot wait behind the host")
    x = torch.zeros(1, device="cuda")

    def busy(us):
        t = time.perf_counter()
        while time.perf_counter() - t < us * 1e-6:
            pass

    def launch(plan):
        busy(plan[1])
        x.add_(1)

    measure = timer(torch.cuda.current_device(), launch)
    slow, fast, late = ("slow", 300.0), ("fast", 0.0), ("late", 250.0)
    ts = measure(slow, 2) + measure(slow, 5) + measure(slow, 3, warm=2)
    assert x.item() == 12
    assert max(ts[2:]) < 60.0, ts
    measure(fast, 2)
    assert measure(late, 2)[1] < 60.0


def test_the_device_limits_are_the_drivers():
    """What the dispatcher reads from the GPU (runtime/device.py, through torch) is what the CUDA driver reports
    (cuDeviceGetAttribute through ctypes): the opt-in shared memory per block and the SM count."""
    import ctypes

    from fmha_dsl import arch as arch_table
    from fmha_dsl.api_dispatch import dispatcher
    from fmha_dsl.runtime.device import detect_arch, device_limits

    if getattr(torch.version, "hip", None):
        pytest.skip("the CUDA driver's attributes")
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, value = ctypes.c_int(), ctypes.c_int()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()) == 0

    def attribute(n):  # CUdevice_attribute: 16 multiprocessor count, 97 max shared memory per block (opt-in)
        assert cuda.cuDeviceGetAttribute(ctypes.byref(value), n, dev) == 0
        return value.value

    arch = detect_arch()
    lim = device_limits(arch)
    assert lim == {"shared_bytes": attribute(97), "compute_units": attribute(16)}
    assert 48 * 1024 < lim["shared_bytes"] <= arch_table.info(arch)["shared_bytes"]
    d = dispatcher(None, torch.cuda.current_device())
    assert d.limits == lim and d.compute_units == lim["compute_units"]
