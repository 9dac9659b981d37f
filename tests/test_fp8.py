"""FP8 e4m3 in NumPy (fmha_dsl/fp8.py) against hand-checked values of the OCP format, and the serving rules,
builds and NumPy API of the FP8 contract (CK's fp8bf16)."""

import numpy as np
import pytest

import fmha_dsl
from fmha_dsl.errors import UsageError
from fmha_dsl.fp8 import decode_e4m3, encode_e4m3, round_e4m3


def test_e4m3_values_by_hand():
    # 0x38 = 0.0111.000 = 1.0; 0x7E = 0.1111.110 = 1.75 * 2^8 = 448 (largest); 0x01 = 2^-9 (smallest subnormal);
    # 0x08 = 2^-6 (smallest normal); 0xC0 = -2.0; 0x7F / 0xFF are NaN (no infinities in the "fn" format)
    assert decode_e4m3([0x38, 0x7E, 0x01, 0x08, 0xC0]).tolist() == [1.0, 448.0, 2.0 ** -9, 2.0 ** -6, -2.0]
    assert np.isnan(decode_e4m3([0x7F, 0xFF])).all()
    # 1.0625 lies halfway between 1.0 (code 0x38, even) and 1.125 (0x39): ties go to the even code
    assert encode_e4m3([1.0625, 1.1875, 500.0, -1e9, 2.0 ** -11]).tolist() == [0x38, 0x3A, 0x7E, 0xFE, 0x00]
    assert encode_e4m3([-0.0]).tolist() == [0x80] and encode_e4m3([np.nan]).tolist() == [0x7F]


def test_every_finite_value_round_trips():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F])
    assert np.array_equal(encode_e4m3(decode_e4m3(codes)), codes.astype(np.uint8))
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 30
    r = round_e4m3(x)
    assert np.all(np.abs(r - x) <= np.abs(x) * 2.0 ** -4 + 2.0 ** -10)   # half an ulp: 3 mantissa bits


FP8_SET = """kernel_set fp8 {
    backend(triton)
    arch(*)
    kernel decode {
        signature { family(fwd_pagedkv) dtype(fp8bf16) qscale(pertensor) hdim(128) kv_cache(linear, vllm, 16) }
        algorithm { pipeline(qr_async) tile(*) }
    }
}
"""


def _check(tmp_path, text, arch):
    p = tmp_path / "s.fmha"
    p.write_text(text)
    return fmha_dsl.load(str(p)).expand(arch=arch)


def test_fp8_serving_kernels_exist_where_the_arch_has_ocp_fp8(tmp_path):
    keys = _check(tmp_path, FP8_SET, "sm90")
    assert keys and all(k.signature.dtype == "fp8bf16" and k.signature.qscale == "pertensor" for k in keys)
    assert _check(tmp_path, FP8_SET, "gfx950")
    for arch in ("gfx942", "sm80", "gfx1100"):
        with pytest.raises(fmha_dsl.FmhaError, match="no fp8bf16 fwd_pagedkv kernels for " + arch) as err:
            _check(tmp_path, FP8_SET.replace("arch(*)", f"arch({arch})"), arch)
        assert "built for gfx950, sm90" in err.value.hint


@pytest.mark.parametrize("kind", ["decode", "append"])
def test_fp8_needs_per_tensor_or_kv_block_descales(tmp_path, kind):
    text = FP8_SET if kind == "decode" else FP8_SET.replace(
        "family(fwd_pagedkv)", "family(fwd_appendkv) rope(half) paged_kv(true)").replace(
        "algorithm { pipeline(qr_async) tile(*) }", "")
    keys = _check(tmp_path, text, "sm90")
    assert keys and all(k.signature.qscale == "pertensor" for k in keys)
    blocks = _check(tmp_path, text.replace("qscale(pertensor)", "qscale(kv_blockscale)"), "sm90")
    assert len(blocks) == len(keys) and all(k.signature.qscale == "kv_blockscale" for k in blocks)
    both = _check(tmp_path, text.replace("qscale(pertensor)", "qscale(*)"), "sm90")
    kinds = {"pertensor", "kv_blockscale"} | ({"per_token_head"} if kind == "decode" else set())   # (attention's)
    assert {k.signature.qscale for k in both} == kinds and len(both) == len(kinds) * len(keys)
    if kind == "append":   # an append does not choose its rows' scales: per-token ones are refused, with a hint
        with pytest.raises(fmha_dsl.FmhaError, match="qscale") as err:
            _check(tmp_path, text.replace("qscale(pertensor)", "qscale(per_token_head)"), "sm90")
        assert "per-token ones are the caller's" in err.value.hint
    else:
        tokens = _check(tmp_path, text.replace("qscale(pertensor)", "qscale(per_token_head)"), "sm90")
        assert len(tokens) == len(keys) and all(k.signature.qscale == "per_token_head" for k in tokens)
    with pytest.raises(fmha_dsl.FmhaError, match="qscale"):
        _check(tmp_path, text.replace(" qscale(pertensor)", ""), "sm90")
    with pytest.raises(fmha_dsl.FmhaError, match="qscale") as err:
        _check(tmp_path, text.replace("qscale(pertensor)", "qscale(blockscale)"), "sm90")
    assert "kv_blockscale" in err.value.hint
    with pytest.raises(fmha_dsl.FmhaError, match="qscale"):
        _check(tmp_path, text.replace("dtype(fp8bf16)", "dtype(bf16)"), "sm90")
    with pytest.raises(fmha_dsl.FmhaError, match="no fp8bf16 .* kernels for gfx942"):
        _check(tmp_path, text.replace("arch(*)", "arch(gfx942)"), "gfx942")


