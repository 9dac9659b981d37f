"""The Triton forward template (fmha_dsl/kernels/triton_fwd.py) against the NumPy reference, on the CPU.

The kernel runs under TRITON_INTERPRET=1 in one spawned worker process (the flag must be set before
triton is imported, and this process keeps a compiling triton for the ahead-of-time checks).  Shapes are
tiny and blocks 16x16 so that every loop range (sink / masked / unmasked / tail) is exercised.  The
reference runs in float64 on the same (rounded) inputs.
"""

import math
import re
import time

import numpy as np
import pytest

pytest.importorskip("triton")

from interpreted import both_guard_sides, harness_runner  # noqa: E402

from fmha_dsl.reference import attention_fwd  # noqa: E402

TOL = {"fp32": 2e-5, "fp16": 2.5e-3, "bf16": 2e-2}
NP = {"fp32": np.float32, "fp16": np.float16, "bf16": np.float32}


@pytest.fixture
def interp(interp_worker, request):
    """``run(q, k, v, **kw) -> (out, lse)`` executed by the interpreter in a worker process."""
    from fmha_dsl.kernels import fwd_interpret

    return harness_runner(interp_worker, request, fwd_interpret.run_interpreted)


def _bf16(x):
    from fmha_dsl.kernels.fwd_interpret import bf16_round

    return bf16_round(x)


def make(dtype, B=1, Hq=2, Hk=None, Sq=40, Sk=50, Dq=32, Dv=None, seed=0, group=None):
    """Random q, k, v already rounded to ``dtype`` (group: ``group = (lens_q, lens_k)``)."""
    rng = np.random.default_rng(seed)
    Hk = Hk or Hq
    Dv = Dv or Dq
    if group:
        tq, tk = sum(group[0]), sum(group[1])
        shapes = ((tq, Hq, Dq), (tk, Hk, Dq), (tk, Hk, Dv))
    else:
        shapes = ((B, Hq, Sq, Dq), (B, Hk, Sk, Dq), (B, Hk, Sk, Dv))
    out = []
    for s in shapes:
        x = rng.standard_normal(s).astype(np.float32)
        out.append(_bf16(x) if dtype == "bf16" else x.astype(NP[dtype]))
    return out


def check(interp, dtype, q, k, v, *, lse=True, tol=None, **kw):
    """Run kernel and reference; assert out/lse agree and that fully masked rows are 0 / -inf."""
    run_kw = {key: kw.pop(key) for key in ("block_m", "block_n", "vlayout", "hdim_q", "hdim_v", "pad",
                                           "mask_kernel", "num_splits", "pipeline") if key in kw}
    out, l = interp(q, k, v, dtype=dtype, lse=lse, **kw, **run_kw)
    f64 = [np.asarray(x, np.float64) for x in (q, k, v)]
    ref_kw = dict(kw)
    if ref_kw.get("bias") is not None:
        ref_kw["bias"] = np.asarray(ref_kw["bias"], np.float64)
    ro, rl = attention_fwd(*f64, accum=np.float64, **ref_kw)
    out = np.asarray(out, np.float64)
    assert not np.isnan(out).any(), "NaN (or an unwritten row) in out"
    err = float(np.abs(out - ro).max()) if out.size else 0.0
    assert err <= (tol or TOL[dtype]), f"max |out - ref| = {err:.3g}"
    if lse:
        assert not np.isnan(l).any(), "NaN (or an unwritten row) in lse"
        assert np.array_equal(np.isneginf(l), np.isneginf(rl)), "-inf rows differ"
        fin = np.isfinite(rl)
        lerr = float(np.abs(l[fin] - rl[fin]).max()) if fin.any() else 0.0
        assert lerr <= 1e-4, f"max |lse - ref| = {lerr:.3g}"
    return out, l, ro, rl


# ---------------------------------------------------------------------------------------------
# features, fp32 and fp16
# ---------------------------------------------------------------------------------------------

