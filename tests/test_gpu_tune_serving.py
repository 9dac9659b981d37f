"""`fmha-dsl tune` over the serving families on a GPU: a tiny serving set (a batch_prefill kernel and a split-KV
fwd_pagedkv kernel with its combine, one cache: linear, vLLM block table, pages of 16) tuned over a tiny matrix
(decode, chunked prefill, prefill); the table then steers ``fmha_dsl.paged_attention(..., registry=DIR)`` to the
kernel it measured fastest at each point, and ``fmha-dsl report`` draws it.

    python3 -P -m pytest -q tests/test_gpu_tune_serving.py -p no:cacheprovider
"""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import fmha_dsl  # noqa: E402

SET = """kernel_set serving_tune {{
    backend(triton)
    arch({arch})
    dtype(bf16)
    hdim(128)
    kernel prefill {{
        signature {{ family(batch_prefill) mask(causal) kv_cache(linear, vllm, 16) }}
        algorithm {{ pipeline(qr_async) tile_m0(128) tile_n0(64) tile_k0(128) tile_n1(128) tile_k0max(128)
                    wave_m0(8) }}
    }}
    kernel decode {{
        signature {{ family(fwd_pagedkv) mask(causal) kv_cache(linear, vllm, 16) }}
        algorithm {{ pipeline(qr_nwarp_sshuffle) tile_m0(16) tile_n0(64) tile_k0(128) tile_n1(128) tile_k0max(128)
                    wave_m0(4) max_splits_log2(4) }}
    }}
}}
"""
CACHE = {"dtype": "bf16", "hdim": 128, "mask": "causal", "page_size": 16, "lookup": "vllm", "nhead_q": 8,
         "nhead_k": 2, "batch": [4]}
MATRIX = {"name": "serving-test", "version": 1, "classes": [
    dict(CACHE, family="fwd_pagedkv", seqlens=[1], seqlens_k=[8192]),                   # decode
    dict(CACHE, family="batch_prefill", seqlens=[128], seqlens_k=[1024]),               # chunked prefill
    dict(CACHE, family="batch_prefill", seqlens=[1024])]}                               # prefill
POINTS = [(1, 8192, 4, 8, 2), (128, 1024, 4, 8, 2), (1024, 1024, 4, 8, 2)]   # powers of two: their own buckets


@pytest.fixture(scope="module", autouse=True)
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")


def _built(tmp_path, text):
    """``(arch, build folder, registry)`` of kernel set ``text`` (an ``{arch}`` template) built for this GPU."""
    from fmha_dsl.build import build
    from fmha_dsl.registry import Registry
    from fmha_dsl.runtime.dispatch import detect_arch

    arch = detect_arch()
    src = tmp_path / "set.fmha"
    src.write_text(text.format(arch=arch))
    out_dir = tmp_path / "out"
    res = build(fmha_dsl.load(str(src)), str(out_dir), arch=arch, jobs=2)
    assert not res.failures, res.failures
    return arch, out_dir, Registry.load(str(out_dir / "registry.json"))


def test_tune_measures_a_serving_set_and_the_table_steers_paged_attention(tmp_path):
    from fmha_dsl import api_dispatch
    from fmha_dsl.registry import Registry
    from fmha_dsl.runtime.tune import expand_shapes, problem_of, tune
    from fmha_dsl.runtime.tune_inputs import PagedCall, relative_error

    arch, out_dir, reg = _built(tmp_path, SET)
    families = {e.identifier: e.sig["family"] for e in reg}
    assert sorted(families.values()) == ["batch_prefill", "fwd_pagedkv"]
    split = next(e for e in reg if e.sig["family"] == "fwd_pagedkv")
    assert (split.build or {}).get("combine"), "the split kernel was built without its combine"

    shapes = tmp_path / "serving.json"
    shapes.write_text(json.dumps(MATRIX))
    [(cls, pts)] = expand_shapes(json.loads(shapes.read_text()))
    assert pts == POINTS
    got = tune(str(out_dir), shapes=str(shapes), warmup_ms=5, rep_ms=20)
    assert got.measured == 6 and got.failed == 0, got      # both kernels at each point, checked against SDPA

    table = Registry.load(str(out_dir / "registry.json")).seqtune
    assert table["device"]["name"] == torch.cuda.get_device_name() and table["shapes"] == "serving-test"
    [entry] = table["classes"]
    assert entry["class"] == dict(cls) and entry["class"]["page_size"] == 16
    assert entry["class"]["kv_lookup"] == "vllm" and entry["class"]["family"] == "batch_prefill"
    measured = {tuple(p[f] for f in ("seqlen_q", "seqlen_k", "batch", "nhead_q", "nhead_k")): p["times_us"]
                for p in entry["points"]}
    assert sorted(measured) == sorted(POINTS)
    assert all(set(t) == set(families) and all(us > 0 for us in t.values()) for t in measured.values())

    # resumable: a second run measures nothing new
    again = tune(str(out_dir), shapes=str(shapes), warmup_ms=5, rep_ms=20)
    assert again.measured == 0 and again.skipped == 6

    dev = torch.cuda.current_device()
    disp = api_dispatch.dispatcher(str(out_dir), dev)          # the dispatcher paged_attention(registry=DIR) uses
    assert disp.table is not None, disp.table_note
    for pt in POINTS:
        fastest = min(measured[pt], key=measured[pt].get)
        rows = disp.explain(problem_of(cls, pt, arch))
        assert rows[0]["selected"] and rows[0]["source"] == "seqtune" and rows[0]["kernel"] == fastest, rows
        call = PagedCall(cls, pt, seed=1)
        sq, sk = pt[0], pt[1]
        disp.fast_paged.clear()
        out = fmha_dsl.paged_attention(call.q, call.k_cache, call.v_cache, block_table=call.kw["block_table"],
                                       seqlens_k=call.kw["seqlens_k"], cu_seqlens_q=call.kw["cu_seqlens_q"],
                                       max_seqlen_q=sq, max_seqlen_k=sk, causal=True, registry=str(out_dir))
        [plan] = disp.fast_paged.values()
        assert plan.entry.identifier == fastest, (pt, families[plan.entry.identifier], measured[pt])
        assert len(plan.stages) == (2 if families[fastest] == "fwd_pagedkv" else 1)
        err = relative_error(out.view(pt[2], sq, pt[3], -1).transpose(1, 2), call.truth())
        assert err <= 2e-2, (pt, err)

    html = tmp_path / "r.html"
    done = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "report", str(out_dir), "-o", str(html)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = html.read_text()
    assert "page_size=16 lookup=vllm kv_layout=linear" in text and "K/V GB/s" in text


