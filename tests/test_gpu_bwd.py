"""The backward on a GPU: every feature against the NumPy backward reference, against torch autograd through SDPA
where SDPA has the feature, determinism, a CUDA-graph capture of a group-mode backward, torch.compile and opcheck,
and a short training run against the same model on SDPA.  Kernels compile on first use (registry=None).

    python3 -P -m pytest -q tests/test_gpu_bwd.py -p no:cacheprovider      (see bench/README_device.md)
"""

import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

import fmha_dsl  # noqa: E402
from fmha_dsl import costmodel  # noqa: E402
from fmha_dsl.keys import Problem  # noqa: E402
from fmha_dsl.reference_bwd import attention_bwd  # noqa: E402

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {torch.float16: 1e-2, torch.bfloat16: 6e-2, torch.float32: 1e-3}


def B(dtype="fp16", d=64, dv=None, **kw):
    return Problem(family="bwd_dq_dk_dv", dtype=dtype, hdim_q=d, hdim_v=dv or d, seqlen_q=256, seqlen_k=256, **kw)


NEEDED = ([B(dtype=dt, d=d, mask=m) for dt in ("fp16", "bf16") for d in (64, 128) for m in ("no", "top_left")]
          + [B(mode="group", mask="top_left"), B(bias="bias", dbias=True), B(bias="alibi", mask="top_left"),
             B(logits=True), B(dropout=True), B(mask="top_left", sink=True), B(d=80), B(d=96), B(d=192, dv=128),
             B(dtype="fp32"), B(deterministic=True, mask="top_left")])


@pytest.fixture(scope="session", autouse=True)
def warm_kernels():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from fmha_dsl.precompile import precompile
    from fmha_dsl.runtime.dispatch import detect_arch

    os.environ.setdefault("FMHA_DSL_TUNE_CANDIDATES", "4")   # a backward decision times 2 candidates
    jobs = min(16, os.cpu_count() or 1)
    n = precompile([p.model_copy(update={"deterministic": True}) for p in NEEDED], detect_arch(), jobs=jobs, limit=2)
    with pytest.MonkeyPatch.context() as mp:   # the atomic route's candidates (see `route`)
        mp.setattr(costmodel, "ATOMIC_COST", 0.0)
        mp.setattr(costmodel, "BULK_REDUCE_COST", 0.0)
        n += precompile(NEEDED, detect_arch(), jobs=jobs, limit=2)
    print(f"\n[test_gpu_bwd] compiled {n} backward kernels into the artifact cache")


@pytest.fixture(params=["atomic", "deterministic"])
def route(request, monkeypatch):
    """The dQ route under test, as the ``deterministic`` argument.  ``deterministic=True`` asks for the deterministic
    kernels; without it, first use may pick either route (mostly the deterministic one at d128 on sm90), so for the
    atomic route the cost model's atomic adds cost nothing here and the two candidates a decision times
    (FMHA_DSL_TUNE_CANDIDATES=4) are both atomic ones.  Afterwards: every backward decision the test made or read
    (a decision recorded by an earlier run) is of the route it names."""
    from fmha_dsl.api_dispatch import dispatcher

    if request.param == "atomic":
        monkeypatch.setattr(costmodel, "ATOMIC_COST", 0.0)
        monkeypatch.setattr(costmodel, "BULK_REDUCE_COST", 0.0)
    decided = dispatcher(None, torch.cuda.current_device())._decided
    before = set(decided)
    yield request.param == "deterministic"
    new = [e for k, e in decided.items() if k not in before and e.sig["family"] == "bwd_dq_dk_dv"]
    assert all(e.sig["deterministic"] == (request.param == "deterministic") for e in new), [e.name for e in new]


def _rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _f64(x):
    return None if x is None else x.detach().double().cpu().numpy()


def _ref_arg(x):
    return x.cpu().numpy() if not x.is_floating_point() else _f64(x)


