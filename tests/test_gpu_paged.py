"""The serving API on a GPU: paged attention and append-KV against the NumPy reference and against
``fmha_dsl.attention`` on the gathered K/V, for both page-table forms, page sizes 1 / 16 / 1024, scattered and shared
pages, every mask, GQA/MQA, soft-cap, ALiBi, sink tokens, head dims 64...256; decode through split-KV; a CUDA-graph
captured serving step with new tables each replay; corrupt tables that must not fault.  Kernels compile on first use.

    python3 -P -m pytest -q tests/test_gpu_paged.py -p no:cacheprovider      (bench/device_run.sh pagedtests)
"""

import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import fmha_dsl  # noqa: E402
from fmha_dsl.reference_paged import append_kv as ref_append  # noqa: E402
from fmha_dsl.reference_paged import gather_kv, linear_caches, vectorized_caches  # noqa: E402
from fmha_dsl.reference_paged import paged_attention as ref_paged  # noqa: E402

TOL = {torch.float16: 1.5e-2, torch.bfloat16: 6e-2}


@pytest.fixture(scope="module", autouse=True)
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    # first use among the cost model's first four candidates per class, as test_gpu.py's: it keeps the file short,
    # and the gathered-route tests need a forward decision without split-KV (a split one keeps the paged route)
    os.environ.setdefault("FMHA_DSL_TUNE_CANDIDATES", "4")