FEATURES = {
    "plain": {},
    "even_blocks": dict(shape=dict(Sq=32, Sk=48)),  # no bounds checks at all (pad 0)
    "causal_top_left": dict(causal=True),
    "causal_bottom_right": dict(causal="bottom_right"),
    "causal_br_sq_gt_sk": dict(causal="bottom_right", shape=dict(Sq=50, Sk=20)),  # first 30 rows fully masked
    "window": dict(window=(7, 3), shape=dict(Sq=70, Sk=64)),
    "window_top_left": dict(causal=True, window=(20, 5), shape=dict(Sq=64, Sk=80)),  # right clipped to 0
    "window_left_only": dict(window=(9, -1), shape=dict(Sq=48, Sk=48)),
    "window_right_only": dict(window=(-1, 2), shape=dict(Sq=30, Sk=64)),
    "window_sink": dict(window=(5, 0), sink=3, shape=dict(Sq=64, Sk=64)),
    "causal_sink_wide": dict(causal=True, sink=20, shape=dict(Sq=40, Sk=40)),  # sink spans two key blocks
    "mask_kernel_unbounded": dict(mask_kernel=True),  # mask kernel, window (-1, -1): same as no mask
    "window_huge_sink_huge": dict(window=(2**31 - 1, 2**31 - 2), sink=2**31 - 1),  # no int32 overflow
    "bias": dict(bias="full"),
    "bias_broadcast": dict(bias="bcast"),
    "alibi_heads": dict(alibi="h"),
    "alibi_batch": dict(alibi="bh", shape=dict(B=2), causal="bottom_right"),
    "softcap": dict(softcap=3.0),
    "dropout": dict(dropout_p=0.3, seed=1234, offset=77),
    "gqa": dict(shape=dict(Hq=4, Hk=2)),
    "mqa_causal": dict(shape=dict(Hq=3, Hk=1), causal=True),
    "hdim_80_96": dict(shape=dict(Dq=80, Dv=96, Sq=20, Sk=24)),  # padded to 128, hq != hv
    "hdim_pad_runtime": dict(shape=dict(Dq=40, Dv=24, Sq=20, Sk=24), hdim_q=64, hdim_v=32),  # PAD_D kernel
    "vlayout_c": dict(vlayout="c"),
    "no_lse": dict(lse=False),
    # the kernel carries a negative scale by negating q (its unmasked steps take the row max before scaling)
    "negative_scale": dict(scale=-0.3, shape=dict(Sq=32, Sk=48)),
    "negative_scale_masked_softcap_bias": dict(scale=-0.4, causal=True, softcap=2.0, bias="full"),
    "zero_scale": dict(scale=0.0, shape=dict(Sq=32, Sk=48)),  # uniform weights
}


def _setup(dtype, spec, seed=0):
    spec = dict(spec)
    shape = spec.pop("shape", {})
    q, k, v = make(dtype, seed=seed, **shape)
    B, Hq, Sq = q.shape[:3]
    Sk = k.shape[2]
    rng = np.random.default_rng(seed + 1)
    b = spec.pop("bias", None)
    if b is not None:
        bs = (B, Hq, Sq, Sk) if b == "full" else (1, Hq, Sq, Sk)
        x = rng.standard_normal(bs).astype(np.float32)
        spec["bias"] = _bf16(x) if dtype == "bf16" else x.astype(NP[dtype])
    a = spec.pop("alibi", None)
    if a is not None:
        spec["alibi_slopes"] = (rng.uniform(0.05, 0.5, (Hq,)) if a == "h" else
                                rng.uniform(0.05, 0.5, (B, Hq))).astype(np.float32)
    return q, k, v, spec


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("name", list(FEATURES))
def test_feature(interp, dtype, name):
    q, k, v, kw = _setup(dtype, FEATURES[name])
    check(interp, dtype, q, k, v, **kw)


def test_bf16(interp):
    q, k, v, kw = _setup("bf16", dict(causal="bottom_right", softcap=5.0, shape=dict(Hq=4, Hk=2, Sq=40, Sk=56)))
    check(interp, "bf16", q, k, v, **kw)


def test_fully_masked_rows_give_zero_and_neg_inf(interp):
    """Rows with no allowed column: causal bottom-right with Sq > Sk, and a bias row of -inf."""
    q, k, v = make("fp32", Sq=40, Sk=16)
    bias = np.zeros((1, 2, 40, 16), np.float32)
    bias[0, 1, 35, :] = -np.inf
    out, l, _, _ = check(interp, "fp32", q, k, v, causal="bottom_right", bias=bias)
    assert (out[:, :, :24] == 0).all() and np.isneginf(l[:, :, :24]).all()
    assert (out[0, 1, 35] == 0).all() and np.isneginf(l[0, 1, 35])
    assert np.isfinite(l[:, 0, 24:]).all()


