"""FP8 serving on a GPU (CK's ``fp8bf16``: e4m3 q and caches, per-tensor descales or KV block scales, bf16 output)
against the NumPy reference on the same e4m3 values, for prefill and decode (split-KV), both table forms, page sizes
smaller and larger than a key block, GQA, masks, the vectorized layout, a CUDA-graph captured step whose descales
change between replays, appends quantized by a per-tensor or a per-page descale.  (The argument checks run on the
CPU: tests/test_paged_api.py.)

    python3 -P -m pytest -q tests/test_gpu_paged_fp8.py -p no:cacheprovider
"""

import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import fmha_dsl  # noqa: E402
from fmha_dsl.reference_paged import paged_attention as ref_paged  # noqa: E402
from fmha_dsl.reference_paged import vectorized_caches  # noqa: E402

from test_gpu_paged import make_cache  # noqa: E402

TOL = 2.5e-2   # bf16 P and output on values that are exact in e4m3


@pytest.fixture(scope="module", autouse=True)
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    os.environ.setdefault("FMHA_DSL_TUNE_CANDIDATES", "4")


def block_scales(kc, lens_k, bt, page, seed=0):
    """K/V block scales ``[num_pages, Hk]`` spread 16-fold (K: 2^-5 .. 2^-1, keeping the scores in a range where
    the FP8 MMA's accumulation is as close as the tolerances say) and 256-fold (V: 2^-5 .. 2^3), NaN on pages no
    sequence reads."""
    rng = np.random.default_rng(seed + 9)
    num_pages, hk = kc.shape[0], kc.shape[2]
    used = {int(bt[b, j]) for b, n in enumerate(lens_k) for j in range(-(-n // page))}
    out = []
    for top in (0, 4):
        d = (2.0 ** rng.integers(-5, top, (num_pages, hk)) * rng.uniform(0.6, 1.0, (num_pages, hk))).astype(np.float32)
        d[[p for p in range(num_pages) if p not in used]] = np.nan
        out.append(d)
    return out


def token_scales(kc, lens_k, bt, page, tq, hq, seed=0):
    """CK's per_token_head scales: q's ``[Tq, Hq]`` (some negative) and K/V ``[num_pages, page_size, Hk]`` spread
    token by token as :func:`block_scales` spreads pages, NaN in every slot no sequence reads."""
    rng = np.random.default_rng(seed + 11)
    num_pages, hk = kc.shape[0], kc.shape[2]
    read = np.zeros((num_pages, page), bool)
    for b, n in enumerate(lens_k):
        for j in range(n):
            read[bt[b, j // page], j % page] = True
    out = [(rng.uniform(0.1, 0.6, (tq, hq)) * rng.choice([-1, 1], (tq, hq))).astype(np.float32)]
    for top in (0, 4):
        d = (2.0 ** rng.integers(-5, top, (num_pages, page, hk)) * rng.uniform(0.6, 1.0, (num_pages, page, hk)))
        d = d.astype(np.float32)
        d[~read] = np.nan
        out.append(d)
    return out


def _case(lens_q, lens_k, *, page=16, hq=8, hk=2, d=128, form="vllm", seed=0, descales=(0.5, 0.25, 2.0),
          vectorized=False, blocks=False, tokens=False, **kw):
    rng = np.random.default_rng(seed + 1)
    kc, vc, bt, ip, ix = make_cache(lens_k, page, hk, d, seed=seed, dtype=torch.float32)
    if blocks:  # CK's KV block scales: a descale per page and K/V head
        descales = (descales[0], *block_scales(kc, lens_k, bt, page, seed))
    if tokens:  # CK's per_token_head: a descale per query token and head, and per cached token and K/V head
        descales = token_scales(kc, lens_k, bt, page, sum(lens_q), hq, seed)
    kc8, vc8 = (x.mul(4).to(torch.float8_e4m3fn) for x in (kc, vc))
    q8 = torch.tensor(rng.standard_normal((sum(lens_q), hq, d)).astype(np.float32) * 4).to(torch.float8_e4m3fn)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    lens = np.asarray(lens_k, np.int32)
    tab = {"block_table": bt} if form == "vllm" else {"kv_indptr": ip, "kv_indices": ix}
    gkw = dict(kw)
    if "alibi_slopes" in kw:  # NumPy slopes for the reference, a tensor for the GPU
        gkw["alibi_slopes"] = torch.tensor(kw["alibi_slopes"], device="cuda")
    kw.pop("registry", None)
    rkw = dict(kw, causal="bottom_right") if kw.get("causal") is True else kw
    want, wlse = ref_paged(q8.float().numpy(), kc8.float().numpy(), vc8.float().numpy(), seqlens_k=lens,
                           cu_seqlens_q=cq, return_lse=True, descales=descales, **tab, **rkw)
    dev = "cuda"
    kg, vg = kc8.to(dev), vc8.to(dev)
    if vectorized:
        kg, vg = (torch.from_numpy(a).to(dev).view(torch.float8_e4m3fn) for a in
                  vectorized_caches(kc8.view(torch.uint8).numpy(), vc8.view(torch.uint8).numpy(), 16))
    ds = [torch.tensor(np.float32(x).reshape(np.shape(x) or (1,)), device=dev) for x in descales]
    gt = {k: torch.tensor(v, device=dev) for k, v in tab.items()}
    out, lse = fmha_dsl.paged_attention(q8.to(dev), kg, vg, seqlens_k=torch.tensor(lens, device=dev),
                                        cu_seqlens_q=torch.tensor(cq, device=dev), max_seqlen_q=int(max(lens_q)),
                                        max_seqlen_k=int(max(lens_k)), return_lse=True, q_descale=ds[0],
                                        k_descale=ds[1], v_descale=ds[2], **gt, **gkw)
    assert out.dtype == torch.bfloat16
    got = out.float().cpu().numpy()
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
    assert np.isfinite(got).all() and err < TOL, err
    live = np.isfinite(wlse)
    assert np.allclose(lse.cpu().numpy()[live], wlse[live], atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("page,form", [(1, "vllm"), (16, "sglang"), (1024, "vllm")])
def test_prefill_over_an_fp8_cache(page, form):
    _case([37, 130, 0, 64], [200, 130, 5, 1500], page=page, form=form, causal=True)


@pytest.mark.parametrize("page", [16, 1024])
def test_decode_over_an_fp8_cache_splits_the_keys(page):
    _case([1] * 6, [1, 17, 4000, 9000, 333, 2048], page=page, hq=32, hk=8)


def test_masks_softcap_and_a_negative_descale():
    _case([20, 7], [300, 700], page=16, window=(64, 0), causal=True, softcap=30.0, descales=(-0.5, 0.75, -1.5))


def test_the_vectorized_layout_holds_fp8():
    _case([3, 40], [90, 600], page=16, vectorized=True)


@pytest.mark.parametrize("page,form,vectorized", [(1, "vllm", False), (16, "sglang", False), (1024, "vllm", False),
                                                  (16, "vllm", True)])
def test_kv_block_scales_over_prefill_and_decode(page, form, vectorized):
    """CK's KV block scales (``k_descale``/``v_descale`` of shape [num_pages, Hk]): prefill (causal) and decode
    (split-KV, GQA 4:1) against the reference on the scaled values; pages of 1 and 16 (a key block spans pages: a
    descale per key) and 1024 (one per block)."""
    _case([37, 130, 0, 64], [200, 130, 5, 1500], page=page, form=form, causal=True, blocks=True,
          vectorized=vectorized)
    _case([1] * 6, [1, 17, 4000, 9000, 333, 2048], page=page, form=form, hq=32, hk=8, blocks=True,
          vectorized=vectorized, seed=2)


@pytest.mark.parametrize("page,form,vectorized", [(1, "vllm", False), (16, "sglang", False), (1024, "vllm", False),
                                                  (16, "vllm", True)])
def test_per_token_head_scales_over_prefill_and_decode(page, form, vectorized):
    """CK's per_token_head scales (q_descale [Tq, Hq], k_descale/v_descale [num_pages, page_size, Hk]): prefill
    (causal) and decode (split-KV, GQA 4:1) against the reference on the scaled values, NaN in the slots no sequence
    reads."""
    _case([37, 130, 0, 64], [200, 130, 5, 1500], page=page, form=form, causal=True, tokens=True,
          vectorized=vectorized)
    _case([1] * 6, [1, 17, 4000, 9000, 333, 2048], page=page, form=form, hq=32, hk=8, tokens=True,
          vectorized=vectorized, seed=2)


def test_per_token_head_scales_with_windows_sinks_and_softcap():
    _case([20, 7], [300, 700], page=16, window=(64, 0), causal=True, softcap=30.0, sink=4, tokens=True)


VROWS_SET = """kernel_set vrows { backend(triton) arch(sm90) dtype(fp8bf16) hdim(128)
  kernel rows { signature { family(batch_prefill) qscale(per_token_head | kv_blockscale) mask(causal) bias(no | alibi)
                            lse(true) kv_cache(linear, vllm | sglang, 16) }
                algorithm { pipeline(qr) tile_m0(128) tile_n0(64) tile_k0(128) tile_n1(128) tile_k0max(128)
                            wave_m0(8) } }
  kernel tma { signature { family(batch_prefill) qscale(per_token_head) mask(causal) lse(true)
                           kv_cache(linear, vllm, 1024) }
               algorithm { pipeline(qr_async_trload) tile_m0(128) tile_n0(64) tile_k0(128) tile_n1(128)
                           tile_k0max(128) wave_m0(8) } } }"""


def test_v_descales_on_v_rows_from_a_built_registry(tmp_path):
    """The 128 x 64 prefill tiles take a V descale per key on V's rows (``V_ROWS``; first use may pick other tiles,
    so a registry holds only these): per-token-head and block scales over pages of 16 -- both table forms, a
    window, ALiBi -- and per-token-head scales over TMA pages of 1024, against the reference."""
    from fmha_dsl.build import build
    from fmha_dsl.kernels.paged_host import constexprs
    from fmha_dsl.runtime.dispatch import detect_arch

    if detect_arch() != "sm90":
        pytest.skip("the set is written for sm90's tiles")
    ks = fmha_dsl.loads(VROWS_SET, path="vrows.fmha")
    assert all(constexprs(e.sig, e.alg)["V_ROWS"] for e in ks.registry(arch="sm90"))
    res = build(ks, str(tmp_path / "out"), jobs=8, cache_dir=str(tmp_path / "cache"))
    assert not res.failures, res.failures
    reg = str(tmp_path / "out")
    slopes = np.array([0.5, 0.25, 0.125, 0.0625, 0.03, 0.02, 0.01, 0.005], np.float32)
    _case([37, 130, 0, 64], [200, 130, 5, 1500], causal=True, tokens=True, registry=reg)
    _case([20, 7, 90], [300, 700, 90], form="sglang", window=(64, 0), causal=True, tokens=True,
          alibi_slopes=slopes, registry=reg, seed=3)
    _case([37, 130, 0, 64], [200, 130, 5, 1500], causal=True, blocks=True, alibi_slopes=slopes, registry=reg, seed=4)
    _case([37, 130, 0, 64], [200, 130, 5, 2500], page=1024, causal=True, tokens=True, registry=reg, seed=5)


def test_a_captured_step_reads_the_descales_each_replay():
    """A server step (maxima, out and workspace given: replayed, CUDA-graph captured) over one cache, called with
    per-tensor descales, block scales, per-token-head ones, then each again (one shape: each keeps its own plan and
    recipe),
    each against the reference; a captured block-scale step replayed after some pages' K and V scales changed."""
    dev = "cuda"
    lens = [500, 900]
    kc, vc, bt, _, _ = make_cache(lens, 16, 2, 128, dtype=torch.float32)
    kc8, vc8 = (x.to(torch.float8_e4m3fn) for x in (kc, vc))
    q8 = torch.randn(2, 8, 128).to(torch.float8_e4m3fn)
    kw = dict(block_table=torch.tensor(bt, device=dev),
              seqlens_k=torch.tensor(lens, device=dev, dtype=torch.int32),
              cu_seqlens_q=torch.tensor([0, 1, 2], device=dev, dtype=torch.int32), max_seqlen_q=1, max_seqlen_k=900)
    qg, kg, vg = (x.to(dev) for x in (q8, kc8, vc8))
    ws = torch.empty(fmha_dsl.paged.workspace_numel(qg, kg, vg, batch=2, max_seqlen_q=1, max_seqlen_k=900),
                     device=dev)
    out = torch.empty(2, 8, 128, device=dev, dtype=torch.bfloat16)
    per_tensor = [torch.tensor([x], device=dev) for x in (0.5, 0.25, 2.0)]
    blocks = [torch.tensor([0.5], device=dev)] + [torch.tensor(d, device=dev) for d in
                                                  block_scales(kc, lens, bt, 16, seed=4)]
    tokens = [torch.tensor(d, device=dev) for d in token_scales(kc, lens, bt, 16, 2, 8, seed=5)]

    def step(ds):
        fmha_dsl.paged_attention(qg, kg, vg, out=out, workspace=ws, q_descale=ds[0], k_descale=ds[1],
                                 v_descale=ds[2], **kw)

    def check(ds):
        want = ref_paged(q8.float().numpy(), kc8.float().numpy(), vc8.float().numpy(), block_table=bt,
                         seqlens_k=np.int32(lens), cu_seqlens_q=np.array([0, 1, 2]),
                         descales=[d.cpu().numpy().reshape(-1)[0] if d.numel() == 1 else d.cpu().numpy()
                                   for d in ds])
        err = np.abs(out.float().cpu().numpy() - want).max() / np.abs(want).max()
        assert err < TOL, err

    for ds in (per_tensor, blocks, tokens) * 2:   # the second round replays the first round's recipes
        step(ds)
        check(ds)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(blocks)
    for d in blocks[1:]:   # a server rescales some pages: every third page's K and V scales
        d[::3] *= 3.0
    g.replay()
    torch.cuda.synchronize()
    check(blocks)
    per_tensor[2].fill_(3.0)
    step(per_tensor)
    check(per_tensor)


def test_block_scales_may_be_strided_views():
    """Block-scale tensors are read through their strides: a transposed view, and a per-head scale expanded over the
    pages (page stride 0)."""
    lens = [37, 300]
    kc, vc, bt, _, _ = make_cache(lens, 16, 2, 128, dtype=torch.float32)
    kc8, vc8 = (x.to(torch.float8_e4m3fn) for x in (kc, vc))
    q8 = torch.randn(40, 8, 128).to(torch.float8_e4m3fn)
    kd, vd = block_scales(kc, lens, bt, 16, seed=1)
    kd_t = torch.tensor(kd.T.copy(), device="cuda").t()                       # [P, Hk] with strides (1, P)
    vd_e = torch.tensor([0.5, 2.0], device="cuda")[None, :].expand(kc.shape[0], 2)   # strides (0, 1)
    assert kd_t.stride() == (1, kc.shape[0]) and vd_e.stride() == (0, 1)
    cq = np.array([0, 3, 40], np.int32)
    want = ref_paged(q8.float().numpy(), kc8.float().numpy(), vc8.float().numpy(), block_table=bt,
                     seqlens_k=np.int32(lens), cu_seqlens_q=cq, causal="bottom_right",
                     descales=(1.0, kd, np.broadcast_to(np.float32([0.5, 2.0]), kd.shape)))
    out = fmha_dsl.paged_attention(q8.cuda(), kc8.cuda(), vc8.cuda(), block_table=torch.tensor(bt, device="cuda"),
                                   seqlens_k=torch.tensor(lens, dtype=torch.int32, device="cuda"),
                                   cu_seqlens_q=torch.tensor(cq, device="cuda"), causal=True,
                                   q_descale=torch.ones(1, device="cuda"), k_descale=kd_t, v_descale=vd_e)
    err = np.abs(out.float().cpu().numpy() - want).max() / np.abs(want).max()
    assert err < TOL, err


@pytest.mark.parametrize("vectorized,blocks", [(False, False), (True, False), (False, True), (True, True)])
def test_an_fp8_append_quantizes_the_new_rows_and_attention_reads_them(vectorized, blocks):
    """bf16 new rows (RoPE'd) into FP8 caches through ``append_kv(..., k_descale=, v_descale=)``: V's bytes are
    torch's own ``(v / v_descale).clamp(+-448).to(float8_e4m3fn)`` -- with KV block scales, the descale of the page
    and head a row lands in --, K's the NumPy reference's (one e4m3 step at most where fp32 and float64 RoPE round
    apart), q rotated in bf16; then attention over the appended pages with the same descales."""
    from fmha_dsl.reference_paged import append_kv as ref_append, linear_caches

    dev = "cuda"
    lens, new = [40, 0, 300], [5, 17, 1]
    hk, hq, d = 2, 8, 128
    kc, vc, bt, _, _ = make_cache(lens, 16, hk, d, extra=new, dtype=torch.float32)
    kc8, vc8 = (x.mul(4).to(torch.float8_e4m3fn) for x in (kc, vc))
    g = torch.Generator().manual_seed(0)
    kn, vn, q = (torch.randn(sum(new), h, d, generator=g).mul(30).to(torch.bfloat16) for h in (hk, hk, hq))
    cn = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    th = np.arange(400)[:, None] * (10000.0 ** (-np.arange(64) / 64))
    cos, sin = np.cos(th).astype(np.float32), np.sin(th).astype(np.float32)
    ds = (0.25, 0.5)
    if blocks:
        ds = tuple(np.float32(2.0) ** np.random.default_rng(i).integers(-4, 3, (kc.shape[0], hk)).astype(np.float32)
                   for i in range(2))
    wk, wv, wq = ref_append(kc8.float().numpy(), vc8.float().numpy(), kn.float().numpy(), vn.float().numpy(),
                            block_table=bt, seqlens_k=lens, cu_seqlens_new=cn, rotary_cos=cos, rotary_sin=sin,
                            q=q.float().numpy(), descales=ds)
    kg, vg = kc8.to(dev), vc8.to(dev)
    if vectorized:
        kg, vg = (torch.from_numpy(a).to(dev).view(torch.float8_e4m3fn) for a in
                  vectorized_caches(kc8.view(torch.uint8).numpy(), vc8.view(torch.uint8).numpy(), 16))
    qg = q.to(dev)
    kd, vd = (torch.tensor(np.float32(x).reshape(np.shape(x) or (1,)), device=dev) for x in ds)
    fmha_dsl.append_kv(kg, vg, kn.to(dev), vn.to(dev), block_table=torch.tensor(bt, device=dev),
                       seqlens_k=torch.tensor(lens, dtype=torch.int32, device=dev),
                       cu_seqlens_new=torch.tensor(cn, device=dev), rotary_cos=torch.tensor(cos, device=dev),
                       rotary_sin=torch.tensor(sin, device=dev), q=qg, k_descale=kd, v_descale=vd)
    if vectorized:
        kg, vg = (torch.from_numpy(a).view(torch.float8_e4m3fn) for a in
                  linear_caches(kg.cpu().view(torch.uint8).numpy(), vg.cpu().view(torch.uint8).numpy()))
    gk, gv = kg.float().cpu().numpy(), vg.float().cpu().numpy()
    assert np.array_equal(gv, wv)
    rows = [(bt[b, (lens[b] + t) // 16], (lens[b] + t) % 16) for b in range(3) for t in range(new[b])]
    div = torch.tensor(np.stack([ds[1][p] for p, _ in rows])[:, :, None]) if blocks else ds[1]
    mine = (vn.float() / div).clamp(-448, 448).to(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(np.stack([gv[p, s] for p, s in rows]), mine)
    vb = vg.cpu().view(torch.uint8).numpy()
    assert np.array_equal(np.stack([vb[p, s] for p, s in rows]), torch.from_numpy(mine).to(torch.float8_e4m3fn)
                          .view(torch.uint8).numpy())
    assert np.all(np.abs(gk - wk) <= np.abs(wk) / 8 + 1e-6) and np.mean(gk != wk) < 1e-3
    assert np.abs(qg.float().cpu().numpy() - wq).max() <= 2 ** -7 * np.abs(wq).max()
    # attention over the appended pages: the new rows' queries (in e4m3) against the reference
    tot = [n + m for n, m in zip(lens, new)]
    q8 = torch.tensor(wq).to(torch.float8_e4m3fn)
    want = ref_paged(q8.float().numpy(), wk, wv, block_table=bt, seqlens_k=np.int32(tot), cu_seqlens_q=cn,
                     causal="bottom_right", descales=(1.0,) + ds)
    out = fmha_dsl.paged_attention(q8.to(dev), torch.from_numpy(gk).to(torch.float8_e4m3fn).to(dev),
                                   torch.from_numpy(gv).to(torch.float8_e4m3fn).to(dev),
                                   block_table=torch.tensor(bt, device=dev),
                                   seqlens_k=torch.tensor(tot, dtype=torch.int32, device=dev),
                                   cu_seqlens_q=torch.tensor(cn, device=dev), causal=True,
                                   q_descale=torch.ones(1, device=dev), k_descale=kd, v_descale=vd)
    err = np.abs(out.float().cpu().numpy() - want).max() / np.abs(want).max()
    assert err < TOL, err


def test_an_fp8_append_keeps_nan_and_minus_zero_and_its_replay_reads_each_calls_descales(monkeypatch):
    """V's bytes equal torch's quantization for NaN, -0 and saturating rows; a call that passes one tensor as both
    descales is not recorded, so the step replayed later (max_seqlen_new given, the checked path not taken) uses
    its own V descale."""
    checked = []
    real = fmha_dsl.paged._append
    monkeypatch.setattr(fmha_dsl.paged, "_append", lambda *a: (checked.append(1), real(*a))[1])
    dev = "cuda"
    kc8, vc8 = (torch.zeros(4, 16, 1, 128, device=dev).to(torch.float8_e4m3fn) for _ in range(2))
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=dev)
    vn = torch.randn(2, 1, 128, device=dev).mul(8).to(torch.bfloat16)
    vn[0, 0, :4] = torch.tensor([float("nan"), -1e-6, 1e5, -1e5])
    kw = dict(block_table=bt, seqlens_k=torch.tensor([3, 20], dtype=torch.int32, device=dev),
              cu_seqlens_new=torch.tensor([0, 1, 2], dtype=torch.int32, device=dev), max_seqlen_new=1)
    one = torch.ones(1, device=dev)
    kn = vn.clone()
    fmha_dsl.append_kv(kc8, vc8, kn, vn, k_descale=one, v_descale=one, **kw)   # one tensor for both: not recorded
    want = (vn.float() / 1.0).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    got = torch.stack([vc8[0, 3], vc8[3, 4]]).view(torch.uint8)
    assert torch.equal(got, want), (got[0, 0, :4], want[0, 0, :4])
    for vd in (0.5, 0.25):   # the second call replays the first's launch with this call's tensors
        fmha_dsl.append_kv(kc8, vc8, kn, vn, k_descale=one.clone(), v_descale=torch.tensor([vd], device=dev), **kw)
        want = (vn.float() / vd).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(torch.stack([vc8[0, 3], vc8[3, 4]]).view(torch.uint8), want), vd
    assert len(checked) == 2   # the aliased call and the first of the loop took the checked path; the last replayed