FP8_SET = """kernel_set fp8_tune {{
    backend(triton)
    arch({arch})
    kernel prefill {{
        signature {{ family(batch_prefill) dtype(fp8bf16) qscale(*) hdim(128) mask(causal)
                    kv_cache(linear, vllm, 16) }}
        algorithm {{ pipeline(qr_nwarp_sshuffle) tile(64, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *) }}
    }}
    kernel decode {{
        signature {{ family(fwd_pagedkv) dtype(fp8bf16) qscale(*) hdim(128) mask(causal)
                    kv_cache(linear, vllm, 16) }}
        algorithm {{ pipeline(qr_nwarp_sshuffle) tile(16, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *)
                    max_splits_log2(4) }}
    }}
}}
"""


def test_tune_measures_fp8_serving_classes_of_every_descale_kind(tmp_path):
    """An FP8 serving set (per-tensor, KV block-scale and per-token-head kernels) tuned offline: one class per
    qscale, every kernel of a class checked against SDPA and timed at each point, none of the other kinds'; the table
    then steers paged_attention(registry=DIR) with each kind of descales, and the output matches the truth."""
    from fmha_dsl import api_dispatch
    from fmha_dsl.registry import Registry
    from fmha_dsl.runtime.dispatch import detect_arch
    from fmha_dsl.runtime.tune import QSCALES, expand_shapes, problem_of, tune
    from fmha_dsl.runtime.tune_inputs import PagedCall, relative_error

    if detect_arch() != "sm90":
        pytest.skip("the FP8 serving kernels run on sm90 here (gfx950 builds them too)")
    arch, out_dir, reg = _built(tmp_path, FP8_SET)
    kinds = {e.identifier: e.sig["qscale"] for e in reg}
    assert sorted(kinds.values()) == sorted(QSCALES * 2)
    matrix = {"name": "fp8-test", "version": 1, "classes": [
        dict(CACHE, dtype="fp8bf16", qscale=list(QSCALES), family="fwd_pagedkv", seqlens=[1], seqlens_k=[8192]),
        dict(CACHE, dtype="fp8bf16", qscale=list(QSCALES), family="batch_prefill", seqlens=[1024])]}
    shapes = tmp_path / "fp8.json"
    shapes.write_text(json.dumps(matrix))
    classes = expand_shapes(matrix)
    assert sorted(c["qscale"] for c, _ in classes) == sorted(QSCALES)
    got = tune(str(out_dir), shapes=str(shapes), warmup_ms=5, rep_ms=20)
    assert got.measured == 12 and got.failed == 0, got      # 2 kernels x 2 points in each of the 3 classes

    table = Registry.load(str(out_dir / "registry.json")).seqtune
    entries = {e["class"]["qscale"]: e for e in table["classes"]}
    assert sorted(entries) == sorted(QSCALES)
    dev = torch.cuda.current_device()
    disp = api_dispatch.dispatcher(str(out_dir), dev)
    for cls, pts in classes:
        entry = entries[cls["qscale"]]
        assert entry["class"] == dict(cls)
        for p in entry["points"]:
            assert {kinds[k] for k in p["times_us"]} == {cls["qscale"]}        # only its own kind's kernels
        for pt in pts:
            times = next(p["times_us"] for p in entry["points"]
                         if (p["seqlen_q"], p["seqlen_k"], p["batch"]) == pt[:3])
            rows = disp.explain(problem_of(cls, pt, arch))
            assert rows[0]["source"] == "seqtune" and rows[0]["kernel"] == min(times, key=times.get), rows
            call = PagedCall(cls, pt, seed=1)
            q_d, k_d, v_d = call.kw["descales"]
            out = fmha_dsl.paged_attention(call.q, call.k_cache, call.v_cache, block_table=call.kw["block_table"],
                                           seqlens_k=call.kw["seqlens_k"], cu_seqlens_q=call.kw["cu_seqlens_q"],
                                           max_seqlen_q=pt[0], max_seqlen_k=pt[1], causal=True, q_descale=q_d,
                                           k_descale=k_d, v_descale=v_d, registry=str(out_dir))
            err = relative_error(out.view(pt[2], pt[0], pt[3], -1).transpose(1, 2), call.truth())
            assert err <= 2e-2, (cls["qscale"], pt, err)