@pytest.mark.parametrize("scale", [-1.0, 1.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sk", [64, 70])  # whole key blocks, or a tail block (the padded kernel)
def test_large_logits_either_sign_of_scale(interp, scale, causal, sk):
    """Scores of a few hundred: the row max subtracted before exp2 must be the true maximum of scale * q.k (for a
    negative scale, scale * min q.k), or exp2 overflows.  The unmasked blocks take the max of the raw scores
    before scaling (one FMA per score), which only holds for scale >= 0: a negative scale must not run them."""
    q, k, v = make("fp32", Sq=48, Sk=sk)
    q, k = q * 4, k * 4  # q.k has a standard deviation of about 90
    out, l, _, _ = check(interp, "fp32", q, k, v, scale=scale, causal=causal, tol=1e-4)
    assert np.isfinite(out).all() and np.isfinite(l).all()


@both_guard_sides
def test_seqlen_zero_batch(interp):
    q, k, v = make("fp16", Sq=0, Sk=20)
    out, l = interp(q, k, v)
    assert out.shape == (1, 2, 0, 32) and l.shape == (1, 2, 0)
    q, k, v = make("fp16", Sq=17, Sk=0)
    out, l, _, _ = check(interp, "fp16", q, k, v, causal=True)
    assert (out == 0).all() and np.isneginf(l).all()


# ---------------------------------------------------------------------------------------------
# group mode
# ---------------------------------------------------------------------------------------------

GROUP = ([5, 0, 33, 12], [7, 20, 40, 0])  # an empty query sequence and an empty key sequence


@pytest.mark.parametrize("dtype,spec", [
    ("fp32", dict()),
    ("fp16", dict(causal="bottom_right", dropout_p=0.25, seed=99)),
    ("fp32", dict(window=(6, 2), sink=2, alibi=True, softcap=4.0)),
    ("fp16", dict(causal=True, bias=True, vlayout="c", Hk=1)),
])
@both_guard_sides
def test_group_mode(interp, dtype, spec):
    spec = dict(spec)
    Hk = spec.pop("Hk", 2)
    q, k, v = make(dtype, Hq=2, Hk=Hk, Dq=24, Dv=40, group=GROUP)
    cq = np.concatenate([[0], np.cumsum(GROUP[0])]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(GROUP[1])]).astype(np.int32)
    rng = np.random.default_rng(5)
    if spec.pop("alibi", False):
        spec["alibi_slopes"] = rng.uniform(0.05, 0.5, (4, 2)).astype(np.float32)
    if spec.pop("bias", False):
        spec["bias"] = rng.standard_normal((4, 1, max(GROUP[0]), max(GROUP[1]))).astype(NP[dtype])
    out, l, _, _ = check(interp, dtype, q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **spec)
    # the 12 query rows of the last sequence see no key: 0 and -inf
    assert (out[38:50] == 0).all() and np.isneginf(l[:, 38:50]).all()


# ---------------------------------------------------------------------------------------------
# dropout: the keep mask is bit-exact with the reference (tl.rand)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,seed,offset", [("fp32", 2**64 - 3, 2**32 - 700), ("fp16", 41, 0)])
def test_dropout_keep_mask_bit_exact(interp, dtype, seed, offset):
    """V = identity makes out[i, j] the dropped probability p[i, j]: zeros must coincide exactly.

    The first case uses a seed with both words set and an offset whose counter crosses 2**32 (the
    high counter word)."""
    Sq, Sk = 24, 32
    q, k, _ = make(dtype, B=2, Sq=Sq, Sk=Sk, Dq=16)
    v = np.broadcast_to(np.eye(Sk, dtype=NP[dtype]), (2, 2, Sk, Sk)).copy()
    out, _, ro, _ = check(interp, dtype, q, k, v, dropout_p=0.4, seed=seed, offset=offset, causal="bottom_right",
                          sink=2)
    zero, rzero = out == 0, ro == 0
    assert np.array_equal(zero, rzero)
    kept = (~rzero).sum() / ro.size
    assert 0.2 < kept < 0.8


# ---------------------------------------------------------------------------------------------
# strides, tiles, random configurations
# ---------------------------------------------------------------------------------------------


def test_bshd_strided_views(interp):
    """q/k/v/bias passed as BSHD memory viewed as [B, H, S, D] (non-contiguous head/sequence strides)."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 30, 4, 32)).astype(np.float16).transpose(0, 2, 1, 3)
    k = rng.standard_normal((2, 36, 2, 32)).astype(np.float16).transpose(0, 2, 1, 3)
    v = rng.standard_normal((2, 36, 2, 32)).astype(np.float16).transpose(0, 2, 1, 3)
    check(interp, "fp16", q, k, v, causal=True)


@pytest.mark.parametrize("bm,bn", [(32, 16), (16, 64), (64, 32)])
def test_tiles(interp, bm, bn):
    q, k, v = make("fp32", Sq=70, Sk=90, Dq=16)
    check(interp, "fp32", q, k, v, window=(10, 4), sink=5, block_m=bm, block_n=bn)


def test_forced_padding_flags(interp):
    """pad = 1 everywhere on shapes that would not need it."""
    q, k, v = make("fp16", Sq=32, Sk=32, Dq=64)
    check(interp, "fp16", q, k, v, causal=True, pad=(1, 1, 1, 1), hdim_q=64, hdim_v=64)


@both_guard_sides
def test_random_configurations(interp):
    """Random mixes of every flag on odd sizes (deterministic)."""
    rng = np.random.default_rng(2024)
    for case in range(10):
        dtype = ["fp32", "fp16"][case % 2]
        Hk = int(rng.choice([1, 2]))
        shape = dict(B=int(rng.integers(1, 3)), Hq=Hk * int(rng.integers(1, 3)), Hk=Hk, Sq=int(rng.integers(1, 60)),
                     Sk=int(rng.integers(1, 60)), Dq=int(rng.choice([8, 16, 24, 48])), Dv=int(rng.choice([8, 16, 40])))
        q, k, v = make(dtype, seed=case, **shape)
        kw = {}
        r = rng.random(6)
        if r[0] < 0.5:
            kw["causal"] = [True, "bottom_right", None][int(rng.integers(0, 3))]
            kw["window"] = (int(rng.integers(-2, 20)), int(rng.integers(-2, 20)))
            kw["sink"] = int(rng.integers(0, 20))
        if r[1] < 0.3:
            kw["softcap"] = float(rng.uniform(1, 10))
        if r[2] < 0.3:
            kw["bias"] = rng.standard_normal((shape["B"], shape["Hq"], shape["Sq"], shape["Sk"])).astype(NP[dtype])
        elif r[2] < 0.5:
            kw["alibi_slopes"] = rng.uniform(0, 0.3, (shape["Hq"],)).astype(np.float32)
        if r[3] < 0.3:
            kw.update(dropout_p=0.2, seed=int(rng.integers(0, 2**40)), offset=int(rng.integers(0, 1000)))
        if r[4] < 0.3:
            kw["vlayout"] = "c"
        kw["block_m"], kw["block_n"] = int(rng.choice([16, 32])), int(rng.choice([16, 32]))
        try:
            check(interp, dtype, q, k, v, **kw)
        except AssertionError as e:
            raise AssertionError(f"case {case}: {dtype} {shape} {kw.keys()}: {e}") from None


# ---------------------------------------------------------------------------------------------
# host API (no interpreter)
# ---------------------------------------------------------------------------------------------


def test_api_shapes():
    import inspect

    from fmha_dsl.kernels import fwd_host as H
    from fmha_dsl.kernels import triton_fwd as T

    params = list(inspect.signature(T.fmha_fwd.fn).parameters)
    sig = H.signature("bf16")
    assert list(sig) == params
    assert sig["Q"] == "*bf16" and sig["Lse"] == "*fp32" and sig["seed"] == "i64" and sig["BLOCK_M"] == "constexpr"
    with pytest.raises(ValueError):
        H.signature("fp8")
    s = dict(dtype="fp16", mode="group", vlayout="c", hdim_q=80, hdim_v=64, mask="bottom_right", bias="alibi",
             lse=True, dropout=True, logits=True, sink=True)
    a = dict(tile=(128, 64, 128, 64, 64, 128), pad_s=0, pad_sk=0, pad_d=0, pad_dv=0)
    c = H.constexprs(s, a)
    assert set(c) == set(H.CONSTEXPRS)
    assert (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_DMODEL"], c["BLOCK_DV"]) == (128, 64, 128, 64)
    assert c["PAD_M"] and c["PAD_N"]  # group mode always checks sequence bounds
    assert c["CHECK_D"] and not c["PAD_D"] and not c["CHECK_DV"]
    assert c["MASK"] and c["SINK"] and c["BIAS_TYPE"] == 2 and c["VLAYOUT_C"] and not c["IEEE"]
    assert H.constexprs(dict(s, dtype="fp32", mask="no"), a)["SINK"] is False
    with pytest.raises(ValueError):
        H.constexprs(dict(s, rope="inter"), a)
    assert H.grid(3, 8, 1000, 128) == (8, 8, 3) and H.grid(2, 4, 0, 64)[0] == 0
    args = H.pack_args(q=4096, k=8192, v=12288, out=16384, q_strides=(4096, 2048, 64, 1),
                       k_strides=(4096, 2048, 64, 1), v_strides=(4096, 2048, 1, 32), out_strides=(4096, 2048, 64, 1),
                       nhead_q=2, nhead_k=2, head_dim_q=64, head_dim_v=64, seqlen_q=32, seqlen_k=32, vlayout="c",
                       seed=2**64 - 1, dropout_p=0.1)
    assert len(args) == len(H.ARGS)
    named = dict(zip([n for n, _ in H.ARGS], args))
    assert named["seed"] == -1 and named["max_seqlen_k"] == 32 and math.isclose(named["sm_scale"], 0.125)
    assert H.aligned(args, "c") and not H.aligned(args, "r")
    with pytest.raises(ValueError):  # row-major V needs a unit head-dim stride
        H.pack_args(q=0, k=0, v=0, out=0, q_strides=(1, 1, 1, 1), k_strides=(1, 1, 1, 1), v_strides=(1, 1, 1, 2),
                    out_strides=(1, 1, 1, 1), nhead_q=1, nhead_k=1, head_dim_q=8, head_dim_v=8)
    with pytest.raises(ValueError):  # i32 overflow
        H.pack_args(q=0, k=0, v=0, out=0, q_strides=(2**31, 1, 1, 1), k_strides=(1, 1, 1, 1),
                    v_strides=(1, 1, 1, 1), out_strides=(1, 1, 1, 1), nhead_q=1, nhead_k=1, head_dim_q=8, head_dim_v=8)


# ---------------------------------------------------------------------------------------------
# ahead-of-time compile without a GPU (one config per target)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target,opts", [
    (("hip", "gfx942", 64), {"num_warps": 4, "num_stages": 2}),
    (("cuda", 90, 32), {"num_warps": 8, "num_stages": 3}),
])
def test_aot_compile(tmp_path, monkeypatch, target, opts):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fmha_dsl.kernels import fwd_host as H
    from fmha_dsl.kernels import triton_fwd as T

    if not hasattr(T.fmha_fwd, "params"):
        pytest.skip("TRITON_INTERPRET=1 in this process: fmha_fwd is interpreted")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    sig = dict(dtype="fp16", mode="batch", vlayout="r", hdim_q=128, hdim_v=128, mask="top_left", bias="no",
               lse=True, dropout=False, logits=False, sink=False)
    alg = dict(tile=(128, 64, 128, 128, 64, 128), pad_s=1, pad_sk=1, pad_d=0, pad_dv=0)
    src = ASTSource(fn=T.fmha_fwd, signature=H.signature("fp16"), constexprs=H.constexprs(sig, alg),
                    attrs=H.attrs("fp16"))
    t0 = time.time()
    ck = triton.compile(src, target=GPUTarget(*target), options=opts)
    dt = time.time() - t0
    assert ck.metadata.name == "fmha_fwd" and ck.metadata.shared > 0
    if target[0] == "hip":
        asm = ck.asm["amdgcn"]
        assert "v_mfma" in asm
        vgpr = int(re.search(r"\.vgpr_count:\s+(\d+)", asm).group(1))
        spill = int(re.search(r"\.vgpr_spill_count:\s+(\d+)", asm).group(1))
        print(f"gfx942: {dt:.1f} s, shared {ck.metadata.shared} B, VGPR {vgpr}, VGPR spills {spill}")
        assert len(ck.asm["hsaco"]) > 0
    else:
        ptx = ck.asm["ptx"]
        assert "wgmma.mma_async" in ptx  # Hopper tensor cores
        assert "cp.async.cg.shared.global" in ptx  # 16-byte async copies (needs attrs())
        print(f"sm90: {dt:.1f} s, shared {ck.metadata.shared} B")
        assert len(ck.asm["cubin"]) > 0


@pytest.mark.parametrize("sq,sk", [(48, 56), (40, 40), (56, 31)])
@both_guard_sides
def test_window_edges(interp, sq, sk):
    """Windows whose edges fall on, just before and just after key-block boundaries (BLOCK 16): the
    split into masked and unmasked key blocks must be exact (bottom-right windows, and top-left ones
    through ``causal=True``, which clips ``right`` to 0)."""
    q, k, v = make("fp32", Sq=sq, Sk=sk, Dq=8, Hq=1)
    cases = [dict(window=w) for w in [(0, 0), (1, 1), (15, 14), (14, 15), (16, 16), (17, 1), (-1, 14), (30, -1)]]
    cases += [dict(window=(w, 0), causal=True) for w in (0, 1, 15, 16)]
    for kw in cases:
        try:
            check(interp, "fp32", q, k, v, **kw)
        except AssertionError as e:
            raise AssertionError(f"{kw}: {e}") from None


def test_partial_key_block_in_each_masked_range(interp):
    """A mask kernel takes the partial last key block out of its masked loop and runs it alone, with the key bound
    checked (the loop then checks none).  That block can lie in each of the loop's three ranges -- the sink columns,
    the window's left edge, the diagonal / right edge -- or in none (BLOCK 16, Sk = 45: keys 32-44 are the partial
    block; split-KV too, where a split may own it or not)."""
    cases = [dict(window=(2, 0), sink=45, Sq=45),       # the sink range spans every key block
             dict(window=(2, 0), sink=33, Sq=45),       # the sink ends inside the partial block
             dict(window=(3, -1), Sq=16),               # the left edge's range reaches the last key
             dict(window=(20, -1), Sq=16),
             dict(window=(3, -1), Sq=16, scale=-0.5),  # a negative scale: the full blocks join the masked loop
             dict(window=(40, 2), Sq=45),
             dict(window=(-1, 0), Sq=8),                # the diagonal range
             dict(causal=True, Sq=45),
             dict(causal=True, sink=5, Sq=45, num_splits=3),
             dict(window=(3, -1), sink=40, Sq=16, num_splits=2),
             dict(window=(5, 0), Sq=45, num_splits=4),
             dict(causal=True, sink=40, Sq=45, pipeline="qr_async_trload"),  # TMA descriptors
             dict(window=(3, -1), Sq=16, pipeline="qr_async_trload")]
    for case in cases:
        kw = dict(case)
        q, k, v = make("fp32", Sq=kw.pop("Sq"), Sk=45, Dq=8, Hq=1, seed=len(kw))
        try:
            check(interp, "fp32", q, k, v, **kw)
        except AssertionError as e:
            raise AssertionError(f"{case}: {e}") from None


@pytest.mark.parametrize("sq0,sk0,kw", [
    (16, 45, dict(window=(3, -1))),                            # the partial key block in the window-left range
    (16, 45, dict(window=(3, -1), scale=-0.3)),                # a negative scale sends the full blocks there too
    (45, 45, dict(causal=True, sink=5, num_splits=3)),
    (17, 33, dict(window=(2, 0), sink=33)),                    # in the sink range
    (5, 15, dict(causal="bottom_right", Hq=4, Hk=2)),          # the partial block is the first block (GQA)
    (31, 17, dict(window=(-1, 0), num_splits=2, Hq=2, Hk=1)),
])
@both_guard_sides
def test_padded_reads_stay_inside_the_sequence(interp, sq0, sk0, kw):
    """Group mode with a second sequence whose Q, K and V are all NaN: the first sequence's rows stay exact, so no
    load of a padded block (the partial key block, Q rows past the sequence) reads the next sequence's rows."""
    kw = dict(kw)
    hq, hk = kw.pop("Hq", 1), kw.pop("Hk", 1)
    rng = np.random.default_rng(sq0 * 100 + sk0)
    q = rng.standard_normal((sq0 + 3, hq, 8)).astype(np.float32)
    k = rng.standard_normal((sk0 + 30, hk, 8)).astype(np.float32)
    v = rng.standard_normal((sk0 + 30, hk, 8)).astype(np.float32)
    q[sq0:], k[sk0:], v[sk0:] = np.nan, np.nan, np.nan
    cq, ck = np.array([0, sq0, sq0 + 3], np.int32), np.array([0, sk0, sk0 + 30], np.int32)
    out, _ = interp(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **kw)
    splits = kw.pop("num_splits", 0)
    ro, _ = attention_fwd(*(np.asarray(x[:n], np.float64) for x, n in ((q, sq0), (k, sk0), (v, sk0))),
                          cu_seqlens_q=cq[:2], cu_seqlens_k=ck[:2], accum=np.float64, **kw)
    err = np.abs(np.asarray(out[:sq0], np.float64) - ro).max()
    assert err < 1e-4, f"splits={splits}: max |out - ref| = {err}"


