"""The Triton serving templates (fmha_dsl/kernels/triton_paged.py) against the NumPy reference, on the CPU.

Paged attention and append-KV run under TRITON_INTERPRET=1 in one spawned worker (the flag must be set before triton
is imported).  Caches are built from random pages scattered over the cache (a shared prefix page, spare pages, an empty
sequence), small blocks (16 x 16) so that every loop range runs; the reference runs on the same rounded inputs.
"""


import numpy as np
import pytest

pytest.importorskip("triton")

from interpreted import both_guard_sides, harness_runner  # noqa: E402

from fmha_dsl.reference_paged import append_kv, linear_caches, paged_attention, vectorized_caches  # noqa: E402

TOL = {"fp32": 2e-5, "fp16": 2.5e-3, "bf16": 2e-2}


@pytest.fixture
def interp(interp_worker, request):
    """``call(name, *args, **kw)``: ``fmha_dsl.kernels.paged_interpret.<name>`` run in a worker process."""
    from fmha_dsl.kernels import paged_interpret

    return lambda name, *args, **kw: harness_runner(interp_worker, request, getattr(paged_interpret, name))(*args, **kw)


def _round(x, dtype):
    if dtype == "bf16":
        from fmha_dsl.kernels.fwd_interpret import bf16_round

        return bf16_round(x)
    return x.astype({"fp16": np.float16, "fp32": np.float32}[dtype])