def make_cache(lens_k, page, hk, d, dv=None, *, extra=(), seed=0, shared_prefix=0, dtype=torch.float16, spare=3):
    """A paged cache holding random K/V for sequences of ``lens_k`` tokens (+ ``extra`` room each), pages scattered
    at random; ``shared_prefix`` pages are the same physical pages at the start of every sequence."""
    rng = np.random.default_rng(seed)
    dv = dv or d
    extra = extra or [0] * len(lens_k)
    need = [-(-(n + e) // page) for n, e in zip(lens_k, extra)]
    own = [max(0, n - shared_prefix) for n in need]
    total = sum(own) + shared_prefix + spare
    perm = rng.permutation(total)
    prefix, i, pages = list(perm[:shared_prefix]), shared_prefix, []
    for n, o in zip(need, own):
        pages.append((prefix[:n] + list(perm[i:i + o]))[:n])
        i += o
    kc = rng.standard_normal((total, page, hk, d)).astype(np.float32)
    vc = rng.standard_normal((total, page, hk, dv)).astype(np.float32)
    width = max(need + [1]) + 1
    bt = np.zeros((len(lens_k), width), np.int32)
    for b, p in enumerate(pages):
        bt[b, :len(p)] = p
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
    indices = np.concatenate([np.asarray(p, np.int32) for p in pages] + [np.zeros(0, np.int32)])
    kc = torch.tensor(kc).to(dtype)
    vc = torch.tensor(vc).to(dtype)
    return kc, vc, bt, indptr, indices


def run_case(lens_q, lens_k, *, page=16, hq=8, hk=2, d=64, dv=None, form="vllm", dtype=torch.float16, seed=0,
             shared_prefix=0, maxes=True, vectorized=False, **kw):
    registry = kw.pop("registry", None)
    rng = np.random.default_rng(seed + 1)
    kc, vc, bt, ip, ix = make_cache(lens_k, page, hk, d, dv, seed=seed, shared_prefix=shared_prefix, dtype=dtype)
    q = torch.tensor(rng.standard_normal((sum(lens_q), hq, d)).astype(np.float32)).to(dtype)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    lens = np.asarray(lens_k, np.int32)
    tab = {"block_table": bt} if form == "vllm" else {"kv_indptr": ip, "kv_indices": ix}
    rkw = dict(kw, causal="bottom_right") if kw.get("causal") is True else kw   # the API's causal=True
    want, wlse = ref_paged(q.float().numpy(), kc.float().numpy(), vc.float().numpy(), seqlens_k=lens,
                           cu_seqlens_q=cq, return_lse=True, **tab, **rkw)
    dev = {k: torch.tensor(v).cuda() for k, v in tab.items()}
    extra = {"max_seqlen_q": max(lens_q), "max_seqlen_k": max(lens_k)} if maxes else {}
    ka = {k: (torch.tensor(v).cuda() if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    kd, vd = vectorized_caches(kc, vc) if vectorized else (kc, vc)     # CK's layout: the same values, 5-D
    out, lse = fmha_dsl.paged_attention(q.cuda(), kd.cuda(), vd.cuda(), seqlens_k=torch.tensor(lens).cuda(),
                                        cu_seqlens_q=torch.tensor(cq).cuda(), return_lse=True, registry=registry,
                                        **dev, **extra, **ka)
    got = out.float().cpu().numpy()
    err = np.abs(got - want).max() if got.size else 0.0
    assert np.isfinite(got).all()
    assert err <= TOL[dtype] * max(1.0, np.abs(want).max()), err
    gl = lse.cpu().numpy()
    live = np.isfinite(wlse)
    assert np.array_equal(np.isfinite(gl), live)
    assert np.abs(gl[live] - wlse[live]).max(initial=0) < 2e-2
    return got, (q, kc, vc, lens, cq, tab)


@pytest.mark.parametrize("page", [1, 16, 1024])
@pytest.mark.parametrize("form", ["vllm", "sglang"])
def test_prefill_and_decode_on_both_table_forms_and_page_sizes(page, form):
    run_case([37, 1, 0, 130], [300, 17, 5, 1100 if page == 1024 else 600], page=page, form=form, causal=True)
    run_case([1, 1, 1, 1], [300, 17, 0, 2000], page=page, form=form, seed=2)          # decode: split-KV


@pytest.mark.parametrize("kw", [
    {"causal": "top_left"}, {"causal": "bottom_right"}, {"window": (64, 0), "sink": 4}, {"window": (32, 16)},
    {"softcap": 20.0}, {"alibi_slopes": np.linspace(0.05, 0.5, 8).astype(np.float32)}, {"scale": 0.05}],
    ids=["top_left", "bottom_right", "window_sink", "window2", "softcap", "alibi", "scale"])
def test_every_mask_and_logit_feature(kw):
    run_case([40, 3, 77], [90, 250, 77], **kw)


@pytest.mark.parametrize("d,dv", [(64, 64), (80, 80), (96, 96), (128, 128), (192, 128), (256, 256)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_head_dims_and_dtypes(d, dv, dtype):
    run_case([20, 65], [130, 64], d=d, dv=dv, dtype=dtype, causal=True, hq=4, hk=4)


def test_gqa_mqa_shared_prefix_pages_and_lengths_read_back():
    run_case([5, 9, 1], [400, 1000, 33], hq=16, hk=1, shared_prefix=2, causal=True)      # MQA, shared prompt pages
    run_case([1] * 6, [5, 1, 300, 0, 64, 1025], hq=32, hk=8, maxes=False)            # lengths read back, checked


def test_equals_attention_on_the_gathered_kv():
    got, (q, kc, vc, lens, cq, tab) = run_case([64, 200], [500, 333], causal=True, hq=8, hk=2)
    k, v, ck = gather_kv(kc.float().numpy(), vc.float().numpy(), seqlens_k=lens, **tab)
    dt = q.dtype
    out = fmha_dsl.attention(q.cuda(), torch.tensor(k).to(dt).cuda(), torch.tensor(v).to(dt).cuda(),
                             causal="bottom_right",
                             cu_seqlens_q=torch.tensor(cq).cuda(), cu_seqlens_k=torch.tensor(ck).cuda())
    assert np.abs(out.float().cpu().numpy() - got).max() < 1e-2


@pytest.mark.parametrize("rope", [None, "half", "inter"])
@pytest.mark.parametrize("form", ["vllm", "sglang", "contiguous"])
def test_append_kv_writes_rows_and_rotates(rope, form):
    rng = np.random.default_rng(5)
    lens, new = [30, 0, 17, 5], [1, 4, 0, 16]
    hk, hq, d, page = 2, 8, 128, 16
    if form == "contiguous":
        kc = torch.randn(4, 64, hk, d, dtype=torch.float16)
        vc = torch.randn(4, 64, hk, d, dtype=torch.float16)
        tab = {}
        ref_tab = {"block_table": np.arange(4, dtype=np.int32)[:, None]}
    else:
        kc, vc, bt, ip, ix = make_cache(lens, page, hk, d, extra=new)
        tab = {"block_table": bt} if form == "vllm" else {"kv_indptr": ip, "kv_indices": ix}
        ref_tab = tab
    kn = rng.standard_normal((sum(new), hk, d)).astype(np.float16)
    vn = rng.standard_normal((sum(new), hk, d)).astype(np.float16)
    q = rng.standard_normal((sum(new), hq, d)).astype(np.float16)
    cn = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    rot = {}
    if rope:
        th = np.arange(128)[:, None] * (10000.0 ** (-np.arange(32) / 32))
        rot = {"rotary_cos": np.cos(th).astype(np.float32), "rotary_sin": np.sin(th).astype(np.float32),
               "rotary_interleaved": rope == "inter"}
    wk, wv, wq = ref_append(kc.float().numpy(), vc.float().numpy(), kn, vn, seqlens_k=np.asarray(lens, np.int32),
                            cu_seqlens_new=cn, q=q, **ref_tab, **rot)
    kt, vt, qt = kc.cuda(), vc.cuda(), torch.tensor(q).cuda()
    fmha_dsl.append_kv(kt, vt, torch.tensor(kn).cuda(), torch.tensor(vn).cuda(), seqlens_k=torch.tensor(lens).cuda(),
                       cu_seqlens_new=torch.tensor(cn).cuda(), q=qt,
                       **{k: torch.tensor(v).cuda() for k, v in tab.items()},
                       **{k: (torch.tensor(v).cuda() if isinstance(v, np.ndarray) else v) for k, v in rot.items()})
    for got, want in ((kt, wk), (vt, wv), (qt, wq)):
        assert np.abs(got.float().cpu().numpy() - want).max() < 1e-2


def test_a_serving_step_is_captured_in_a_cuda_graph_and_replays_with_new_tables():
    """append_kv + paged_attention with max_seqlen_* and a workspace: no host synchronisation, no allocation; the
    graph replays with new page tables and lengths written into the same tensors."""
    hk, hq, d, page, B = 2, 16, 128, 16, 4
    lens0 = [100, 7, 250, 31]
    kc, vc, bt, _, _ = make_cache([n + 40 for n in lens0], page, hk, d, spare=10)
    kc, vc = kc.cuda(), vc.cuda()
    bt_d = torch.tensor(bt).cuda()
    lens_d = torch.tensor(lens0, dtype=torch.int32).cuda()
    cq = torch.arange(B + 1, dtype=torch.int32).cuda()
    q = torch.randn(B, hq, d, dtype=torch.float16).cuda()
    kn = torch.randn(B, hk, d, dtype=torch.float16).cuda()
    vn = torch.randn(B, hk, d, dtype=torch.float16).cuda()
    mk = page * bt.shape[1]   # what the table can hold
    from fmha_dsl.paged import workspace_numel

    ws = torch.empty(workspace_numel(q, kc, vc, batch=B, max_seqlen_q=1, max_seqlen_k=mk),
                     dtype=torch.float32, device="cuda")
    lens_after = torch.empty_like(lens_d)
    out = torch.empty_like(q)

    def step():
        fmha_dsl.append_kv(kc, vc, kn, vn, block_table=bt_d, seqlens_k=lens_d, cu_seqlens_new=cq, max_seqlen_new=1)
        torch.add(lens_d, 1, out=lens_after)
        fmha_dsl.paged_attention(q, kc, vc, block_table=bt_d, seqlens_k=lens_after, cu_seqlens_q=cq, max_seqlen_q=1,
                                 max_seqlen_k=mk, out=out, workspace=ws)

    step()  # first use: compile and choose outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for lens in ([100, 7, 250, 31], [3, 120, 0, 64]):
        lens_d.copy_(torch.tensor(lens, dtype=torch.int32))
        bt_d.copy_(torch.tensor(np.roll(bt, 1, axis=0)))            # a new table each step
        kn.normal_()
        q.normal_()
        kc0, vc0 = kc.float().cpu().numpy(), vc.float().cpu().numpy()
        g.replay()
        torch.cuda.synchronize()
        btn = bt_d.cpu().numpy()
        wk, wv, _ = ref_append(kc0, vc0, kn.float().cpu().numpy(), vn.float().cpu().numpy(), block_table=btn,
                               seqlens_k=np.asarray(lens, np.int32), cu_seqlens_new=np.arange(B + 1))
        want = ref_paged(q.float().cpu().numpy(), wk, wv, block_table=btn, seqlens_k=np.asarray(lens) + 1,
                         cu_seqlens_q=np.arange(B + 1))
        assert np.abs(out.float().cpu().numpy() - want).max() < 1.5e-2


def test_int64_tables_with_the_maxima_given_never_synchronise():
    """torch.tensor(...) makes int64: such tables, lengths and offsets on the GPU, with max_seqlen_* given, are taken
    as int32 without reading anything back (a range check there read a flag every step)."""
    hk, hq, d, page, B = 2, 8, 128, 16, 3
    lens = [100, 7, 250]
    kc, vc, bt, _, _ = make_cache(lens, page, hk, d)
    kc, vc = kc.cuda(), vc.cuda()
    q = torch.randn(B, hq, d, dtype=torch.float16).cuda()
    kw = dict(block_table=torch.tensor(bt.astype(np.int64)).cuda(), seqlens_k=torch.tensor(lens).cuda(),
              cu_seqlens_q=torch.arange(B + 1).cuda(), max_seqlen_q=1, max_seqlen_k=page * bt.shape[1])
    assert kw["seqlens_k"].dtype == torch.int64
    fmha_dsl.paged_attention(q, kc, vc, **kw)   # first use: compile and choose (it may read back)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fmha_dsl.paged_attention(q, kc, vc, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = ref_paged(q.float().cpu().numpy(), kc.float().cpu().numpy(), vc.float().cpu().numpy(), block_table=bt,
                     seqlens_k=np.asarray(lens), cu_seqlens_q=np.arange(B + 1))
    assert np.abs(out.float().cpu().numpy() - want).max() < 1.5e-2


def test_corrupt_tables_never_fault():
    """Page ids outside the cache and lengths past the table (with max_seqlen_k given, so nothing is checked on the
    host): the kernels clamp, the call finishes, the numbers are finite."""
    kc, vc, bt, ip, ix = make_cache([64, 64], 16, 2, 64)
    bad = bt.copy()
    bad[0, 0], bad[1, 2] = 1 << 30, -5
    q = torch.randn(2, 8, 64, dtype=torch.float16).cuda()
    out = fmha_dsl.paged_attention(q, kc.cuda(), vc.cuda(), block_table=torch.tensor(bad).cuda(),
                                   seqlens_k=torch.tensor([64, 10_000], dtype=torch.int32).cuda(),
                                   cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32).cuda(), max_seqlen_q=1,
                                   max_seqlen_k=64)
    bad_ix = ix.copy()
    bad_ix[1] = 1 << 30
    out2 = fmha_dsl.paged_attention(q, kc.cuda(), vc.cuda(), kv_indptr=torch.tensor(ip).cuda(),
                                    kv_indices=torch.tensor(bad_ix).cuda(),
                                    seqlens_k=torch.tensor([64, 64], dtype=torch.int32).cuda(),
                                    cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32).cuda(), max_seqlen_q=1,
                                    max_seqlen_k=64)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all() and torch.isfinite(out2).all()
    with pytest.raises(fmha_dsl.UsageError, match="outside the cache"):   # without the maxima: checked, located
        fmha_dsl.paged_attention(q, kc.cuda(), vc.cuda(), block_table=torch.tensor(bad).cuda(),
                                 seqlens_k=torch.tensor([64, 64], dtype=torch.int32).cuda(),
                                 cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32).cuda())


@pytest.mark.parametrize("path", ["extension", "python"])
def test_repeated_calls_replay_with_new_tensors_and_tables(path, monkeypatch):
    """The serving fast path: the second and later calls of one class replay the first's launches with their own
    addresses -- new queries, caches, tables and lengths must give their own results; a misaligned view takes the
    checked path (its binary has no 16-byte promise).  Through the torch extension's Replayer (C++) and through the
    Python replay it stands in front of."""
    from fmha_dsl import replay
    from fmha_dsl.runtime import torch_fast

    replay.start()
    if path == "extension":
        torch_fast.start()
        assert torch_fast.wait(300), torch_fast.available()
        assert replay.replayer() is not None
    else:
        monkeypatch.setitem(replay._STATE, "loaded", lambda: None)
        monkeypatch.delitem(replay._STATE, "replayer", raising=False)
    hits = replay.replayer().stats()["hits"] if path == "extension" else 0
    checked = []
    prepare = fmha_dsl.paged._prepare
    monkeypatch.setattr(fmha_dsl.paged, "_prepare", lambda *a: checked.append(1) or prepare(*a))
    lens = np.array([300, 17, 90], np.int32)
    cq = np.arange(4, dtype=np.int32)
    for seed in range(4):
        kc, vc, bt, _, _ = make_cache(list(lens), 16, 2, 128, seed=seed)
        q = torch.tensor(np.random.default_rng(seed).standard_normal((3, 8, 128)).astype(np.float32)).half()
        if seed == 3:  # an address 2 bytes past a 16-byte boundary, same shape and strides
            base = torch.empty(q.numel() + 8, dtype=torch.float16).cuda()
            qd = base[1:1 + q.numel()].view(3, 8, 128)
            qd.copy_(q.cuda())
        else:
            qd = q.cuda()
        got, lse = fmha_dsl.paged_attention(qd, kc.cuda(), vc.cuda(), block_table=torch.tensor(bt).cuda(),
                                            seqlens_k=torch.tensor(lens).cuda(), cu_seqlens_q=torch.tensor(cq).cuda(),
                                            max_seqlen_q=1, max_seqlen_k=320, return_lse=True)
        want, wlse = ref_paged(q.float().numpy(), kc.float().numpy(), vc.float().numpy(), block_table=bt,
                               seqlens_k=lens, cu_seqlens_q=cq, return_lse=True)
        assert np.abs(got.float().cpu().numpy() - want).max() < 1.5e-2
        assert np.abs(lse.cpu().numpy() - wlse).max() < 2e-2
    assert len(checked) <= 2, checked       # the first call (unless an earlier test made it) and the misaligned one
    if path == "extension":
        assert replay.replayer().stats()["hits"] >= hits + 2    # seeds 1 and 2 replayed in C++
    # a server's preallocated out and workspace (unused by a plan without split-KV): replayed as well
    ws = torch.empty(1 << 16, dtype=torch.float32, device="cuda")
    out = torch.empty(3, 8, 128, dtype=torch.float16, device="cuda")
    n = len(checked)
    for _ in range(3):
        fmha_dsl.paged_attention(qd, kc.cuda(), vc.cuda(), block_table=torch.tensor(bt).cuda(),
                                 seqlens_k=torch.tensor(lens).cuda(), cu_seqlens_q=torch.tensor(cq).cuda(),
                                 max_seqlen_q=1, max_seqlen_k=320, out=out, workspace=ws)
    assert len(checked) <= n + 1, "a call with out= and workspace= was not replayed"


def test_the_readme_serving_example_runs_as_shown():
    import os
    import re

    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "fmha_dsl.append_kv(kc" in b)
    ns = {"torch": torch, "fmha_dsl": fmha_dsl}
    exec(block, ns)
    out, lens = ns["out"], ns["lens"]
    assert tuple(out.shape) == (4, 32, 128) and torch.isfinite(out).all()
    want = ref_paged(ns["q1"].float().cpu().numpy(), ns["kc"].float().cpu().numpy(), ns["vc"].float().cpu().numpy(),
                     block_table=ns["bt"].cpu().numpy(), seqlens_k=(lens + 1).cpu().numpy(),
                     cu_seqlens_q=ns["cu"].cpu().numpy())
    assert np.abs(out.float().cpu().numpy() - want).max() < 6e-2


def test_the_tma_pipeline_from_a_built_registry_and_only_for_contiguous_pages(tmp_path):
    from fmha_dsl.build import build
    from fmha_dsl.runtime.dispatch import detect_arch

    arch = detect_arch()
    if arch != "sm90":
        pytest.skip("TMA descriptors: sm90")
    src = tmp_path / "tma.fmha"
    src.write_text("""kernel_set tma { backend(triton) arch(sm90) dtype(fp16) hdim(64)
      kernel p { signature { family(batch_prefill) mask(causal) lse(true) kv_cache(linear, vllm, 1024) }
                 algorithm { pipeline(qr_async_trload) tile_m0(128) tile_n0(64) tile_k0(64) tile_n1(64) tile_k0max(64)
                             wave_m0(4) } } }""")
    res = build(fmha_dsl.load(str(src)), str(tmp_path / "out"), jobs=4, cache_dir=str(tmp_path / "cache"))
    assert not res.failures, res.failures
    run_case([100, 3], [2500, 700], page=1024, hq=4, hk=4, d=64, causal=True, registry=str(tmp_path / "out"))
    kc, vc, bt, _, _ = make_cache([700], 1024, 4, 64)
    hnd = kc.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)     # pages' rows not contiguous: no TMA kernel
    with pytest.raises(fmha_dsl.DispatchError, match="no kernel"):
        fmha_dsl.paged_attention(torch.randn(1, 4, 64, dtype=torch.float16).cuda(), hnd.cuda(), hnd.cuda(),
                                 block_table=torch.tensor(bt).cuda(), seqlens_k=torch.tensor([700]).int().cuda(),
                                 cu_seqlens_q=torch.tensor([0, 1]).int().cuda(), max_seqlen_q=1, max_seqlen_k=700,
                                 causal=True, return_lse=True, registry=str(tmp_path / "out"))