def test_invisible_key_blocks_are_not_loaded(interp):
    """NaN in V where a query block's mask hides whole key blocks: those rows stay exact, so the kernel
    never loaded the blocks (loop bounds skip them; a masked load would give 0 * NaN = NaN)."""
    q, k, v = make("fp32", Sq=64, Sk=64, Dq=8, Hq=1)
    ro, _ = attention_fwd(q, k, v, causal=True, accum=np.float64)
    vp = v.copy()
    vp[:, :, 16:] = np.nan  # query block 0 (rows 0-15) sees key block 0 only
    out, _ = interp(q, k, vp, causal=True)
    assert np.abs(out[:, :, :16] - ro[:, :, :16]).max() < 2e-5
    # window (3, 0) + 2 sink columns: rows 32-47 see keys 0-1 (block 0) and 29-47 (blocks 1-2)
    ro, _ = attention_fwd(q, k, v, window=(3, 0), sink=2, accum=np.float64)
    vp = v.copy()
    vp[:, :, 48:] = np.nan
    out, _ = interp(q, k, vp, window=(3, 0), sink=2)
    assert np.abs(out[:, :, 32:48] - ro[:, :, 32:48]).max() < 2e-5
    vp = v.copy()
    vp[:, :, 16:28] = np.nan  # rows 0-15 see keys 0-15 only: key block 1 is never loaded for them
    out, _ = interp(q, k, vp, window=(3, 0), sink=2)
    assert np.abs(out[:, :, :16] - ro[:, :, :16]).max() < 2e-5