def check_against_reference(q, k, v, do, tol=None, deterministic=False, **kw):
    """Kernel backward (explicit API, on the forward's out/lse from the kernels) vs the float64 reference on the same
    (rounded) inputs, the reference given the kernel's own out and lse."""
    out, lse = fmha_dsl.attention(q, k, v, return_lse=True, **kw)
    got = fmha_dsl.attention_backward(q, k, v, out, lse, do, deterministic=deterministic, **kw)
    ref_kw = {key: (_ref_arg(val) if torch.is_tensor(val) else val) for key, val in kw.items()
              if key not in ("max_seqlen_q", "max_seqlen_k")}
    want = attention_bwd(_f64(q), _f64(k), _f64(v), _f64(out), _f64(lse), _f64(do), accum=np.float64, **ref_kw)
    tol = TOL[q.dtype] if tol is None else tol
    for name, g, w in zip(("dq", "dk", "dv", "dbias"), got, want):
        g = _f64(g)
        assert np.isfinite(g).all(), name
        scale = max(1.0, float(np.abs(w).max()))
        err = float(np.abs(g - w).max())
        assert err <= tol * scale, (name, err, scale)
    return got


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_backward_matches_the_reference(dtype, d, causal, route):
    t = DT[dtype]
    sq, sk = (300, 500) if causal == "bottom_right" else (384, 384)
    q, k, v = _rand((2, 4, sq, d), t, 1), _rand((2, 4, sk, d), t, 2), _rand((2, 4, sk, d), t, 3)
    do = _rand((2, 4, sq, d), t, 4)
    check_against_reference(q, k, v, do, causal=causal, deterministic=route)


FEATURES = {
    "gqa": dict(hq=8, hk=2),
    "mqa_causal": dict(hq=4, hk=1, causal=True),
    "window_sink": dict(window=(64, 0), sink=8, causal=True),
    "window_both": dict(window=(100, 37)),
    "softcap": dict(softcap=20.0),
    "alibi": dict(alibi=True, causal=True),
    "dropout": dict(dropout_p=0.17, seed=1234, offset=96),
    "hdim80": dict(d=80),
    "hdim96": dict(d=96, causal=True),
    "hdim192x128": dict(d=192, dv=128),
    "hdim160": dict(d=160),
    "hdim256": dict(d=256, sq=128, sk=128),
    "fp32": dict(dtype="fp32"),
    "odd_lengths": dict(sq=1000, sk=999, causal="bottom_right"),
}


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_features_match_the_reference(name, route):
    kw = dict(FEATURES[name])
    t = DT[kw.pop("dtype", "fp16")]
    hq, hk = kw.pop("hq", 4), kw.pop("hk", 4)
    d = kw.pop("d", 64)
    dv = kw.pop("dv", None) or d
    sq, sk = kw.pop("sq", 257), kw.pop("sk", 321)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.linspace(0.05, 0.5, hq, device="cuda")
    q, k, v = _rand((2, hq, sq, d), t, 1), _rand((2, hk, sk, d), t, 2), _rand((2, hk, sk, dv), t, 3)
    do = _rand((2, hq, sq, dv), t, 4)
    check_against_reference(q, k, v, do, deterministic=route, **kw)


@pytest.mark.parametrize("bshape", [(1, 1), (2, 1), (2, 4)])
def test_bias_gradient(bshape, route):
    t = torch.float16
    q, k, v, do = (_rand((2, 4, 200, 64), t, i) for i in range(4))
    bias = _rand(bshape + (200, 200), t, 9)
    got = check_against_reference(q, k, v, do, bias=bias, causal=True, deterministic=route)
    assert got[3].shape == bias.shape


def test_group_mode_with_empty_sequences(route):
    t = torch.bfloat16
    lq, lk = [100, 0, 333, 17, 64], [90, 12, 400, 0, 64]
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device="cuda")
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32, device="cuda")
    q, k, v = _rand((sum(lq), 8, 128), t, 1), _rand((sum(lk), 2, 128), t, 2), _rand((sum(lk), 2, 128), t, 3)
    do = _rand((sum(lq), 8, 128), t, 4)
    got = check_against_reference(q, k, v, do, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=333, max_seqlen_k=400,
                                  causal="bottom_right", dropout_p=0.1, seed=7, deterministic=route)
    assert not got[0][cq[3]:cq[4]].any()          # the sequence without keys


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_matches_sdpa(causal):
    t = torch.bfloat16
    q, k, v = (_rand((2, 8, 512, 128), t, i).requires_grad_() for i in range(3))
    w = _rand((2, 8, 512, 128), t, 5)
    out = fmha_dsl.attention(q, k, v, causal=causal)
    (out.float() * w.float()).sum().backward()
    mine = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    (ref * w.float()).sum().backward()
    for a, b in zip(mine, (q.grad, k.grad, v.grad)):
        assert torch.allclose(a.float(), b.float(), atol=6e-2, rtol=5e-2), float((a.float() - b.float()).abs().max())