@pytest.mark.slow
def test_fp8_serving_kernels_compile_for_sm90_and_gfx950(tmp_path):
    """Decode, prefill and append-KV over FP8 caches, per-tensor descales and KV block scales (and per-token-head
    scales for attention), build for both FP8 targets (gfx950's never run here)."""
    pytest.importorskip("triton")
    from fmha_dsl.cli import main

    p = tmp_path / "s.fmha"
    prefill = """    kernel prefill {
        signature { family(batch_prefill) dtype(fp8bf16) qscale(pertensor) hdim(128) kv_cache(linear, vllm, 16) }
        algorithm { pipeline(qr_nwarp_sshuffle) tile(64, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *) }
    }
    kernel append {
        signature { family(fwd_appendkv) dtype(fp8bf16) qscale(pertensor | kv_blockscale) hdim(128) rope(half)
                    paged_kv(true)
                    kv_cache(linear | vectorized, vllm, 16) }
    }
}"""
    p.write_text((FP8_SET.replace("algorithm { pipeline(qr_async) tile(*) }",
                                  "algorithm { pipeline(qr_async) tile(*) }\n        where tile_m0 == 16")
                  .rstrip().removesuffix("}") + prefill)
                 .replace("qscale(pertensor)", "qscale(*)"))   # attention's three kinds, an append's two
    assert main(["build", str(p), "--arch", "sm90,gfx950", "-o", str(tmp_path / "b"), "-j", "2", "-q"]) == 0
    import json

    reg = json.loads((tmp_path / "b" / "registry.json").read_text())
    names = [k["name"] for k in reg["kernels"]]
    kinds = ("fp8bf16_pertensor", "fp8bf16_kv_blockscale", "fp8bf16_per_token_head")
    assert names and all(any(k in n for k in kinds) for n in names)
    per = [sum(k in n for n in names) for k in kinds]   # block scales build wherever per-tensor do, per-token ones
    assert per[0] == per[1] and per[2] == sum("fwd_appendkv" not in n and "_pertensor" in n for n in names)  # too
    assert {k["gfx_arch"] for k in reg["kernels"]} == {"sm90", "gfx950"}
    fams = {(k["gfx_arch"], k["name"].split("_d128")[0].removeprefix("fmha_").split("_s")[0]) for k in reg["kernels"]}
    assert fams == {(a, f) for a in ("sm90", "gfx950") for f in ("fwd_pagedkv", "batch_prefill", "fwd_appendkv")}
    combine = [k["build"]["combine"]["name"] for k in reg["kernels"] if "combine" in k["build"]]
    assert combine and all("_bf16_" in c for c in combine)   # the combine writes the contract's bf16 output
    from fmha_dsl import sass as cubin_sass

    if cubin_sass.available():   # sm90's 64-row prefill tile takes Q.K^T on the FP8 warpgroup MMA (QGMMA)
        cubin = next(tmp_path / "b" / k["build"]["binary"] for k in reg["kernels"]
                     if k["gfx_arch"] == "sm90" and "batch_prefill" in k["name"])
        sass = cubin_sass.listing(cubin.read_bytes())
        assert "QGMMA" in sass and "HGMMA" in sass, "Q.K^T not on the e4m3 MMA, or P.V not on the fp16 one"


def test_numpy_paged_attention_takes_descales():
    rng = np.random.default_rng(0)
    kc, vc = (round_e4m3(rng.standard_normal((3, 4, 1, 8)).astype(np.float32) * 4) for _ in range(2))
    q = round_e4m3(rng.standard_normal((2, 2, 8)).astype(np.float32))
    kw = dict(block_table=np.array([[2, 0], [1, 0]], np.int32), seqlens_k=[6, 3], cu_seqlens_q=[0, 1, 2])
    got = fmha_dsl.paged_attention(q, kc, vc, q_descale=0.5, k_descale=2.0, v_descale=3.0, **kw)
    want = fmha_dsl.paged_attention(q * 0.5, kc * 2.0, vc * 3.0, **kw)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-7)
    with pytest.raises(UsageError, match="v_descale missing"):
        fmha_dsl.paged_attention(q, kc, vc, q_descale=0.5, k_descale=2.0, **kw)