def cache(lens, page, hk, d, dv=None, *, extra=None, seed=0, dtype="fp32", form="vllm"):
    """Random K/V for sequences of ``lens`` tokens (+ ``extra`` room) in scattered pages; page 0 of the cache is
    shared by every sequence as its first page (a common prompt prefix) -- unless there is ``extra`` room: an append
    writes each sequence's new rows into pages of its own."""
    rng = np.random.default_rng(seed)
    dv = dv or d
    shared = not any(extra or [])
    extra = extra or [0] * len(lens)
    need = [-(-(n + e) // page) for n, e in zip(lens, extra)]
    total = 1 + sum(max(0, n - shared) for n in need) + 2
    perm = 1 + rng.permutation(total - 1)
    pages, i = [], 0
    for n in need:
        own = max(0, n - shared)
        pages.append(([0] if n and shared else []) + list(perm[i:i + own]))
        i += own
    kc = _round(rng.standard_normal((total, page, hk, d)).astype(np.float32), dtype)
    vc = _round(rng.standard_normal((total, page, hk, dv)).astype(np.float32), dtype)
    if form == "vllm":
        bt = np.full((len(lens), max(need + [0]) + 2), -1, np.int32)  # padding entries are never read
        for b, p in enumerate(pages):
            bt[b, :len(p)] = p
        return kc, vc, {"block_table": bt}
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
    indices = np.concatenate([np.asarray(p, np.int32) for p in pages] + [np.zeros(0, np.int32)])
    return kc, vc, {"kv_indptr": indptr, "kv_indices": indices}


def check_paged(interp, lens_q, lens_k, *, page=4, hq=4, hk=2, d=32, dv=None, dtype="fp32", form="vllm", seed=0,
                run=None, **kw):
    rng = np.random.default_rng(seed + 7)
    kc, vc, tab = cache(lens_k, page, hk, d, dv, seed=seed, dtype=dtype, form=form)
    q = _round(rng.standard_normal((sum(lens_q), hq, d)).astype(np.float32), dtype)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    lens = np.asarray(lens_k, np.int32)
    f = (lambda x: np.asarray(x, np.float32))
    want, wlse = paged_attention(f(q), f(kc), f(vc), seqlens_k=lens, cu_seqlens_q=cq, return_lse=True, **tab, **kw)
    got, lse = interp("run_interpreted_paged", q if dtype != "bf16" else f(q), kc if dtype != "bf16" else f(kc),
                      vc if dtype != "bf16" else f(vc), seqlens_k=lens, cu_seqlens_q=cq,
                      dtype=dtype if dtype == "bf16" else None, **tab, **kw, **(run or {}))
    assert not np.isnan(got).any(), "an unwritten row"
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) if got.size else 0.0
    assert err <= TOL[dtype], f"max |out - ref| = {err:.3g}"
    assert np.array_equal(np.isneginf(lse), np.isneginf(wlse)), "-inf rows differ"
    live = np.isfinite(wlse)
    assert float(np.abs(lse[live] - wlse[live]).max(initial=0.0)) <= 1e-4
    return got


LENS_Q, LENS_K = [3, 5, 0, 1, 9], [10, 37, 5, 0, 64]


@pytest.mark.parametrize("page", [1, 4, 16, 32])
@pytest.mark.parametrize("form", ["vllm", "sglang"])
@both_guard_sides
def test_both_table_forms_and_page_sizes_smaller_and_larger_than_a_key_block(interp, page, form):
    check_paged(interp, LENS_Q, LENS_K, page=page, form=form, causal="bottom_right")
    check_paged(interp, LENS_Q, LENS_K, page=page, form=form, seed=1)


FEATURES = {
    "no_mask": {},
    "top_left": {"causal": "top_left"},
    "bottom_right": {"causal": "bottom_right"},
    "window_sink": {"window": (5, 2), "sink": 2},
    "window_left": {"window": (7, -1)},
    "softcap": {"softcap": 4.0},
    "alibi": {"alibi_slopes": np.array([0.5, 0.25, 0.1, 0.05], np.float32)},
    "scale": {"scale": 0.2},
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_masks_and_logit_features(interp, name):
    check_paged(interp, LENS_Q, LENS_K, page=4, **FEATURES[name])


@pytest.mark.parametrize("splits", [2, 5, 40])   # 40: the combine reads splits in two chunks, most empty
@pytest.mark.parametrize("pipeline", ["qr_async", "qr_nwarp_sshuffle"])
def test_split_kv_decode_with_the_combine_kernel(interp, splits, pipeline):
    check_paged(interp, [1, 1, 1, 2], [70, 1, 0, 33], page=16, hq=8, hk=2, causal="bottom_right",
                run={"num_splits": splits, "pipeline": pipeline})


@pytest.mark.parametrize("sink", [0, 2])
def test_the_splits_share_the_pages_a_window_leaves_in_reach(interp, sink):
    """Decode rows with a window of 64 keys over 192 (pages of 16): the 4 key blocks in reach are one per split of
    4 (each split's partial LSE finite, the partials adding up to the row's LSE), not 12 blocks split 3 a split,
    which left the first two splits nothing.  The sink block is the first split's."""
    lens_k = [192, 192]
    kc, vc, tab = cache(lens_k, 16, 2, 16, None, seed=5, dtype="fp32", form="vllm")
    q = np.random.default_rng(9).standard_normal((2, 2, 16)).astype(np.float32)
    cq, lens = np.array([0, 1, 2], np.int32), np.asarray(lens_k, np.int32)
    kw = dict(causal="bottom_right", window=(63, 0), sink=sink)
    want, wlse = paged_attention(q, kc, vc, seqlens_k=lens, cu_seqlens_q=cq, return_lse=True, **tab, **kw)
    got, lse, parts = interp("run_interpreted_paged", q, kc, vc, seqlens_k=lens, cu_seqlens_q=cq, num_splits=4,
                             partials=True, **tab, **kw)
    assert np.abs(got - want).max() < 1e-4 and np.abs(lse - wlse).max() < 1e-4
    parts = np.asarray(parts, np.float64).reshape(2, 2, 4)   # [sequence, head, split] (one row each)
    assert np.isfinite(parts).all(), parts.ravel()
    np.testing.assert_allclose(np.log(np.exp(parts).sum(axis=2)), np.asarray(wlse).T, atol=1e-4)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_gqa_and_uneven_head_dims(interp, dtype):
    check_paged(interp, [4, 17], [20, 50], hq=6, hk=3, d=40, dv=24, dtype=dtype, causal="bottom_right")


def test_hnd_cache_through_strides_and_packed_gqa(interp):
    check_paged(interp, LENS_Q, LENS_K, page=16, run={"hnd": True})
    check_paged(interp, [2, 3, 1], [40, 5, 17], hq=8, hk=2, run={"pipeline": "qr_nwarp_sshuffle"}, window=(6, 0))


@both_guard_sides
def test_page_ids_outside_the_cache_are_clamped_not_read_out_of_bounds(interp):
    kc, vc, tab = cache([40, 20], 16, 1, 16)
    bt = tab["block_table"].copy()
    bt[0, 1], bt[1, 0] = 1 << 30, -7                 # corrupt ids: both read the last page (an unsigned clamp)
    q = np.ones((2, 1, 16), np.float32)
    lens = np.array([40, 10 ** 6], np.int32)          # a length past the table: clamped to its pages
    out, _ = interp("run_interpreted_paged", q, kc, vc, seqlens_k=lens, cu_seqlens_q=[0, 1, 2], block_table=bt)
    assert np.isfinite(out).all()
    fixed = bt.copy()
    fixed[0, 1] = kc.shape[0] - 1
    want = paged_attention(q, kc, vc, seqlens_k=[40, 16 * bt.shape[1]], cu_seqlens_q=[0, 1, 2],
                           block_table=np.where(fixed < 0, kc.shape[0] - 1, fixed))   # -7 and the -1 padding
    assert np.abs(out - want).max() < 1e-5


@pytest.mark.parametrize("rope,form", [("none", "vllm"), ("half", "vllm"), ("inter", "sglang"), ("half", "sglang"),
                                       ("inter", "contiguous")])
@pytest.mark.parametrize("page", [1, 16])
def test_append_kv_writes_each_sequences_rows_with_rope(interp, rope, form, page):
    rng = np.random.default_rng(3)
    lens, new = [5, 0, 9, 30], [3, 4, 0, 17]
    hk, hq, d, dv = 2, 4, 32, 16
    if form == "contiguous":
        kc = rng.standard_normal((4, 64, hk, d)).astype(np.float32)
        vc = rng.standard_normal((4, 64, hk, dv)).astype(np.float32)
        tab, ref_tab = {}, {"block_table": np.arange(4, dtype=np.int32)[:, None]}
    else:
        kc, vc, tab = cache(lens, page, hk, d, dv, extra=new, form=form)
        ref_tab = tab
    kn = rng.standard_normal((sum(new), hk, d)).astype(np.float32)
    vn = rng.standard_normal((sum(new), hk, dv)).astype(np.float32)
    q = rng.standard_normal((sum(new), hq, d)).astype(np.float32)
    cn = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    rot = {}
    if rope != "none":
        th = np.arange(80)[:, None] * (10000.0 ** (-np.arange(12) / 12))   # rotary_dim 24 < d: a partial rotation
        rot = {"rotary_cos": np.cos(th).astype(np.float32), "rotary_sin": np.sin(th).astype(np.float32),
               "rotary_interleaved": rope == "inter"}
    wk, wv, wq = append_kv(kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, q=q, **ref_tab, **rot)
    gk, gv, gq = interp("run_interpreted_append", kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, q=q,
                        contiguous=form == "contiguous", **tab, **rot)
    for got, want in ((gk, wk), (gv, wv), (gq, wq)):
        assert np.abs(got - want).max() < 1e-5


@both_guard_sides
def test_append_kv_never_writes_outside_the_table(interp):
    kc, vc, tab = cache([14], 4, 1, 16, extra=[2])      # 4 pages for 16 tokens
    kn = np.ones((6, 1, 16), np.float32)
    gk, _, _ = interp("run_interpreted_append", kc, vc, kn, kn, seqlens_k=[14], cu_seqlens_new=[0, 6],
                      block_table=tab["block_table"][:, :4])
    used = set(tab["block_table"][0, :4].tolist())
    spare = [p for p in range(kc.shape[0]) if p not in used]
    assert np.array_equal(gk[spare], kc[spare])          # rows 16 and 17 had no page: dropped, nothing else touched


@pytest.mark.parametrize("page,form", [(16, "vllm"), (32, "sglang"), (64, "vllm")])
def test_the_tma_pipeline_reads_whole_pages_through_descriptors(interp, page, form):
    check_paged(interp, LENS_Q, LENS_K, page=page, form=form, causal="bottom_right",
                run={"pipeline": "qr_async_trload"})
    check_paged(interp, [1, 1, 1, 2], [70, 1, 0, 33], page=page, form=form, window=(9, 0), sink=3,
                run={"pipeline": "qr_async_trload", "num_splits": 3})


@pytest.mark.parametrize("pipeline,run", [("qr_async", {}), ("qr_async_trload", {}), ("qr_async", {"vectorized": True}),
                                          ("qr_async", {"vectorized": True, "block_n": 32}),
                                          ("qr_nwarp_sshuffle", {"vectorized": True, "num_splits": 2})])
@both_guard_sides
def test_slots_past_a_sequence_may_hold_anything(interp, pipeline, run):
    """The unused rows of a sequence's last page (never written, recycled memory) are NaN here: they must not reach
    the result (the TMA pipeline loads whole blocks and zeroes those V rows; the vectorized layout reads a page's
    run of K vectors and V's 16-byte token groups whole, and zeroes the V rows past the sequence)."""
    rng = np.random.default_rng(4)
    kc = rng.standard_normal((4, 16, 1, 16)).astype(np.float32)
    vc = rng.standard_normal((4, 16, 1, 16)).astype(np.float32)
    bt = np.array([[2, 0], [1, 3]], np.int32)
    lens = np.array([21, 5], np.int32)
    kc[0, 5:], vc[0, 5:], kc[1, 5:], vc[1, 5:] = np.nan, np.nan, np.nan, np.nan   # past 21 = 16 + 5, and past 5
    q = rng.standard_normal((3, 2, 16)).astype(np.float32)
    cq = np.array([0, 2, 3], np.int32)
    want = paged_attention(q, np.nan_to_num(kc), np.nan_to_num(vc), block_table=bt, seqlens_k=lens, cu_seqlens_q=cq)
    got, _ = interp("run_interpreted_paged", q, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                    pipeline=pipeline, **run)
    assert np.isfinite(got).all() and np.abs(got - want).max() < 1e-5
    if run.get("vectorized"):  # the masked loops (window and sink blocks) read the last page's runs too
        masks = {"window": (6, 0), "sink": 2}
        want = paged_attention(q, np.nan_to_num(kc), np.nan_to_num(vc), block_table=bt, seqlens_k=lens,
                               cu_seqlens_q=cq, **masks)
        got, _ = interp("run_interpreted_paged", q, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                        pipeline=pipeline, **run, **masks)
        assert np.isfinite(got).all() and np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("page,form,dtype", [(4, "vllm", "fp32"), (16, "sglang", "fp32"), (32, "vllm", "fp32"),
                                             (8, "sglang", "fp16"), (64, "vllm", "bf16")])
@both_guard_sides
def test_cks_vectorized_layout(interp, page, form, dtype):
    """K [P, Hk, D / x, page, x] and V [P, Hk, page / x, Dv, x] (x: 16 bytes of the dtype): pages smaller and larger
    than a key block, prefill under masks and split-KV decode with packed GQA rows, head dims 40 / 24."""
    vec = {"run": {"vectorized": True}}
    check_paged(interp, LENS_Q, LENS_K, page=page, form=form, dtype=dtype, causal="bottom_right", **vec)
    check_paged(interp, LENS_Q, LENS_K, page=page, form=form, dtype=dtype, dv=16, window=(6, 1), sink=2, **vec)
    check_paged(interp, [1, 2, 1, 1], [70, 9, 0, 33], page=page, form=form, dtype=dtype, softcap=3.0,
                run={"vectorized": True, "num_splits": 3, "pipeline": "qr_nwarp_sshuffle"})
    # head dims that are multiples of the vector but not powers of two: the reads' per-vector head-dim masks
    check_paged(interp, LENS_Q, LENS_K, page=page, form=form, dtype=dtype, d=40, dv=24, causal="top_left", **vec)


@pytest.mark.parametrize("form,page", [("vllm", 16), ("sglang", 4)])
def test_append_kv_into_the_vectorized_layout(interp, form, page):
    rng = np.random.default_rng(5)
    lens, new = [5, 0, 9, 30], [3, 4, 0, 17]
    kc, vc, tab = cache(lens, page, 2, 32, 16, extra=new, form=form)
    kn = rng.standard_normal((sum(new), 2, 32)).astype(np.float32)
    vn = rng.standard_normal((sum(new), 2, 16)).astype(np.float32)
    cn = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    th = np.arange(80)[:, None] * (10000.0 ** (-np.arange(16) / 16))
    rot = {"rotary_cos": np.cos(th).astype(np.float32), "rotary_sin": np.sin(th).astype(np.float32)}
    wk, wv, _ = append_kv(kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, **tab, **rot)
    gk, gv, _ = interp("run_interpreted_append", kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, vectorized=True,
                       **tab, **rot)
    assert gk.ndim == 5 and gk.shape == (kc.shape[0], 2, 32 // 4, page, 4) and gv.shape == (kc.shape[0], 2, page // 4,
                                                                                          16, 4)
    lk, lv = linear_caches(gk, gv)
    assert np.abs(lk - wk).max() < 1e-5 and np.abs(lv - wv).max() < 1e-5
    # the reference on vectorized caches writes the same vectorized result
    rk, rv, _ = append_kv(*vectorized_caches(kc, vc), kn, vn, seqlens_k=lens, cu_seqlens_new=cn, **tab, **rot)
    assert np.abs(rk - gk).max() < 1e-5 and np.abs(rv - gv).max() < 1e-5


FP8_CASES = {
    "prefill_page_4": dict(page=4, causal="bottom_right"),
    "split_kv_packed_gqa": dict(page=16, lens_q=[1, 1, 2], lens_k=[70, 0, 33],
                                run={"num_splits": 3, "pipeline": "qr_nwarp_sshuffle"}),
    "tma_pages": dict(page=16, run={"pipeline": "qr_async_trload"}),
    "vectorized": dict(page=16, run={"vectorized": True}, window=(9, 0)),
    "softcap_negative_descale": dict(page=8, softcap=3.0, descales=(-0.5, 0.75, -1.25)),
}


@pytest.mark.parametrize("name", list(FP8_CASES))
def test_fp8_caches_with_per_tensor_descales(interp, name):
    """CK's fp8bf16 contract: e4m3 q and caches (values on e4m3's grid), per-tensor descales, bf16 output; the
    reference is the attention of the descaled values."""
    from fmha_dsl.fp8 import round_e4m3

    kw = dict(FP8_CASES[name])
    page, run = kw.pop("page"), kw.pop("run", {})
    lens_q, lens_k = kw.pop("lens_q", [3, 5, 0, 9]), kw.pop("lens_k", [10, 37, 5, 64])
    ds = kw.pop("descales", (0.25, 0.5, 2.0))
    kc, vc, tab = cache(lens_k, page, 2, 16, seed=3)
    kc, vc = round_e4m3(kc * 4), round_e4m3(vc * 4)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    q = round_e4m3(np.random.default_rng(4).standard_normal((cq[-1], 4, 16)).astype(np.float32) * 4)
    want, wlse = paged_attention(q, kc, vc, seqlens_k=lens_k, cu_seqlens_q=cq, return_lse=True, descales=ds, **tab,
                                 **kw)
    out, lse = interp("run_interpreted_paged", q, kc, vc, seqlens_k=lens_k, cu_seqlens_q=cq, dtype="fp8bf16",
                      descales=ds, **{"block_m": 16, "block_n": 16, **run}, **tab, **kw)
    assert np.abs(out - want).max() <= TOL["bf16"] * np.abs(want).max()
    live = np.isfinite(wlse)
    assert np.array_equal(live, np.isfinite(lse)) and np.abs(lse[live] - wlse[live]).max() <= 1e-4


def _fp8_append_inputs(seed, new, form):
    """``(lens, k_cache, v_cache, table, k_new, v_new, cu_seqlens_new)``: e4m3 caches of 4 sequences with room for
    ``new`` rows each, and bf16 new rows of spread magnitudes."""
    from fmha_dsl.fp8 import round_e4m3
    from fmha_dsl.kernels.fwd_interpret import bf16_round as round_bf16

    rng = np.random.default_rng(seed)
    lens = [5, 0, 9, 30]
    kc, vc, tab = cache(lens, 16, 2, 32, 16, extra=new, form=form)
    kn = round_bf16(rng.standard_normal((sum(new), 2, 32)).astype(np.float32) * 20)
    vn = round_bf16(rng.standard_normal((sum(new), 2, 16)).astype(np.float32) * 20)
    cn = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    return lens, round_e4m3(kc * 8), round_e4m3(vc * 8), tab, kn, vn, cn


@pytest.mark.parametrize("form,rope,vectorized", [("vllm", "half", False), ("sglang", "none", False),
                                                  ("vllm", "inter", True)])
def test_fp8_appends_quantize_each_row_by_its_descale(interp, form, rope, vectorized):
    """An FP8 cache (e4m3 values) takes bf16 new rows: each stored as e4m3(clamp(x / descale, +-448)), RoPE first, q
    rotated in bf16 -- against the reference, byte for byte on V: values beyond 448 x descale saturate, a tie after
    an inexact division rounds to even (x * (1 / 3) would round it up), e4m3 subnormals, -0 kept.  (NaN: on the GPU,
    tests/test_gpu_paged_fp8.py -- the interpreter's fp32 -> fp8 cast turns NaN into 384.)"""
    from fmha_dsl.fp8 import encode_e4m3
    from fmha_dsl.kernels.fwd_interpret import bf16_round as round_bf16

    rng = np.random.default_rng(5)
    lens, kc, vc, tab, kn, vn, cn = _fp8_append_inputs(5, [3, 4, 0, 17], form)
    vn[0, 0, :7] = [1e4, -1e4, 0.0, -3.0, 3.1875, -1e-5, 0.009]   # saturated, exact, a tie (1.0625 -> 1), -0,
    vn[1, 0, :4] = [0.0035, -0.006, 0.012, 0.045]                 # subnormals (spacing 2^-9)
    q = round_bf16(rng.standard_normal((cn[-1], 4, 32)).astype(np.float32))
    rot = {}
    if rope != "none":
        th = np.arange(80)[:, None] * (10000.0 ** (-np.arange(16) / 16))
        rot = {"rotary_cos": np.cos(th).astype(np.float32), "rotary_sin": np.sin(th).astype(np.float32),
               "rotary_interleaved": rope == "inter"}
    ds = (0.125, 3.0)
    wk, wv, wq = append_kv(kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, q=q, descales=ds, **tab, **rot)
    gk, gv, gq = interp("run_interpreted_append", kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, q=q,
                        dtype="fp8bf16", descales=ds, vectorized=vectorized, **tab, **rot)
    if vectorized:
        gk, gv = linear_caches(gk, gv)
    assert np.array_equal(encode_e4m3(gv), encode_e4m3(wv))   # V: no RoPE, the division and rounding exact
    assert wv.max() == 448.0 and wv.min() == -448.0 and np.signbit(wv[wv == 0]).any()
    assert 1.0 in wv and (np.abs(wv[(wv != 0) & (np.abs(wv) < 2 ** -6)]) % 2 ** -9 == 0).sum() >= 3
    # K after RoPE: the kernel rotates in fp32 where the reference rotates in float64, so a value on a rounding
    # boundary may land one e4m3 step apart (3 mantissa bits: at most 1/8 of it)
    assert np.all(np.abs(gk - wk) <= np.abs(wk) / 8 + 1e-6) and np.mean(gk != wk) < 0.01
    assert np.abs(gq - wq).max() <= 2 ** -7 * np.abs(wq).max()   # q rotated and stored in bf16


def _block_descales(tab, lens_k, page, num_pages, hk, seed):
    """K/V block scales ``[num_pages, Hk]``: a spread of magnitudes (2^-5 .. 2^3, so a key block's pages differ),
    NaN on the pages no sequence reads (a kernel that read one would show it)."""
    rng = np.random.default_rng(seed)
    used = set()
    for b, n in enumerate(lens_k):
        k = -(-n // page)
        if "block_table" in tab:
            used |= set(tab["block_table"][b, :k].tolist())
        else:
            lo = tab["kv_indptr"][b]
            used |= set(tab["kv_indices"][lo:lo + k].tolist())
    out = []
    for _ in range(2):
        d = (2.0 ** rng.integers(-5, 4, (num_pages, hk)) * rng.uniform(0.6, 1.0, (num_pages, hk))).astype(np.float32)
        d[[p for p in range(num_pages) if p not in used]] = np.nan
        out.append(d)
    return out


def _fp8_run_matches(interp, q, kc, vc, lens_k, cq, tab, kw, run, ds, flat, want, wlse):
    """The FP8 kernel (descales ``ds``) against the reference's ``want``/``wlse``; coarser descales ``flat`` give
    another answer, so the comparison can tell the scales apart."""
    other = paged_attention(q, kc, vc, seqlens_k=lens_k, cu_seqlens_q=cq, descales=flat, **tab, **kw)
    assert np.abs(other - want).max() > 0.2 * np.abs(want).max()
    out, lse = interp("run_interpreted_paged", q, kc, vc, seqlens_k=lens_k, cu_seqlens_q=cq, dtype="fp8bf16",
                      descales=ds, **{"block_m": 16, "block_n": 16, **run}, **tab, **kw)
    assert np.isfinite(out).all()
    assert np.abs(out - want).max() <= TOL["bf16"] * np.abs(want).max()
    live = np.isfinite(wlse)
    assert np.array_equal(live, np.isfinite(lse)) and np.abs(lse[live] - wlse[live]).max() <= 1e-4


KV_BLOCK_CASES = {
    "page_4_a_descale_per_key": dict(page=4, causal="bottom_right"),
    "page_16_one_per_block": dict(page=16),
    "tma_pages": dict(page=16, run={"pipeline": "qr_async_trload"}),
    "vectorized": dict(page=16, run={"vectorized": True}, window=(9, 0)),
    "split_kv_packed_gqa_page_8": dict(page=8, lens_q=[1, 1, 2], lens_k=[70, 0, 33], form="sglang",
                                       run={"num_splits": 3, "pipeline": "qr_nwarp_sshuffle"}),
    "zero_and_negative_softcap": dict(page=8, softcap=3.0, zero=True),
    "v_rows_page_4": dict(page=4, causal="bottom_right", run={"block_m": 64}),
    "v_rows_zero_and_negative": dict(page=8, softcap=3.0, zero=True, run={"block_m": 64}),
    "v_rows_split_kv_packed_gqa": dict(page=8, lens_q=[1, 1, 2], lens_k=[70, 0, 33], form="sglang",
                                       run={"num_splits": 3, "pipeline": "qr_nwarp_sshuffle", "block_m": 64}),
}


@pytest.mark.parametrize("name", list(KV_BLOCK_CASES))
def test_fp8_kv_block_scales(interp, name):
    """CK's KV block scales (qscale kv_blockscale): K/V descales [num_pages, Hk], each page's keys and values of a
    head scaled by its own -- a block that spans pages (pages of 4 and 8 under 16-key blocks) reads one per key --,
    against the reference on the scaled values; scales that differ 256-fold between pages, zero and negative ones,
    NaN (descales and values) on pages no sequence reads -- page 0 among them, vLLM's null page, whose descales the
    keys past a sequence's end in a block that spans pages load (and must drop)."""
    from fmha_dsl.fp8 import round_e4m3

    kw = dict(KV_BLOCK_CASES[name])
    page, run, form, zero = kw.pop("page"), kw.pop("run", {}), kw.pop("form", "vllm"), kw.pop("zero", False)
    lens_q, lens_k = kw.pop("lens_q", [3, 5, 0, 9]), kw.pop("lens_k", [10, 37, 5, 64])
    kc, vc, tab = cache(lens_k, page, 2, 16, seed=3, form=form)
    kc, vc = (np.concatenate([np.full_like(x[:1], np.nan), round_e4m3(x * 4)]) for x in (kc, vc))  # a null page 0
    tab = {k: v + 1 if k in ("block_table", "kv_indices") else v for k, v in tab.items()}
    kd, vd = _block_descales(tab, lens_k, page, kc.shape[0], 2, seed=len(name))
    assert np.isnan(kd[0]).all() and np.isnan(vd[0]).all()
    if zero:  # sequence 0's V scales of head 0 all zero (v_ref stays 0 through its blocks), a negative K scale
        n0 = -(-lens_k[0] // page)
        seq0 = tab["kv_indices"][:n0] if "kv_indices" in tab else tab["block_table"][0, :n0]
        kd[seq0[0], 1], vd[seq0, 0] = -kd[seq0[0], 1], 0.0
        vd[np.isfinite(vd) & (vd > 0.5)] *= -1
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    q = round_e4m3(np.random.default_rng(4).standard_normal((cq[-1], 4, 16)).astype(np.float32) * 4)
    ds = (0.25, kd, vd)
    want, wlse = paged_attention(q, kc, vc, seqlens_k=lens_k, cu_seqlens_q=cq, return_lse=True, descales=ds, **tab,
                                 **kw)
    # per-tensor descales of the pages' mean would give another answer: the test can tell the scales apart
    flat = (0.25, float(np.nanmean(kd)), float(np.nanmean(vd)))
    _fp8_run_matches(interp, q, kc, vc, lens_k, cq, tab, kw, run, ds, flat, want, wlse)


@pytest.mark.parametrize("form,vectorized", [("vllm", False), ("sglang", True)])
def test_fp8_appends_quantize_each_row_by_its_pages_block_scale(interp, form, vectorized):
    """KV block scales in an append: each new row divided by the descale of the page (and head) it lands in, byte
    for byte on V against the reference, and a contiguous cache (page = sequence) by its sequence's."""
    from fmha_dsl.fp8 import encode_e4m3

    rng = np.random.default_rng(6)
    lens, kc, vc, tab, kn, vn, cn = _fp8_append_inputs(6, [3, 14, 0, 17], form)
    kd, vd = (2.0 ** rng.integers(-3, 3, (kc.shape[0], 2)).astype(np.float32) * 0.75 for _ in range(2))
    ds = (kd, vd)
    wk, wv, _ = append_kv(kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, descales=ds, **tab)
    assert not np.array_equal(wv, append_kv(kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn,
                                            descales=(0.75, 0.75), **tab)[1])
    gk, gv, _ = interp("run_interpreted_append", kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn,
                       dtype="fp8bf16", descales=ds, vectorized=vectorized, **tab)
    if vectorized:
        gk, gv = linear_caches(gk, gv)
    assert np.array_equal(encode_e4m3(gv), encode_e4m3(wv)) and np.array_equal(encode_e4m3(gk), encode_e4m3(wk))
    # a contiguous cache [B, capacity, Hk, D]: its "pages" are the sequences
    cc = np.zeros((4, 48, 2, 32), np.float32), np.zeros((4, 48, 2, 16), np.float32)
    sd = (kd[:4], vd[:4])
    wk, wv, _ = append_kv(*cc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, descales=sd,
                          block_table=np.arange(4, dtype=np.int32)[:, None])
    gk, gv, _ = interp("run_interpreted_append", *cc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, dtype="fp8bf16",
                       descales=sd, contiguous=True)
    assert np.array_equal(encode_e4m3(gv), encode_e4m3(wv)) and np.array_equal(encode_e4m3(gk), encode_e4m3(wk))


def _token_descales(tab, lens_k, page, num_pages, hk, seed):
    """Per-token-head K/V descales ``[num_pages, page_size, Hk]``: magnitudes spread 2^-5 .. 2^3 token by token,
    NaN on every slot no sequence reads (unused pages, and the slots past a sequence's end in its last page)."""
    rng = np.random.default_rng(seed)
    read = np.zeros((num_pages, page), bool)
    for b, n in enumerate(lens_k):
        pages = tab["block_table"][b] if "block_table" in tab else \
            tab["kv_indices"][tab["kv_indptr"][b]:tab["kv_indptr"][b + 1]]
        for j in range(n):
            read[pages[j // page], j % page] = True
    out = []
    for _ in range(2):
        d = (2.0 ** rng.integers(-5, 4, (num_pages, page, hk)) * rng.uniform(0.6, 1.0, (num_pages, page, hk)))
        d = d.astype(np.float32)
        d[~read] = np.nan
        out.append(d)
    return out


TOKEN_CASES = {
    "page_4_spans": dict(page=4, causal="bottom_right"),
    "page_16_slots_in_a_block": dict(page=16),
    "page_32_half_a_page_per_block": dict(page=32, window=(20, 0)),
    "tma_pages": dict(page=16, run={"pipeline": "qr_async_trload"}),
    "vectorized": dict(page=16, run={"vectorized": True}),
    "split_kv_packed_gqa": dict(page=8, lens_q=[1, 1, 2], lens_k=[70, 0, 33], form="sglang",
                                run={"num_splits": 3, "pipeline": "qr_nwarp_sshuffle"}),
    "q_per_tensor_negative_softcap": dict(page=8, softcap=3.0, q_scalar=True),
    "v_rows_page_4_spans": dict(page=4, causal="bottom_right", run={"block_m": 64}),
    "v_rows_page_32_window": dict(page=32, window=(20, 0), run={"block_m": 64}),
    "v_rows_tma_pages": dict(page=16, run={"pipeline": "qr_async_trload", "block_m": 64}),
    "v_rows_split_kv_packed_gqa": dict(page=8, lens_q=[1, 1, 2], lens_k=[70, 0, 33], form="sglang",
                                       run={"num_splits": 3, "pipeline": "qr_nwarp_sshuffle", "block_m": 64}),
    "v_rows_packed_gqa_negative": dict(page=4, causal="bottom_right", negative=True,
                                       run={"pipeline": "qr_nwarp_sshuffle", "block_m": 64}),
    "negative_k_and_v_descales": dict(page=8, negative=True),
}


@pytest.mark.parametrize("name", list(TOKEN_CASES))
@both_guard_sides
def test_fp8_per_token_head_scales(interp, name):
    """CK's per_token_head scales: K/V descales [num_pages, page_size, Hk], each cached token's key and value of a
    head scaled by its own (NaN in every slot no sequence reads: a kernel that read one would show it; some negative
    in the ``negative`` cases), q's one per query token and head (some negative) or one number; the kernel against
    the reference, and the reference against the same attention over values dequantized by hand.  ``v_rows_*``:
    64-row tiles, whose V descales multiply V's rows (``V_ROWS``), with packed GQA and split-KV too."""
    from fmha_dsl.fp8 import round_e4m3

    kw = dict(TOKEN_CASES[name])
    page, run, form = kw.pop("page"), kw.pop("run", {}), kw.pop("form", "vllm")
    q_scalar, negative = kw.pop("q_scalar", False), kw.pop("negative", False)
    lens_q, lens_k = kw.pop("lens_q", [3, 5, 0, 9]), kw.pop("lens_k", [10, 37, 5, 64])
    kc, vc, tab = cache(lens_k, page, 2, 16, seed=5, form=form)
    kc, vc = (np.concatenate([np.full_like(x[:1], np.nan), round_e4m3(x * 4)]) for x in (kc, vc))  # a null page 0
    tab = {k: v + 1 if k in ("block_table", "kv_indices") else v for k, v in tab.items()}
    kd, vd = _token_descales(tab, lens_k, page, kc.shape[0], 2, seed=len(name))
    if negative:  # some tokens' K and V descales negative (their sign belongs to the value, as q's does)
        sign = np.random.default_rng(8).choice([-1.0, 1.0], kd.shape).astype(np.float32)
        kd, vd = kd * sign, vd * sign[::-1, ::-1]
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    rng = np.random.default_rng(7)
    q = round_e4m3(rng.standard_normal((cq[-1], 4, 16)).astype(np.float32) * 4)
    qd = -0.3 if q_scalar else (rng.uniform(0.05, 0.5, (cq[-1], 4)) * rng.choice([-1, 1], (cq[-1], 4))).astype(
        np.float32)
    ds = (qd, kd, vd)
    want, wlse = paged_attention(q, kc, vc, seqlens_k=lens_k, cu_seqlens_q=cq, return_lse=True, descales=ds, **tab,
                                 **kw)
    # the reference against values dequantized by hand (unread slots zeroed: NaN times anything stays NaN)
    hand = [np.nan_to_num(x * d[..., None].astype(np.float64)) for x, d in ((kc, kd), (vc, vd))]
    hq = q.astype(np.float64) * (qd if q_scalar else qd[:, :, None])
    again = paged_attention(hq, *hand, seqlens_k=lens_k, cu_seqlens_q=cq, **tab, **kw)
    assert np.allclose(again, want, rtol=1e-6, atol=1e-6)
    # one descale per page (each page's mean over its read slots) gives another answer: the test tells them apart
    flat = (qd, *(np.nansum(d, axis=1) / np.maximum(np.isfinite(d).sum(axis=1), 1) for d in (kd, vd)))
    if not q_scalar:
        flat = (float(np.abs(qd).mean()),) + flat[1:]
    _fp8_run_matches(interp, q, kc, vc, lens_k, cq, tab, kw, run, ds, flat, want, wlse)


@pytest.mark.parametrize("side", ["end", "start"])
def test_the_harness_inputs_sit_next_to_an_unreadable_page(side):
    """The interpreter harness's read-only inputs (``guarded``) hold the same values and fault on a read one element
    past their end -- or, within ``guard_side("start")``, one element before their start -- which makes a kernel's
    out-of-bounds read fail here instead of reading a neighbour's memory; strided views come back as they are (their
    strides are the kernel's); a side that is neither is refused."""
    import subprocess
    import sys

    from fmha_dsl.kernels.fwd_interpret import guard_side, guarded

    a = np.arange(10, dtype=np.float32)
    with guard_side(side):
        g = guarded(a)
        strided = np.arange(20, dtype=np.float32)[::2]
        assert guarded(strided) is strided
    assert np.array_equal(g, a) and g.flags.c_contiguous
    with pytest.raises(ValueError, match="guard side: one of end, start, got 'middle'"):
        with guard_side("middle"):
            pass
    inside, outside = (36, 40) if side == "end" else (0, -4)
    script = ("import ctypes, numpy as np\nfrom fmha_dsl.kernels.fwd_interpret import guard_side, guarded\n"
              f"with guard_side({side!r}):\n    g = guarded(np.arange(10, dtype=np.float32))\n"
              f"print(ctypes.c_float.from_address(g.ctypes.data + {inside}).value, flush=True)\n"
              f"print(ctypes.c_float.from_address(g.ctypes.data + {outside}).value, flush=True)\n")
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    want = "9.0" if side == "end" else "0.0"
    assert got.stdout.split() == [want] and got.returncode != 0, (got.returncode, got.stdout, got.stderr[-500:])