# ---------------------------------------------------------------------------------------------
# pipeline qr_async_trload: K and V through on-device tensor descriptors (TMA on Hopper)
# ---------------------------------------------------------------------------------------------

TMA_FEATURES = ("plain", "even_blocks", "causal_bottom_right", "causal_br_sq_gt_sk", "window_sink",
                "causal_sink_wide", "bias", "alibi_batch", "softcap", "dropout", "gqa", "hdim_80_96",
                "hdim_pad_runtime", "no_lse")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("name", TMA_FEATURES)
def test_tma_descriptors(interp, dtype, name):
    """The descriptors' zero fill past seqlen_k and the head dims stands in for the masked loads."""
    q, k, v, kw = _setup(dtype, FEATURES[name])
    check(interp, dtype, q, k, v, pipeline="qr_async_trload", **kw)


def _group_mode_with_and_without_splits(interp, hq, hk, pipeline):
    """GROUP's batch (an empty query and an empty key sequence) bottom-right causal, in one pass and in 3 splits:
    the rows of the sequence without keys are 0 with lse -inf."""
    q, k, v = make("fp16", Hq=hq, Hk=hk, Dq=24, Dv=40, group=GROUP)
    cq = np.concatenate([[0], np.cumsum(GROUP[0])]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(GROUP[1])]).astype(np.int32)
    for splits in (0, 3):
        out, l, _, _ = check(interp, "fp16", q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal="bottom_right",
                             num_splits=splits, pipeline=pipeline)
        assert (out[38:50] == 0).all() and np.isneginf(l[:, 38:50]).all()