@pytest.mark.parametrize("page,form", [(16, "vllm"), (16, "sglang"), (1024, "vllm")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cks_vectorized_layout(page, form, dtype):
    """K [P, Hk, D / 8, page, 8] and V [P, Hk, page / 8, Dv, 8]: prefill under a mask, decode (split-KV, packed GQA),
    GQA and head dims 80/128, against the reference on the same values in the linear layout."""
    run_case([37, 1, 0, 130], [300, 17, 5, 1100 if page == 1024 else 600], page=page, form=form, causal=True,
             dtype=dtype, vectorized=True)
    run_case([1, 1, 1, 1], [300, 17, 0, 2000], page=page, form=form, seed=2, dtype=dtype, vectorized=True)
    run_case([20, 65], [130, 64], page=page, form=form, d=80, dtype=dtype, hq=4, hk=4, window=(32, 0),
             vectorized=True)


def test_append_kv_into_a_vectorized_cache_then_attend():
    rng = np.random.default_rng(8)
    lens, new = [30, 0, 17, 5], [1, 4, 0, 16]
    hk, hq, d, page = 2, 8, 128, 16
    kc, vc, bt, _, _ = make_cache(lens, page, hk, d, extra=new)
    kn = rng.standard_normal((sum(new), hk, d)).astype(np.float16)
    vn = rng.standard_normal((sum(new), hk, d)).astype(np.float16)
    cn = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    th = np.arange(128)[:, None] * (10000.0 ** (-np.arange(64) / 64))
    cos, sin = np.cos(th).astype(np.float32), np.sin(th).astype(np.float32)
    wk, wv, _ = ref_append(kc.float().numpy(), vc.float().numpy(), kn, vn, seqlens_k=np.asarray(lens, np.int32),
                           cu_seqlens_new=cn, block_table=bt, rotary_cos=cos, rotary_sin=sin)
    k5, v5 = (t.cuda() for t in vectorized_caches(kc, vc))
    btd, cnd = torch.tensor(bt).cuda(), torch.tensor(cn).cuda()
    fmha_dsl.append_kv(k5, v5, torch.tensor(kn).cuda(), torch.tensor(vn).cuda(), block_table=btd,
                       seqlens_k=torch.tensor(lens).cuda(), cu_seqlens_new=cnd, rotary_cos=torch.tensor(cos).cuda(),
                       rotary_sin=torch.tensor(sin).cuda())
    gk, gv = linear_caches(k5.float().cpu(), v5.float().cpu())
    assert np.abs(gk.numpy() - wk).max() < 1e-2 and np.abs(gv.numpy() - wv).max() < 1e-2
    total = np.asarray(lens) + np.asarray(new)
    q = torch.randn(4, hq, d, dtype=torch.float16)
    cq = np.arange(5, dtype=np.int32)
    want = ref_paged(q.float().numpy(), wk, wv, block_table=bt, seqlens_k=total, cu_seqlens_q=cq,
                     causal="bottom_right")
    out = fmha_dsl.paged_attention(q.cuda(), k5, v5, block_table=btd, seqlens_k=torch.tensor(total).cuda(),
                                   cu_seqlens_q=torch.tensor(cq).cuda(), causal=True)
    assert np.abs(out.float().cpu().numpy() - want).max() < 2e-2


# ---- the gathered route: a prefill's K/V copied contiguous, then the forward kernels ------------------------------
def _prepared(lens_q, lens_k, *, page, form, layout="linear", hq=8, hk=2, d=128, seed=0, dtype=torch.bfloat16, **kw):
    """The API's checked preparation of a call (its plan, packed arguments, out and LSE), the reference, and the
    call's tensors (the packed arguments hold their addresses: keep them while launching)."""
    from fmha_dsl import paged
    from fmha_dsl.attention_args import CALLER

    rng = np.random.default_rng(seed + 1)
    kc, vc, bt, ip, ix = make_cache(lens_k, page, hk, d, seed=seed, dtype=dtype, shared_prefix=1)
    q = torch.tensor(rng.standard_normal((sum(lens_q), hq, d)).astype(np.float32)).to(dtype)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    lens = np.asarray(lens_k, np.int32)
    tab = {"block_table": bt} if form == "vllm" else {"kv_indptr": ip, "kv_indices": ix}
    rkw = dict(kw, causal="bottom_right") if kw.get("causal") is True else kw
    want, wlse = ref_paged(q.float().numpy(), kc.float().numpy(), vc.float().numpy(), seqlens_k=lens,
                           cu_seqlens_q=cq, return_lse=True, **tab, **rkw)
    kd, vd = vectorized_caches(kc, vc) if layout == "vectorized" else (kc, vc)
    dev = {k: torch.tensor(v).cuda() for k, v in tab.items()}
    alibi = kw.get("alibi_slopes")
    tensors = (q.cuda(), kd.cuda(), vd.cuda(), torch.tensor(lens).cuda(), torch.tensor(cq).cuda(),
               None if alibi is None else torch.tensor(alibi).cuda(), dev)
    qd, kdd, vdd, lens_d, cq_d, alibi_d, _ = tensors
    token = CALLER.set("test")
    try:
        got = paged._prepare(
            qd, kdd, vdd, dev.get("block_table"), dev.get("kv_indptr"), dev.get("kv_indices"), lens_d, cq_d,
            max(lens_q), max(lens_k), "bottom_right" if kw.get("causal") is True else kw.get("causal", False),
            kw.get("window"), alibi_d, kw.get("softcap"), kw.get("sink"), None, True, None, None, (None, None, None))
    finally:
        CALLER.reset(token)
    return got, (want, wlse), tensors


def _gathered(plan):
    """The gathered route for ``plan``'s problem on the default dispatcher, whatever first use chose."""
    from fmha_dsl import api_dispatch
    from fmha_dsl.runtime.plan_gather import GatheredPlan, forward_problem

    if isinstance(plan, GatheredPlan):
        return plan
    disp = api_dispatch.dispatcher(None, torch.cuda.current_device())
    entry, binary = disp.builder.gather(plan.problem, disp.arch)
    assert entry is not None, binary
    return GatheredPlan(plan.problem, disp.loose_stage(entry, binary), disp.plan(forward_problem(plan.problem)), plan)


def _check(out, lse, want, wlse, tol=6e-2):
    got = out.float().cpu().numpy()
    assert np.isfinite(got).all() and np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())
    gl, live = lse.cpu().numpy(), np.isfinite(wlse)
    assert np.array_equal(np.isfinite(gl), live) and np.abs(gl[live] - wlse[live]).max(initial=0) < 2e-2


@pytest.mark.parametrize("page,form,layout", [(1, "sglang", "linear"), (16, "vllm", "linear"),
                                              (16, "sglang", "vectorized"), (1024, "vllm", "linear")])
@pytest.mark.parametrize("kw", [{"causal": True}, {"window": (100, 0), "sink": 4, "softcap": 30.0},
                                {"alibi_slopes": np.linspace(0.02, 0.3, 16).astype(np.float32)}],
                         ids=["causal", "window_sink_softcap", "alibi"])
def test_the_gathered_route_equals_the_reference(page, form, layout, kw, monkeypatch):
    """Copy + forward kernel on scattered pages (a shared first page, an empty sequence, lengths not multiples of
    the page): the reference's numbers and LSE, for both table forms, both layouts, pages 1 / 16 / 1024.  (A grid
    of more than two waves: the route takes no split-KV forward kernel.)"""
    monkeypatch.setenv("FMHA_DSL_AUTOTUNE", "0")   # the cost model's kernels: this test is about the numbers
    (plan, dev, b, hq, msq, args, out, lse, _), (want, wlse), _tensors = _prepared(
        [1100, 130, 0, 64], [2000, 130, 40, 900], page=page, form=form, layout=layout, hq=16, **kw)
    out.fill_(float("nan"))
    gathered = _gathered(plan)
    steps, _ = gathered.launch(dev, b, hq, msq, args)
    assert [k for k, _, _ in steps] == [st.kernel(dev) for st in gathered.stages]   # the copy, then the forward
    _check(out, lse, want, wlse)


def test_a_prefill_times_the_gathered_route_and_it_replays_and_is_captured(monkeypatch):
    """Through the public API: a prefill-sized call times the gathered route against the paged kernels (a route
    record); forced to win, it replays with new tables and lengths, and a CUDA graph captured with a workspace of
    workspace_numel() elements replays it.  The route runs one forward kernel over the copy: where the forward's
    first use picks a split-KV kernel (a prefill of few programs can: its splits share the keys in reach) the paged
    plan stays, so the forward's split-KV candidates are left out here."""
    from fmha_dsl import api_dispatch
    from fmha_dsl.first_use import Builder
    from fmha_dsl.paged import workspace_numel
    from fmha_dsl.runtime import plan_gather

    real = Builder.candidates
    monkeypatch.setattr(Builder, "candidates", lambda self, p, *a, **kw: [
        e for e in real(self, p, *a, **kw) if p.family != "fwd" or e.sig.get("family") != "fwd_splitkv"])
    disp = api_dispatch.dispatcher(None, torch.cuda.current_device())
    # route decisions in memory only: none recorded by an earlier process, and the forced one below not persisted
    monkeypatch.setattr(disp, "tuned", plan_gather.decisions.TunedTable(disp.arch, disp.tuned.device))
    before = {k for k in disp.measured if k.endswith("|route")}
    (plan, *_), _, _tensors = _prepared([300, 260], [2000, 700], page=16, form="vllm", hq=8, hk=1, causal=True)
    assert {k for k in disp.measured if k.endswith("|route")} - before, "the gathered route was not timed"
    monkeypatch.setattr(plan_gather.race, "fastest", lambda measure, plans, rounds=4: ("gathered", {}))
    hk, hq, d, page, B = 3, 12, 128, 16, 3
    lens_q, lens_k = [150, 90, 40], [900, 300, 1200]
    kc, vc, bt, _, _ = make_cache(lens_k, page, hk, d, spare=8)
    kc, vc = kc.cuda(), vc.cuda()
    bt_d, lens_d = torch.tensor(bt).cuda(), torch.tensor(lens_k, dtype=torch.int32).cuda()
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cq_d = torch.tensor(cq).cuda()
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.float16).cuda()
    mk = page * bt.shape[1]
    ws = torch.empty(workspace_numel(q, kc, vc, batch=B, max_seqlen_q=max(lens_q), max_seqlen_k=mk),
                     dtype=torch.float32, device="cuda")
    out = torch.empty_like(q)

    def step():
        fmha_dsl.paged_attention(q, kc, vc, block_table=bt_d, seqlens_k=lens_d, cu_seqlens_q=cq_d, causal=True,
                                 max_seqlen_q=max(lens_q), max_seqlen_k=mk, out=out, workspace=ws)

    def want():
        return ref_paged(q.float().cpu().numpy(), kc.float().cpu().numpy(), vc.float().cpu().numpy(),
                         block_table=bt_d.cpu().numpy(), seqlens_k=lens_d.cpu().numpy(), cu_seqlens_q=cq,
                         causal="bottom_right")

    step()
    # paged.py's plan keys: (dtype, qscale, dq, dv, hq, ...)
    key = next(k for k, p in disp.fast_paged.items() if isinstance(p, plan_gather.GatheredPlan) and k[4] == hq)
    assert key
    for lens in ([900, 300, 1200], [17, 1000, 0]):   # replayed with new tables and lengths
        lens_d.copy_(torch.tensor(lens, dtype=torch.int32))
        bt_d.copy_(torch.tensor(np.roll(bt, 1, axis=0)))
        step()
        torch.cuda.synchronize()
        assert np.abs(out.float().cpu().numpy() - want()).max() < 1.5e-2
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for lens in ([5, 640, 1100], [900, 300, 1200]):
        lens_d.copy_(torch.tensor(lens, dtype=torch.int32))
        bt_d.copy_(torch.tensor(np.roll(bt, 2, axis=0)))
        q.normal_()
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert np.abs(out.float().cpu().numpy() - want()).max() < 1.5e-2