def test_autograd_gqa_and_bias_match_sdpa():
    t = torch.float16
    q = _rand((2, 8, 256, 64), t, 1).requires_grad_()
    k, v = (_rand((2, 2, 256, 64), t, i).requires_grad_() for i in (2, 3))
    bias = _rand((1, 8, 256, 256), t, 4).requires_grad_()
    fmha_dsl.attention(q, k, v, bias=bias).float().square().sum().backward()
    mine = [x.grad.clone() for x in (q, k, v, bias)]
    for x in (q, k, v, bias):
        x.grad = None
    ref = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1),
                                         v.float().repeat_interleave(4, 1), attn_mask=bias.float())
    ref.square().sum().backward()
    for a, b in zip(mine, (q.grad, k.grad, v.grad, bias.grad)):
        assert torch.allclose(a.float(), b.float(), atol=5e-2, rtol=5e-2), float((a.float() - b.float()).abs().max())


def test_deterministic_is_bit_identical_and_atomic_is_close():
    t = torch.bfloat16
    q = _rand((2, 16, 1024, 128), t, 1)
    k, v, do = _rand((2, 4, 2048, 128), t, 2), _rand((2, 4, 2048, 128), t, 3), _rand((2, 16, 1024, 128), t, 4)
    out, lse = fmha_dsl.attention(q, k, v, causal="bottom_right", return_lse=True)
    runs = [fmha_dsl.attention_backward(q, k, v, out, lse, do, causal="bottom_right", deterministic=True)
            for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))
    fast = fmha_dsl.attention_backward(q, k, v, out, lse, do, causal="bottom_right")
    for a, b in zip(runs[0], fast):
        assert torch.allclose(a.float(), b.float(), atol=3e-2, rtol=3e-2)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:  # autograd picks the deterministic backward under torch's switch
        grads = []
        for _ in range(2):
            x = q.clone().requires_grad_()
            fmha_dsl.attention(x, k, v, causal="bottom_right").float().sum().backward()
            grads.append(x.grad)
        assert torch.equal(grads[0], grads[1])
    finally:
        torch.use_deterministic_algorithms(False)