@both_guard_sides
def test_tma_descriptors_group_mode_and_split(interp):
    _group_mode_with_and_without_splits(interp, 2, 1, "qr_async_trload")


def test_tma_needs_row_major_v():
    from fmha_dsl.kernels.fwd_host import constexprs

    sig = {"dtype": "fp16", "hdim_q": 64, "hdim_v": 64, "vlayout": "c"}
    with pytest.raises(ValueError, match="row-major V"):
        constexprs(sig, {"tile": (64, 64), "pipeline": "qr_async_trload"})
    assert constexprs(dict(sig, vlayout="r"), {"tile": (64, 64), "pipeline": "qr_async_trload"})["TMA"]
    assert not constexprs(dict(sig, vlayout="r"), {"tile": (64, 64), "pipeline": "qr_async"})["TMA"]


def test_template_and_rules_agree_on_the_tma_pipelines():
    from fmha_dsl.kernels.fwd_host import constexprs
    from fmha_dsl.rules.triton_fwd import _data

    sig = {"dtype": "fp16", "hdim_q": 64, "hdim_v": 64}
    tma = {p for p in _data()["pipelines"] if constexprs(sig, {"tile": (64, 64), "pipeline": p})["TMA"]}
    assert tma == {"qr_async_trload", "qr_async_trload_v3"}