def test_numpy_append_kv_quantizes_into_fp8_caches():
    """The NumPy path of an FP8 append: the new rows land as round_e4m3(clip(x / descale, +-448)), in place."""
    rng = np.random.default_rng(1)
    kc, vc = np.zeros((2, 4, 1, 8), np.float32), np.zeros((2, 4, 1, 8), np.float32)
    kn, vn = (rng.standard_normal((3, 1, 8)).astype(np.float32) * 300 for _ in range(2))
    fmha_dsl.append_kv(kc, vc, kn, vn, block_table=np.array([[1, 0]], np.int32), seqlens_k=[2],
                       cu_seqlens_new=[0, 3], k_descale=0.5, v_descale=3.0)
    rows = [(1, 2), (1, 3), (0, 0)]
    assert np.array_equal(np.stack([kc[p, s] for p, s in rows]), round_e4m3(np.clip(kn / 0.5, -448, 448)))
    assert np.array_equal(np.stack([vc[p, s] for p, s in rows]), round_e4m3(np.clip(vn / np.float32(3.0), -448, 448)))
    assert np.abs(kc).max() == 448.0                     # 300 / 0.5 saturates


def test_numpy_kv_block_scales_scale_each_page_and_head():
    """``k_descale``/``v_descale`` of shape [num_pages, Hk] (CK's KV block scales): the answer is attention over the
    cache with page p's head h multiplied by its scales, built here by hand."""
    rng = np.random.default_rng(2)
    kc, vc = (round_e4m3(rng.standard_normal((4, 4, 2, 8)).astype(np.float32) * 4) for _ in range(2))
    q = round_e4m3(rng.standard_normal((2, 4, 8)).astype(np.float32))
    kd, vd = (rng.uniform(0.1, 3.0, (4, 2)) for _ in range(2))
    kw = dict(block_table=np.array([[2, 0], [1, 3]], np.int32), seqlens_k=[6, 7], cu_seqlens_q=[0, 1, 2])
    got = fmha_dsl.paged_attention(q, kc, vc, q_descale=0.5, k_descale=kd, v_descale=vd, **kw)
    ks, vs = kc.astype(np.float64).copy(), vc.astype(np.float64).copy()
    for p in range(4):
        for h in range(2):
            ks[p, :, h] *= kd[p, h]
            vs[p, :, h] *= vd[p, h]
    want = fmha_dsl.paged_attention(q.astype(np.float64) * 0.5, ks, vs, **kw)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(got, fmha_dsl.paged_attention(q, kc, vc, q_descale=0.5, k_descale=float(kd.mean()),
                                                         v_descale=float(vd.mean()), **kw), atol=1e-2)
    # an append divides each new row by the descale of the page it lands in
    kc2, vc2 = np.zeros((2, 4, 1, 8), np.float32), np.zeros((2, 4, 1, 8), np.float32)
    kn = rng.standard_normal((3, 1, 8)).astype(np.float32) * 50
    sd = np.array([[0.5], [4.0]], np.float32)
    fmha_dsl.append_kv(kc2, vc2, kn, kn, block_table=np.array([[1, 0]], np.int32), seqlens_k=[2],
                       cu_seqlens_new=[0, 3], k_descale=sd, v_descale=sd)
    assert np.array_equal(kc2[1, 2:], round_e4m3(np.clip(kn[:2] / np.float32(4.0), -448, 448)))
    assert np.array_equal(kc2[0, :1], round_e4m3(np.clip(kn[2:] / np.float32(0.5), -448, 448)))


def test_per_key_v_descales_scale_v_rows_in_prefill_tiles_only():
    """A V descale per key (per-token-head scales; block scales over pages shorter than a key block) multiplies V's
    rows in tiles of at least 64 query rows and at least as many rows as keys (``V_ROWS``: fewer instructions there,
    bench/probe_sass_paged.py), and P's columns elsewhere: decode's 16-row tiles, wide 64 x 128 tiles, the
    vectorized layout (read as vectors, not rows).  The interpreter runs both paths
    (tests/test_triton_paged_interp.py ``v_rows_*``)."""
    from fmha_dsl.kernels.paged_host import constexprs  # (no Triton needed)

    def v_rows(qscale, page, tile, layout="linear"):
        sig = {"family": "batch_prefill", "dtype": "fp8bf16", "qscale": qscale, "hdim_q": 128, "hdim_v": 128,
               "page_size": page, "kv_layout": layout}
        return constexprs(sig, {"tile": (*tile, 0, 0, 0, 0), "pipeline": "qr"})["V_ROWS"]

    assert v_rows("per_token_head", 16, (128, 64)) and v_rows("per_token_head", 1024, (64, 64))
    assert v_rows("kv_blockscale", 16, (128, 64)) and v_rows("per_token_head", 4, (64, 16))
    assert not v_rows("kv_blockscale", 1024, (128, 64))       # one descale per block: a scalar on the output
    assert not v_rows("per_token_head", 16, (64, 128)) and not v_rows("per_token_head", 16, (16, 128))
    assert not v_rows("per_token_head", 16, (128, 64), "vectorized") and not v_rows("pertensor", 16, (128, 64))