def test_group_mode_backward_is_captured_in_a_cuda_graph_without_host_sync():
    t = torch.float16
    lq, lk = [128, 77, 300], [256, 77, 10]
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device="cuda")
    ck = torch.tensor(np.concatenate([[0], np.cumsum(lk)]), dtype=torch.int32, device="cuda")
    q, k, v = _rand((sum(lq), 4, 64), t, 1), _rand((sum(lk), 4, 64), t, 2), _rand((sum(lk), 4, 64), t, 3)
    do = _rand((sum(lq), 4, 64), t, 4)
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=300, max_seqlen_k=256, causal=True)
    out, lse = fmha_dsl.attention(q, k, v, return_lse=True, **kw)
    eager = fmha_dsl.attention_backward(q, k, v, out, lse, do, **kw)   # selects and compiles outside the capture
    ws = torch.empty(1 << 22, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fmha_dsl.attention_backward(q, k, v, out, lse, do, workspace=ws, **kw)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = fmha_dsl.attention_backward(q, k, v, out, lse, do, workspace=ws, **kw)
    do.copy_(do * 2)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        assert torch.allclose(a.float(), 2 * b.float(), atol=2e-2, rtol=2e-2)


def test_torch_compile_has_no_graph_break_and_opcheck_passes():
    from fmha_dsl.autograd import ops

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return fmha_dsl.attention(q, k, v, causal=True)

    q, k, v = (_rand((1, 4, 128, 64), torch.float16, i).requires_grad_() for i in range(3))
    explain = torch._dynamo.explain(Attn())(q, k, v)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(Attn(), fullgraph=True)
    compiled(q, k, v).float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    fwd, bwd = ops()
    args = (q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_(), None, None, None,
            None, None, None, "top_left", -1, -1, 0.0, 0, 0, None, 0, None, None)
    torch.library.opcheck(fwd, args)


def test_a_short_training_run_matches_sdpa():
    """A two-layer attention model, 200 steps of Adam from one seed: the loss curve on fmha-dsl follows SDPA's."""
    def model_and_losses(use_fmha: bool):
        torch.manual_seed(0)
        d, h, s = 128, 4, 64
        layers = torch.nn.ModuleList([torch.nn.Linear(d, 3 * d) for _ in range(2)]).cuda()
        head = torch.nn.Linear(d, 1).cuda()
        opt = torch.optim.Adam(list(layers.parameters()) + list(head.parameters()), lr=1e-3)
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(8, s, d, device="cuda", generator=g)
        y = x.mean(dim=(1, 2), keepdim=False)[:, None] * 3
        losses = []
        for _ in range(200):
            z = x
            for lin in layers:
                qkv = lin(z).to(torch.bfloat16).view(8, s, 3, h, d // h).permute(2, 0, 3, 1, 4)
                if use_fmha:
                    a = fmha_dsl.attention(qkv[0], qkv[1], qkv[2], causal=True)
                else:
                    a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
                z = z + a.transpose(1, 2).reshape(8, s, d).float()
            loss = F.mse_loss(head(z.mean(1)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return np.array(losses)

    mine, ref = model_and_losses(True), model_and_losses(False)
    assert mine[-1] < 0.5 * mine[0]                       # it trains
    assert np.abs(mine - ref).max() <= 0.05 * max(ref.max(), 1e-3) + 1e-3, (mine[::20], ref[::20])


TMA_SET = """kernel_set bwd_tma {
    backend(triton)
    arch(sm90)
    kernel main {
        signature { family(bwd_dq_dk_dv) dtype(fp16) mode(batch | group) hdim(64) mask(causal) bias(no) dropout(false)
                    deterministic(false | true) }
        algorithm { pipeline(bwd_trload) tile(64, 64, 64, 64, 64, 64, 64, 64, 64) wave(4, 1, 1, 4, 1, 1, 4, 1, 1)
                    padding(true, true, false, false) }
    }
}
"""


@pytest.mark.parametrize("det", [False, True], ids=["atomic", "deterministic"])
def test_tma_pipeline_from_a_prebuilt_registry(tmp_path, det):
    """The bulk-reduction dQ path (bwd_trload; the CPU interpreter cannot run it) and the deterministic dQ programs
    that read K/V through descriptors, from a registry built ahead of time, batch and group mode (lengths off the
    tile, an empty sequence), against the reference."""
    from fmha_dsl.build import build
    from fmha_dsl.runtime.dispatch import detect_arch

    if detect_arch() != "sm90":
        pytest.skip("TMA pipelines are sm90 kernels")
    src = tmp_path / "tma.fmha"
    src.write_text(TMA_SET)
    res = build(fmha_dsl.load(str(src)), str(tmp_path / "out"), jobs=2)
    assert not res.failures, res.failures
    reg = str(tmp_path / "out")
    t = torch.float16
    q, k, v, do = (_rand((2, 4, 300, 64), t, i) for i in range(4))
    out, lse = fmha_dsl.attention(q, k, v, causal=True, return_lse=True)
    got = fmha_dsl.attention_backward(q, k, v, out, lse, do, causal=True, registry=reg, deterministic=det)
    want = attention_bwd(_f64(q), _f64(k), _f64(v), _f64(out), _f64(lse), _f64(do), causal=True, accum=np.float64)
    for g, w in zip(got, want):
        assert float(np.abs(_f64(g) - w).max()) <= TOL[t] * max(1.0, float(np.abs(w).max()))
    lq = [100, 0, 257]
    cq = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32, device="cuda")
    qg, kg, vg, dog = (_rand((357, 4, 64), t, i) for i in range(4))
    kw = dict(cu_seqlens_q=cq, cu_seqlens_k=cq, max_seqlen_q=257, max_seqlen_k=257, causal=True)
    out, lse = fmha_dsl.attention(qg, kg, vg, return_lse=True, **kw)
    got = fmha_dsl.attention_backward(qg, kg, vg, out, lse, dog, registry=reg, deterministic=det, **kw)
    want = attention_bwd(_f64(qg), _f64(kg), _f64(vg), _f64(out), _f64(lse), _f64(dog), causal=True,
                         cu_seqlens_q=cq.cpu().numpy(), cu_seqlens_k=cq.cpu().numpy(), accum=np.float64)
    for g, w in zip(got, want):
        assert float(np.abs(_f64(g) - w).max()) <= TOL[t] * max(1.0, float(np.abs(w).max()))


TUNE_SET = """kernel_set bwd_tune {
    backend(triton)
    arch(sm80, sm90)
    kernel small {
        signature { family(bwd_dq_dk_dv) dtype(bf16) mode(batch) hdim(64) mask(no | causal) bias(no) dropout(false)
                    deterministic(false) }
        algorithm { pipeline(bwd_async) tile(64, 64, 64, 64, 64, 64, 64, 64, 64) wave(4, 1, 1, 4, 1, 1, 4, 1, 1)
                    padding(true, true, false, false) }
    }
    kernel wide {
        signature { family(bwd_dq_dk_dv) dtype(bf16) mode(batch) hdim(64) mask(no | causal) bias(no) dropout(false)
                    deterministic(false) }
        algorithm { pipeline(bwd_async) tile(32, 128, 64, 32, 64, 32, 128, 64, 64) wave(8, 1, 1, 8, 1, 1, 8, 1, 1)
                    padding(true, true, false, false) }
    }
}
"""


def test_tune_selects_and_reports_backward_kernels(tmp_path):
    """`fmha-dsl tune` measures a build's backward kernels over a backward class (checked against SDPA's autograd),
    the dispatcher then selects by the table, and `fmha-dsl report` draws it."""
    import json
    import subprocess
    import sys

    from fmha_dsl.build import build
    from fmha_dsl.runtime.dispatch import Dispatcher, detect_arch
    from fmha_dsl.runtime.tune import tune

    arch = detect_arch()
    src = tmp_path / "tune.fmha"
    src.write_text(TUNE_SET)
    res = build(fmha_dsl.load(str(src)), str(tmp_path / "out"), arch=arch, jobs=4)
    assert not res.failures, res.failures
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"name": "bwd-test", "version": 1, "classes": [
        {"family": "bwd", "dtype": "bf16", "hdim": 64, "mask": ["no", "causal"], "seqlens": [512, 1024],
         "tokens": 4096, "nhead_q": 8}]}))
    got = tune(str(tmp_path / "out"), shapes=str(shapes))
    assert got.measured == 8 and got.failed == 0, got
    disp = Dispatcher(str(tmp_path / "out"))
    p = Problem(family="bwd_dq_dk_dv", dtype="bf16", hdim_q=64, hdim_v=64, mask="top_left", seqlen_q=1024,
                seqlen_k=1024, batch=4, nhead_q=8, nhead_k=8)
    rows = disp.explain(p)
    assert rows[0]["selected"] and rows[0]["source"] != "static" and rows[0]["measured_us"] is not None
    assert rows[0]["measured_us"] == min(r["measured_us"] for r in rows if r.get("measured_us"))
    out = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "report", str(tmp_path / "out"), "-o",
                          str(tmp_path / "r.html")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "bwd_dq_dk_dv" in (tmp_path / "r.html").read_text()