# ---------------------------------------------------------------------------------------------
# split-KV: the split kernel (SPLIT) + the combine kernel give the same result as one pass
# ---------------------------------------------------------------------------------------------

SPLIT_FEATURES = ("plain", "causal_bottom_right", "causal_br_sq_gt_sk", "window_sink", "causal_sink_wide",
                  "window_huge_sink_huge", "bias_broadcast", "alibi_batch", "softcap", "dropout", "gqa",
                  "hdim_pad_runtime", "vlayout_c", "no_lse", "even_blocks")


@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("name", SPLIT_FEATURES)
def test_split_kv(interp, name, splits):
    """3 splits of the 4 key blocks leave one split with a partial share; 8 leave splits with no key at all."""
    q, k, v, kw = _setup("fp32", FEATURES[name])
    check(interp, "fp32", q, k, v, num_splits=splits, **kw)


@pytest.mark.parametrize("sink", [0, 3])
def test_the_splits_share_the_blocks_a_window_leaves_in_reach(interp, sink):
    """A decode row with a window of 64 keys over 192 (block 16): 4 key blocks in reach, one per split of 4, so every
    split computes (its partial LSE is finite) and the partials add up to the row's LSE; the sink block is the first
    split's.  Splitting all 12 key blocks instead (3 a split) left the first two splits with nothing to do."""
    q, k, v = make("fp32", Hq=2, Sq=1, Sk=192, Dq=16, seed=3)
    kw = dict(causal="bottom_right", window=(63, 0), sink=sink)
    out, lse, parts = interp(q, k, v, num_splits=4, block_n=16, partials=True, **kw)
    ro, rl = attention_fwd(*(np.asarray(x, np.float64) for x in (q, k, v)), accum=np.float64, **kw)
    assert np.abs(out - ro).max() < 1e-4 and np.abs(lse - rl).max() < 1e-4
    parts = np.asarray(parts, np.float64).reshape(1, 2, 4, 1)   # [batch, head, split, row]
    assert np.isfinite(parts).all(), parts.ravel()
    np.testing.assert_allclose(np.log(np.exp(parts).sum(axis=2)), rl, atol=1e-4)
    if sink:  # the sink columns' block is the first split's: it holds more than its share of the window
        _, _, alone = interp(q, k, v, num_splits=4, block_n=16, partials=True, causal="bottom_right", window=(63, 0))
        alone = np.asarray(alone, np.float64).reshape(1, 2, 4, 1)
        assert (parts[:, :, 0] > alone[:, :, 0]).all() and np.allclose(parts[:, :, 1:], alone[:, :, 1:], atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_split_kv_low_precision(interp, dtype):
    q, k, v, kw = _setup(dtype, dict(causal=True, window=(20, 0), shape=dict(Hq=4, Hk=2, Sq=9, Sk=90)))
    check(interp, dtype, q, k, v, num_splits=4, block_n=32, **kw)


@both_guard_sides
def test_split_kv_group_mode(interp):
    q, k, v = make("fp16", Hq=2, Hk=1, Dq=24, Dv=40, group=GROUP)
    cq = np.concatenate([[0], np.cumsum(GROUP[0])]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(GROUP[1])]).astype(np.int32)
    out, l, _, _ = check(interp, "fp16", q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal="bottom_right",
                         dropout_p=0.2, seed=5, num_splits=3)
    assert (out[38:50] == 0).all() and np.isneginf(l[:, 38:50]).all()