def test_the_route_decision_is_recorded_and_a_new_process_takes_it_untimed(monkeypatch):
    """The route first use times is persisted with the first-use decisions: a dispatcher made afresh on the same
    cache (as a new process makes it) takes a recorded route -- paged or gathered -- without timing anything again;
    a record that names another paged kernel or another forward decision, or a damaged one, is timed again."""
    from fmha_dsl import api_dispatch
    from fmha_dsl.first_use import Builder
    from fmha_dsl.runtime import decisions, plan_gather
    from fmha_dsl.runtime.dispatch import Dispatcher

    (plan, dev, b, hq, msq, args, *_), _, _tensors = _prepared([1100, 900], [3000, 1000], page=16, form="sglang",
                                                               hq=16, hk=4, causal=True)
    disp = api_dispatch.dispatcher(None, dev)
    problem = plan.problem
    rk = plan_gather.route_key(problem, True)
    rec = disp.tuned.get(rk)
    assert rec is not None and rec["route"] in ("paged", "gathered"), rec
    assert rec["space"] == disp.builder.fingerprint("batch_prefill") and len(rec["times_us"]) == 2
    on_disk = decisions._read(disp.tuned.path, disp.arch, disp.tuned.device)
    assert on_disk[rk]["route"] == rec["route"]                       # persisted, not only held by this process

    fkey = decisions.key(plan_gather.forward_problem(problem), True)
    assert disp.tuned.get(fkey)["kernel"] == rec["forward"]          # the forward decision it was measured with
    seed = {fkey: disp.tuned.get(fkey)}

    fresh = Dispatcher(None, disp.arch, builder=Builder(), device_name=torch.cuda.get_device_name(dev))

    def no_timing(*a, **k):
        raise AssertionError("a recorded decision was timed again")
    monkeypatch.setattr(plan_gather.race, "fastest", no_timing)
    monkeypatch.setattr(plan_gather.race, "_time_n", no_timing)  # nor any kernel decision under it
    measure = api_dispatch.timer(dev, lambda p: p.launch(dev, b, hq, msq, args))
    paged = fresh.plan(problem, True, measure)
    assert paged.entry.name == rec["paged"]

    def route_with(record):   # the route of this call on `fresh` with `record` in an in-memory table (not persisted)
        # as recorded on this device (a shipped decision with close runners-up would be timed again)
        fresh.tuned = decisions.TunedTable(fresh.arch, disp.tuned.device)
        for k, r in dict(seed, **{rk: record}).items():
            fresh.tuned.record(k, r)
        return plan_gather.with_gathered(fresh, paged, problem, True, dev, b, hq, msq, args,
                                         lambda launch: api_dispatch.timer(dev, launch))
    for route in ("paged", "gathered"):   # either recorded route is taken as recorded, untimed
        got = route_with(dict(rec, route=route))
        assert isinstance(got, plan_gather.GatheredPlan) == (route == "gathered")
        if route == "gathered":
            assert got.forward.entry.name == rec["forward"]
    # a record that no longer holds is timed again: another paged kernel, another forward decision, a damaged route
    for stale in (dict(rec, paged="fmha_batch_prefill_another_kernel"), dict(rec, forward="fmha_fwd_another_kernel"),
                  dict(rec, route="sideways")):
        timed = []
        monkeypatch.setattr(plan_gather.race, "fastest", lambda measure, plans, rounds=4: timed.append(1) or
                            ("paged", {"paged": 1.0, "gathered": 2.0}))
        assert route_with(stale) is paged and timed, stale
        assert fresh.tuned.get(rk)["paged"] == paged.entry.name and fresh.tuned.get(rk)["route"] == "paged"