def test_repeat_backward_calls_replay_their_launches():
    """A backward call like one already launched (same shapes, strides, dtypes and scalars) replays its three
    launches with the new addresses (the torch extension's Replayer; the dQ accumulator zeroed first): the same
    result as the checked path, and a training loop's autograd backward takes it too.  A caller's workspace, dropout
    or a bias take the checked path."""
    from fmha_dsl import replay
    from fmha_dsl.runtime import torch_fast

    torch_fast.start()   # (when this test runs alone, no earlier call has started the build)
    assert torch_fast.wait(600), torch_fast.available()
    shape = (2, 4, 200, 64)
    q, k, v, do = (_rand(shape, torch.bfloat16, 40 + i) for i in range(4))
    out, lse = fmha_dsl.attention(q, k, v, causal=True, return_lse=True)
    kw = dict(causal=True, deterministic=True)
    first = fmha_dsl.attention_backward(q, k, v, out, lse, do, **kw)          # checked, then recorded
    r = replay.replayer()
    assert r is not None
    hits = r.stats()["hits"]
    copies = [x.clone() for x in (q, k, v, out, lse, do)]                      # other addresses
    again = fmha_dsl.attention_backward(*copies, **kw)
    assert r.stats()["hits"] == hits + 1
    assert all(torch.equal(a, b) for a, b in zip(first, again))               # deterministic dQ: bit-identical
    ws = torch.empty(10 ** 7, device="cuda")
    fmha_dsl.attention_backward(*copies, workspace=ws, **kw)                  # must zero the caller's workspace
    assert r.stats()["hits"] == hits + 1
    # the autograd backward of a training loop replays too (after its first step)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    for step in range(3):
        before = r.stats()["hits"]
        o = fmha_dsl.attention(qg, kg, vg, causal=True)
        grads = torch.autograd.grad(o, (qg, kg, vg), do)
        if step:
            assert r.stats()["hits"] == before + 1
    want = attention_bwd(*(_f64(x) for x in (q, k, v, out, lse, do)), causal=True)
    for g, w in zip(grads, want):
        err = np.abs(_f64(g) - w).max() / max(1.0, np.abs(w).max())
        assert err < 3e-2, err