# ---------------------------------------------------------------------------------------------
# GQA-packed rows (pipeline qr_nwarp_sshuffle): one program per K/V head, the group's query heads in the rows
# ---------------------------------------------------------------------------------------------

PACK_FEATURES = ("plain", "causal_top_left", "causal_bottom_right", "causal_br_sq_gt_sk", "window", "window_sink",
                 "causal_sink_wide", "window_huge_sink_huge", "softcap", "hdim_pad_runtime", "vlayout_c", "no_lse",
                 "even_blocks")


@pytest.mark.parametrize("heads", [(4, 1), (6, 2), (2, 2)])
@pytest.mark.parametrize("name", PACK_FEATURES)
def test_gqa_packed_rows(interp, name, heads):
    """Rows mix heads and queries (row t: query t // g of head kv * g + t % g): the masks, the per-row stores and
    the block ranges (first/last query of a block) against the reference, with and without split-KV."""
    spec = dict(FEATURES[name])
    shape = dict(spec.get("shape", {}), Hq=heads[0], Hk=heads[1])
    spec["shape"] = shape
    q, k, v, kw = _setup("fp32", spec)
    for splits in (0, 3):
        check(interp, "fp32", q, k, v, pipeline="qr_nwarp_sshuffle", num_splits=splits, **kw)


@pytest.mark.parametrize("sq", [1, 4, 5])
def test_gqa_packed_decode_shapes(interp, sq):
    """Decode-sized queries (a block holds several queries of every head of the group), fp16, causal corner at the
    bottom right, split into more parts than the key axis has blocks."""
    q, k, v, kw = _setup("fp16", dict(causal="bottom_right", shape=dict(B=2, Hq=8, Hk=2, Sq=sq, Sk=70)))
    for splits in (0, 8):
        check(interp, "fp16", q, k, v, pipeline="qr_nwarp_sshuffle", num_splits=splits, block_m=16, **kw)


@both_guard_sides
def test_gqa_packed_group_mode(interp):
    _group_mode_with_and_without_splits(interp, 4, 2, "qr_nwarp_sshuffle")


def test_gqa_packing_has_no_bias_or_dropout():
    from fmha_dsl.kernels.fwd_host import constexprs

    sig = {"dtype": "fp16", "hdim_q": 64, "hdim_v": 64}
    alg = {"tile": (64, 64), "pipeline": "qr_nwarp_sshuffle"}
    assert constexprs(sig, alg)["PACK_GQA"] and not constexprs(sig, dict(alg, pipeline="qr_async"))["PACK_GQA"]
    for bad in ({"bias": "bias"}, {"bias": "alibi"}, {"dropout": True}):
        with pytest.raises(ValueError, match="GQA-packed"):
            constexprs(dict(sig, **bad), alg)
