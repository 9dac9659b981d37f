"""The Triton backward template (fmha_dsl/kernels/triton_bwd.py) against the NumPy backward reference, on the CPU.

The three stages run under TRITON_INTERPRET=1 in one spawned worker process, exactly as the runtime launches them
(the ABI's packer, grids and workspace).  Tiny shapes with 16x16 tiles, so that every query-block range the masks
produce (windows, sinks, bottom-right corners, partial blocks) is exercised.  The reference runs in float64 on the
same (rounded) inputs; the forward's out and LSE come from the reference too."""


import numpy as np
import pytest

pytest.importorskip("triton")

from interpreted import both_guard_sides, harness_runner  # noqa: E402

from fmha_dsl.reference import attention_fwd  # noqa: E402
from fmha_dsl.reference_bwd import attention_bwd  # noqa: E402

TOL = {"fp32": 2e-4, "fp16": 2e-2, "bf16": 1.5e-1}
NP = {"fp32": np.float32, "fp16": np.float16, "bf16": np.float32}


@pytest.fixture
def interp(interp_worker, request):
    from fmha_dsl.kernels import bwd_interpret

    return harness_runner(interp_worker, request, bwd_interpret.run_interpreted_bwd)


def _round(dtype, x):
    from fmha_dsl.kernels.fwd_interpret import bf16_round

    return bf16_round(x) if dtype == "bf16" else x.astype(NP[dtype])


def make(dtype, B=1, Hq=2, Hk=None, Sq=40, Sk=50, Dq=32, Dv=None, seed=0, group=None):
    rng = np.random.default_rng(seed)
    Hk = Hk or Hq
    Dv = Dv or Dq
    if group:
        tq, tk = sum(group[0]), sum(group[1])
        shapes = ((tq, Hq, Dq), (tk, Hk, Dq), (tk, Hk, Dv), (tq, Hq, Dv))
    else:
        shapes = ((B, Hq, Sq, Dq), (B, Hk, Sk, Dq), (B, Hk, Sk, Dv), (B, Hq, Sq, Dv))
    return [_round(dtype, rng.standard_normal(s).astype(np.float32)) for s in shapes]


def check(interp, dtype, q, k, v, do, *, tol=None, **kw):
    run_kw = {key: kw.pop(key) for key in ("block_m", "block_n", "deterministic", "pad", "mask_kernel", "pipeline")
              if key in kw}
    f64 = [np.asarray(x, np.float64) for x in (q, k, v, do)]
    out, lse = attention_fwd(*f64[:3], accum=np.float64, **kw)
    out = _round(dtype, out.astype(np.float32))
    want = attention_bwd(*f64[:3], np.asarray(out, np.float64), lse, f64[3], accum=np.float64, **kw)
    got = interp(q, k, v, out, lse, do, dtype=dtype, **kw, **run_kw)
    tol = TOL[dtype] if tol is None else tol
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        g = np.asarray(g, np.float64)
        assert np.isfinite(g).all(), f"{name}: not finite"
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, atol=tol * scale, rtol=tol, err_msg=name)
    if kw.get("bias") is not None:
        g = np.asarray(got[3], np.float64)
        b = kw["bias"]
        g = g.sum(axis=tuple(i for i in range(2) if b.shape[i] == 1), keepdims=True)  # broadcast dims
        np.testing.assert_allclose(g, want[3], atol=tol * max(1.0, float(np.abs(want[3]).max())), rtol=tol,
                                   err_msg="dbias")
    return got


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_plain_backward_matches_the_reference(interp, dtype):
    check(interp, dtype, *make(dtype))