AHEAD_CASES = {
    "causal": {"causal": True},
    "window, sink and ALiBi": {"causal": True, "window": (64, 0), "sink": 4, "alibi": True},
    "soft-cap": {"softcap": 30.0},
    "dropout": {"dropout_p": 0.1, "seed": 7},
    "group mode": {"causal": True, "group": True},
}


@pytest.mark.parametrize("case", list(AHEAD_CASES))
def test_a_never_seen_training_step_compiles_its_backward_behind_its_forward(case, tmp_path, monkeypatch):
    """A training step of a class nothing has compiled or decided: the forward's first use compiles the backward's
    candidates too, behind its own, in one batch of workers; the backward's first use compiles nothing more (the
    problem the forward named is the one the backward wants), and its gradients match the reference."""
    from fmha_dsl import build_triton as bt
    from fmha_dsl.first_use import Builder
    from fmha_dsl.runtime.dispatch import Dispatcher

    monkeypatch.setenv("FMHA_DSL_TUNED_SHIPPED", "0")
    batches, real = [], bt.run_isolated

    def recorded(fn, jobs, workers, on_result):
        batches.append([job[1]["family"] for job in jobs])
        return real(fn, jobs, workers, on_result)

    monkeypatch.setattr(bt, "run_isolated", recorded)
    d = Dispatcher(None, builder=Builder(cache_dir=str(tmp_path)), tuned_dir=str(tmp_path))
    kw, h, d_, t = dict(AHEAD_CASES[case]), 2, 96, torch.bfloat16
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.tensor([0.25, 0.5], device="cuda")
    shape = (1, h, 320, d_)
    if kw.pop("group", False):
        cu = torch.tensor([0, 200, 320], dtype=torch.int32, device="cuda")
        kw.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=200, max_seqlen_k=200)
        shape = (320, h, d_)
    q, k, v = (_rand(shape, t, i).requires_grad_() for i in (1, 2, 3))
    do = _rand(shape, t, 4)
    out = fmha_dsl.attention(q, k, v, registry=d, **kw)
    assert len(batches) == 1 and not batches[0][0].startswith("bwd") and "bwd_dq_dk_dv" in batches[0], batches
    out.backward(do)
    torch.cuda.synchronize()
    assert len(batches) == 1, batches
    ref_out, lse = fmha_dsl.attention(q.detach(), k.detach(), v.detach(), return_lse=True, registry=d, **kw)
    ref_kw = {key: (_ref_arg(val) if torch.is_tensor(val) else val) for key, val in kw.items()
              if key not in ("max_seqlen_q", "max_seqlen_k")}
    want = attention_bwd(_f64(q), _f64(k), _f64(v), _f64(ref_out), _f64(lse), _f64(do), accum=np.float64, **ref_kw)
    for name, g, w in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), want):
        scale = max(1.0, float(np.abs(w).max()))
        assert float(np.abs(_f64(g) - w).max()) <= TOL[t] * scale, name