MASKS = {
    "causal_top_left": {"causal": "top_left"},
    "causal_bottom_right_short_q": {"causal": "bottom_right", "Sq": 20},
    "causal_bottom_right_long_q": {"causal": "bottom_right", "Sq": 60, "Sk": 35},
    "window": {"window": (7, 3)},
    "window_left_only_top_left": {"window": (9, -1), "causal": "top_left"},
    "window_sink": {"window": (5, 0), "sink": 4},
    "causal_sink_wide": {"causal": True, "sink": 20},
    # window sides as wide as int32 allows: unbounded, with no overflow in the offsets from the diagonal
    "window_wider_than_int32_room": {"window": (2**31 - 2, 2**31 - 2), "causal": "bottom_right", "Sq": 20},
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_masks_windows_and_sinks_match_the_reference(interp, name):
    kw = dict(MASKS[name])
    shape = {k: kw.pop(k) for k in ("Sq", "Sk") if k in kw}
    check(interp, "fp32", *make("fp32", **shape), **kw)


def test_fully_masked_rows_give_zero_gradients(interp):
    q, k, v, do = make("fp32", Sq=40, Sk=20)
    # top-left causal + window (0, 0): rows 20.. see no key
    got = check(interp, "fp32", q, k, v, do, causal="top_left", window=(0, 0))
    assert not np.asarray(got[0])[:, :, 20:].any()


FEATURES = {
    "softcap": {"softcap": 1.5},
    "dropout": {"dropout_p": 0.3, "seed": 12345, "offset": 77},
    "dropout_causal_gqa": {"dropout_p": 0.2, "seed": 3, "causal": True, "Hq": 4, "Hk": 2},
    "alibi": {"alibi": True, "causal": "bottom_right"},
    "gqa": {"Hq": 4, "Hk": 2},
    "mqa": {"Hq": 3, "Hk": 1},
    "hdim_80_96": {"Dq": 80, "Dv": 96, "Sq": 33, "Sk": 17},
    "hdim_24_40": {"Dq": 24, "Dv": 40},
    "scale": {"scale": -0.3},
    "batch2_everything": {"B": 2, "causal": "bottom_right", "sink": 3, "softcap": 2.0, "dropout_p": 0.25,
                          "Hq": 4, "Hk": 2, "Sq": 33, "Sk": 47},
}


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_features_match_the_reference(interp, name):
    kw = dict(FEATURES[name])
    shape = {k: kw.pop(k) for k in ("B", "Hq", "Hk", "Sq", "Sk", "Dq", "Dv") if k in kw}
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = np.linspace(0.2, 0.9, shape.get("Hq", 2)).astype(np.float32)
    check(interp, "fp32", *make("fp32", **shape), **kw)


@pytest.mark.parametrize("bshape", [(1, 1), (1, 2), (2, 2)])
def test_bias_gradient_matches_the_reference(interp, bshape):
    q, k, v, do = make("fp32", B=2, Sq=24, Sk=40)
    bias = np.random.default_rng(1).standard_normal(bshape + (24, 40)).astype(np.float32)
    check(interp, "fp32", q, k, v, do, bias=bias, causal=True)


@both_guard_sides
def test_group_mode_with_empty_sequences_matches_the_reference(interp):
    lens_q, lens_k = [5, 0, 37, 16, 9], [21, 7, 50, 0, 9]
    q, k, v, do = make("fp32", Hq=4, Hk=2, group=(lens_q, lens_k))
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    got = check(interp, "fp32", q, k, v, do, cu_seqlens_q=cq, cu_seqlens_k=ck, causal="bottom_right",
                dropout_p=0.2, seed=9)
    assert not np.asarray(got[0])[cq[3]:cq[4]].any()    # the sequence without keys: zero dQ


def test_group_mode_bias_gradient(interp):
    lens_q, lens_k = [5, 19], [21, 7]
    q, k, v, do = make("fp32", group=(lens_q, lens_k))
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    bias = np.random.default_rng(2).standard_normal((2, 2, 19, 21)).astype(np.float32)
    check(interp, "fp32", q, k, v, do, cu_seqlens_q=cq, cu_seqlens_k=ck, bias=bias)


@pytest.mark.parametrize("pipeline", ["bwd_async", "bwd_trload"])
@both_guard_sides
def test_group_mode_without_a_mask_checks_only_the_partial_blocks(interp, pipeline):
    # whole query blocks run unchecked, the partial ones (and every block of a partial key block) checked: lengths
    # that are multiples of the tile, partial ones, and empty sequences on either side
    lens_q, lens_k = [40, 0, 33, 64, 16], [50, 17, 0, 64, 31]
    q, k, v, do = make("fp16", Hq=4, Hk=2, group=(lens_q, lens_k))
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    got = check(interp, "fp16", q, k, v, do, cu_seqlens_q=cq, cu_seqlens_k=ck, pipeline=pipeline, block_m=16,
                block_n=32)
    assert not np.asarray(got[0], np.float64)[cq[2]:cq[3]].any()  # the sequence without keys: zero dQ


@pytest.mark.parametrize("tile", [(16, 32), (32, 16)])
def test_other_tiles_and_unpadded_lengths(interp, tile):
    q, k, v, do = make("fp16", Sq=64, Sk=64)
    check(interp, "fp16", q, k, v, do, block_m=tile[0], block_n=tile[1], pad=(0, 0, 0, 0), causal=True)


def test_deterministic_matches_the_reference_and_is_bit_identical_run_to_run(interp):
    q, k, v, do = make("fp32", Hq=4, Hk=1, Sq=50, Sk=70)
    a = check(interp, "fp32", q, k, v, do, deterministic=True, causal="bottom_right", window=(20, 0))
    b = check(interp, "fp32", q, k, v, do, deterministic=True, causal="bottom_right", window=(20, 0))
    for x, y in zip(a[:3], b[:3]):
        assert np.array_equal(x, y)


DETERMINISTIC = {
    "window_sink_gqa": {"window": (9, 2), "sink": 5, "Hq": 4, "Hk": 2},
    "dropout_softcap_alibi": {"dropout_p": 0.25, "seed": 77, "softcap": 3.0, "alibi": True, "causal": True},
    "bottom_right_long_q": {"causal": "bottom_right", "Sq": 61, "Sk": 29},
    "no_mask_odd_dims": {"Dq": 24, "Dv": 40, "Sq": 33, "Sk": 47},
    "window_wider_than_int32_room": {"window": (2**31 - 2, 5), "Sq": 45},
}


@pytest.mark.parametrize("name", sorted(DETERMINISTIC))
def test_deterministic_features_match_the_reference(interp, name):
    kw = dict(DETERMINISTIC[name])
    shape = {k: kw.pop(k) for k in ("Hq", "Hk", "Sq", "Sk", "Dq", "Dv") if k in kw}
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = np.linspace(0.2, 0.9, shape.get("Hq", 2)).astype(np.float32)
    check(interp, "fp32", *make("fp32", **shape), deterministic=True, **kw)


@both_guard_sides
def test_deterministic_group_mode_with_bias(interp):
    lens_q, lens_k = [5, 0, 30], [21, 7, 0]
    q, k, v, do = make("fp32", group=(lens_q, lens_k))
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    bias = np.random.default_rng(3).standard_normal((3, 1, 30, 21)).astype(np.float32)
    check(interp, "fp32", q, k, v, do, cu_seqlens_q=cq, cu_seqlens_k=ck, bias=bias, causal=True, deterministic=True)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_deterministic_dq_is_stored_in_the_input_dtype(interp, dtype):
    # the deterministic dQ programs store dQ itself (no fp32 accumulator, no convert stage): every row written,
    # including a group-mode sequence with no keys (dQ = 0) and a partial last block
    lens_q, lens_k = [17, 9, 70], [33, 0, 64]
    q, k, v, do = make(dtype, group=(lens_q, lens_k), Hq=4, Hk=2)
    cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    got = check(interp, dtype, q, k, v, do, cu_seqlens_q=cq, cu_seqlens_k=ck, causal="bottom_right",
                deterministic=True)
    assert not np.asarray(got[0], np.float64)[17:26].any()  # the sequence without keys


@pytest.mark.parametrize("kw", [{}, {"causal": "bottom_right", "Sq": 45, "Sk": 64},
                                {"Hq": 4, "Hk": 2, "window": (9, 3)},
                                # the deterministic dQ programs read K and V through descriptors too: a partial last
                                # key block (zero-filled past the sequence) and a GQA group
                                {"deterministic": True, "causal": "bottom_right", "Sq": 45, "Sk": 50},
                                {"deterministic": True, "Hq": 4, "Hk": 2, "Sk": 40, "window": (9, 3)}],
                         ids=["plain", "causal", "gqa-window", "det-causal-partial", "det-gqa-window"])
@both_guard_sides
def test_tma_pipeline_matches_the_reference(interp, kw):
    kw = dict(kw)
    shape = {k: kw.pop(k) for k in ("Hq", "Hk", "Sq", "Sk") if k in kw}
    check(interp, "fp16", *make("fp16", **shape), pipeline="bwd_trload", **kw)
