"""`fmha-dsl tune` and `fmha-dsl report` for the serving families, without a GPU: serving classes of the shape matrix
(validation, classes, points, the dispatcher's problems), seqtune class keys of paged problems, the dispatcher ranking
paged_attention's candidates by a hand-written serving table (and never for another page size or lookup), the report
of a serving table, and a point's inputs and truth run through Triton's interpreter.  The GPU test is
tests/test_gpu_tune_serving.py."""

import json

import pytest

from interpreted import run_interpreted

import fmha_dsl
from fmha_dsl import UsageError, seqtune
from fmha_dsl.keys import Problem
from fmha_dsl.registry import Entry, Registry
from fmha_dsl.runtime.dispatch import Dispatcher
from fmha_dsl.runtime.tune import expand_shapes, load_shapes, problem_of

SERVING = {"family": "batch_prefill", "dtype": "bf16", "hdim": 128, "mask": "causal", "page_size": 16,
           "nhead_q": 32, "nhead_k": 8}
SET = """kernel_set s { backend(triton) arch(sm90) dtype(bf16) hdim(128)
  kernel p { signature { family(batch_prefill) mask(causal) kv_cache(linear, vllm | sglang, 16 | 1024) }
             algorithm { pipeline(qr_async) tile_m0(128) tile_n0(64) tile_k0(128) tile_n1(128) tile_k0max(128)
                         wave_m0(8) } }
  kernel d { signature { family(fwd_pagedkv) mask(causal) kv_cache(linear, vllm | sglang, 16 | 1024) }
             algorithm { pipeline(qr_nwarp_sshuffle) tile_m0(16) tile_n0(64) tile_k0(128) tile_n1(128)
                         tile_k0max(128) wave_m0(4) max_splits_log2(4) } }
}"""
DEV = {"name": "NVIDIA H100 80GB HBM3", "arch": "sm90", "compute_units": 132, "driver": "1", "triton": "3",
       "torch": "2"}
DECODE, PREFILL = (1, 8192, 16, 32, 8), (2048, 2048, 8, 32, 8)


def _matrix(tmp_path, *classes):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"name": "serving-test", "classes": list(classes)}))
    return load_shapes(str(p))


# ---------------------------------------------------------------------------------------------------------
# the shape matrix
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,msg,hint", [
    ({"seqlens": [1], "seqlens_k": [64], "page_size": 16}, "`page_size` is a field of serving classes",
     "batch_prefill"),
    ({"seqlens": [1], "seqlens_k": [64], "lookup": "vllm"}, "`lookup` is a field of serving classes", "fwd_pagedkv"),
    (dict(SERVING, seqlens=[1], seqlens_k=[64], page_size=12), "`page_size` must be a power of two, got 12",
     "serving.fmha"),
    (dict(SERVING, seqlens=[1], seqlens_k=[64], page_size=[16, 0]), "`page_size` must be a positive integer", ""),
    (dict(SERVING, seqlens=[1], seqlens_k=[64], lookup="vlm"), "unknown lookup 'vlm'", "vllm"),
    (dict(SERVING, seqlens=[1], seqlens_k=[64], kv_layout="swizzled"), "unknown kv_layout 'swizzled'",
     "vectorized"),
    (dict(SERVING, seqlens=[512], seqlens_k=[64]), "seqlen_k 64 < seqlen_q 512", "seqlens_k"),
    (dict(SERVING, family="pagedkv", seqlens=[1]), "unknown family 'pagedkv'", ""),
    (dict(SERVING, seqlens=[1], pagesize=16), "unknown field `pagesize`", ""),
    (dict(SERVING, seqlens=[1], qscale="pertensor"), "`qscale` is a field of FP8 classes", "fp8bf16"),
    (dict(SERVING, dtype="fp8bf16", seqlens=[1], qscale="blockscale"), "unknown qscale 'blockscale'",
     "kv_blockscale"),
    ({"dtype": "fp8bf16", "seqlens": [128]}, "dtype fp8bf16 is the serving kernels' FP8 contract", "batch_prefill"),
])
def test_bad_serving_classes_are_located_usage_errors(tmp_path, cls, msg, hint):
    with pytest.raises(UsageError) as info:
        _matrix(tmp_path, {"seqlens": [128]}, cls)
    err = info.value
    assert err.rule == "usage.file" and "classes[1]" in err.message and msg in err.message, err.message
    assert err.hint and hint in err.hint, err.hint


def test_serving_classes_expand_to_paged_attention_problems(tmp_path):
    """Prefill (batch_prefill) and decode (fwd_pagedkv) entries of one cache land in one seqtune class per (dtype,
    mask, page size, lookup, layout); their problems are what paged_attention builds."""
    doc = _matrix(tmp_path,
                  dict(SERVING, lookup=["vllm", "sglang"], seqlens=[512], tokens=1024),
                  dict(SERVING, family="fwd_pagedkv", lookup=["vllm", "sglang"], page_size=[16, 1024], seqlens=[1],
                       seqlens_k=[1024, 4096], batch=[1, 8]))
    classes = expand_shapes(doc)
    keys = [(c["kv_lookup"], c["page_size"]) for c, _ in classes]
    assert sorted(keys) == [("sglang", 16), ("sglang", 1024), ("vllm", 16), ("vllm", 1024)]
    cls, pts = next((c, p) for c, p in classes if (c["kv_lookup"], c["page_size"]) == ("vllm", 16))
    assert cls == {"family": "batch_prefill", "dtype": "bf16", "mode": "group", "vlayout": "r", "hdim_q": 128,
                   "hdim_v": 128, "mask": "causal", "bias": "no", "lse": False, "dropout": False, "logits": False,
                   "sink": False, "kv_layout": "linear", "kv_lookup": "vllm", "page_size": 16}
    assert pts == [(1, 1024, 1, 32, 8), (1, 1024, 8, 32, 8), (1, 4096, 1, 32, 8), (1, 4096, 8, 32, 8),
                   (512, 512, 2, 32, 8)]
    p = problem_of(cls, (1, 4096, 8, 32, 8), "sm90")
    assert (p.family, p.mode, p.mask, p.paged_kv, p.kv_layout, p.kv_lookup, p.page_size) == (
        "batch_prefill", "group", "bottom_right", True, "linear", "vllm", 16)
    assert (p.max_seqlen_q, p.max_seqlen_k, p.batch, p.nhead_q, p.nhead_k) == (1, 4096, 8, 32, 8)
    # the table class of the API's problem is the matrix's class: measured here, looked up there
    assert seqtune.class_key(seqtune.class_of_problem(p)) == seqtune.class_key(cls)
    only_page_1024 = [c for c, _ in classes if c["page_size"] == 1024]
    assert all(pts for c, pts in classes if c in only_page_1024)


def test_fp8_classes_carry_their_descales_granularity(tmp_path):
    """FP8 serving classes (dtype fp8bf16) expand per qscale (per tensor by default); their problems are
    paged_attention's over e4m3 caches, and their table class is the API's (a KV block-scale class is another
    class: other kernels).  A class listing bf16 too keeps bf16 without a qscale."""
    classes = expand_shapes(_matrix(tmp_path, dict(SERVING, dtype=["fp8bf16", "bf16"], seqlens=[1],
                                                   seqlens_k=[4096], batch=[8]),
                                    dict(SERVING, dtype="fp8bf16", qscale=["pertensor", "kv_blockscale"],
                                         seqlens=[512], tokens=1024)))
    got = sorted((c["dtype"], c.get("qscale")) for c, _ in classes)
    assert got == [("bf16", None), ("fp8bf16", "kv_blockscale"), ("fp8bf16", "pertensor")]
    pts = {(c["dtype"], c.get("qscale")): p for c, p in classes}
    assert pts[("fp8bf16", "pertensor")] == [(1, 4096, 8, 32, 8), (512, 512, 2, 32, 8)]
    assert pts[("fp8bf16", "kv_blockscale")] == [(512, 512, 2, 32, 8)]
    keys = set()
    for c, p in classes:
        prob = problem_of(c, p[0], "sm90")
        assert prob.dtype == c["dtype"] and prob.qscale == c.get("qscale", "no")
        assert seqtune.class_key(seqtune.class_of_problem(prob)) == seqtune.class_key(c)
        keys.add(seqtune.class_key(c))
    assert len(keys) == 3


def test_an_fp8_points_inputs_are_e4m3_caches_with_descales_of_their_kind():
    """A tuned FP8 point runs over e4m3 caches with descales of 1 (the truth reads the e4m3 values as they are):
    one-element descales per tensor, ``[num_pages, Hk]`` ones for KV block scales, ``[Tq, Hq]`` and ``[num_pages,
    page_size, Hk]`` ones per token and head."""
    torch = pytest.importorskip("torch")
    from fmha_dsl.runtime.tune_inputs import PagedCall

    base = {"family": "batch_prefill", "dtype": "fp8bf16", "mode": "group", "vlayout": "r", "hdim_q": 32,
            "hdim_v": 32, "mask": "causal", "bias": "no", "lse": False, "dropout": False, "logits": False,
            "sink": False, "kv_layout": "linear", "kv_lookup": "vllm", "page_size": 4}
    pt = (3, 10, 2, 4, 2)                                    # 3 pages a sequence, 2 sequences, one spare page
    for qscale, qs, kv in (("pertensor", (1,), (1,)), ("kv_blockscale", (1,), (7, 2)),
                           ("per_token_head", (6, 4), (7, 4, 2))):
        call = PagedCall(dict(base, qscale=qscale), pt, device="cpu")
        assert call.q.dtype == call.k_cache.dtype == call.v_cache.dtype == torch.float8_e4m3fn
        assert call.out.dtype == torch.bfloat16
        q_d, k_d, v_d = call.kw["descales"]
        assert tuple(q_d.shape) == qs and tuple(k_d.shape) == tuple(v_d.shape) == kv
        assert all(bool((d == 1).all()) for d in (q_d, k_d, v_d))
        assert call.truth().shape == (2, 4, 3, 32)


def test_fp8_decode_bandwidth_counts_one_byte_an_element():
    from fmha_dsl.report_model import point_gbps

    point = {"seqlen_q": 1, "seqlen_k": 4096, "batch": 8, "nhead_q": 32, "nhead_k": 8}
    cls = {"hdim_q": 128, "hdim_v": 128}
    bf16 = point_gbps(dict(cls, dtype="bf16"), point, 100.0)
    assert bf16 == pytest.approx(8 * 4096 * 8 * 256 * 2 / 100e-6 / 1e9)
    assert point_gbps(dict(cls, dtype="fp8bf16", qscale="pertensor"), point, 100.0) == pytest.approx(bf16 / 2)


def test_the_default_matrix_ships_serving_classes_and_a_build_without_them_skips_them():
    classes = expand_shapes(load_shapes())
    serving = [(c, p) for c, p in classes if c["family"] == "batch_prefill"]
    assert len(serving) == 24 and {c["kv_layout"] for c, _ in serving} == {"linear"}
    assert {(c["page_size"], c["kv_lookup"]) for c, _ in serving} == {(p, lk) for p in (1, 16, 1024)
                                                                      for lk in ("vllm", "sglang")}
    for c, pts in serving:
        assert len(pts) == 16 and any(sq == 1 and sk == 131072 for sq, sk, *_ in pts)
        assert any(sq == sk for sq, sk, *_ in pts) and all(sk >= sq for sq, sk, *_ in pts)
    # a forward build has no candidate for them (tune skips them); the serving set has both kernels per class
    fwd = Dispatcher(fmha_dsl.loads("""kernel_set f { backend(triton) arch(sm90) dtype(bf16) hdim(128)
        kernel k { signature { family(fwd) mode(batch) mask(no | causal) } algorithm { pipeline(qr_async)
        tile(128, 64, 128, 128, 64, 128) wave_m0(8) padding(true, true, true, true) } } }""").registry(arch="sm90"),
                     "sm90", tuned_dir="")
    serv = Dispatcher(_built(), "sm90", tuned_dir="")
    for c, pts in serving:
        if c["dtype"] == "bf16" and c["mask"] == "causal" and c["page_size"] in (16, 1024):
            assert len(serv.candidates(problem_of(c, pts[0], "sm90"))) == 2
        assert all(not fwd.candidates(problem_of(c, pt, "sm90")) for pt in pts)


# ---------------------------------------------------------------------------------------------------------
# class keys and ranking
# ---------------------------------------------------------------------------------------------------------
def _paged_problem(pt=DECODE, page=16, lookup="vllm", layout="linear"):
    """The problem fmha_dsl.paged_attention builds (fmha_dsl/paged.py, _problem) for a causal bf16 d128 call."""
    sq, sk, b, hq, hk = pt
    return Problem(family="batch_prefill", dtype="bf16", arch="sm90", batch=b, nhead_q=hq, nhead_k=hk, seqlen_q=sq,
                   seqlen_k=sk, max_seqlen_q=sq, max_seqlen_k=sk, hdim_q=128, hdim_v=128, mode="group",
                   mask="bottom_right", window_left=-1, window_right=0, paged_kv=True, kv_layout=layout,
                   kv_lookup=lookup, page_size=page)


def test_paged_problems_carry_the_cache_in_their_class():
    base = seqtune.class_of_problem(_paged_problem())
    assert (base["kv_layout"], base["kv_lookup"], base["page_size"]) == ("linear", "vllm", 16)
    others = [_paged_problem(page=1024), _paged_problem(lookup="sglang"), _paged_problem(layout="vectorized")]
    keys = {seqtune.class_key(seqtune.class_of_problem(p)) for p in others}
    assert len(keys) == 3 and seqtune.class_key(base) not in keys
    fwd = seqtune.class_of_problem(Problem(dtype="bf16", seqlen_q=512, seqlen_k=512))
    assert not set(seqtune.PAGED_FIELDS) & set(fwd)       # other classes (and their stored tables) unchanged
    assert seqtune.class_key(fwd) == tuple(fwd[f] for f in seqtune.CLASS_FIELDS) + (None, None, None, None)


def _built() -> Registry:
    """SET's kernels as a build would record them (a split kernel with its combine: it also serves batch_prefill)."""
    reg = fmha_dsl.loads(SET).registry(arch="sm90")
    out = []
    for e in reg:
        build = {"backend": "triton"}
        if e.sig["family"] == "fwd_pagedkv":
            build.update(combine={"name": "fmha_combine"}, splits=16)
        out.append(Entry(None, e.name, e.source, build, sig=e.sig, alg=e.alg, arch=e.arch, ident=e.identifier))
    return Registry("serving-test", out)


def _tuned_registry(tmp_path) -> str:
    """A registry file with a hand-written serving table (page 16, vLLM): the split kernel wins decode, the prefill
    kernel prefill."""
    reg = _built()
    cls = seqtune.class_of_problem(_paged_problem())
    ids = {e.sig["family"]: e.identifier for e in reg if e.sig["page_size"] == 16 and e.sig["kv_lookup"] == "vllm"}
    table = seqtune.Table(DEV, "serving-test")
    for pt, prefill_us, split_us in ((DECODE, 200.0, 50.0), (PREFILL, 900.0, 3000.0)):
        table.record(cls, pt, ids["batch_prefill"], prefill_us)
        table.record(cls, pt, ids["fwd_pagedkv"], split_us)
    table.store(reg)
    path = tmp_path / "registry.json"
    reg.save(path)
    return str(path)


def test_a_serving_table_ranks_paged_attention_candidates_and_only_for_its_cache(tmp_path):
    path = _tuned_registry(tmp_path)
    back = Registry.load(path)                          # the schema takes the serving class's fields
    assert back.seqtune["classes"][0]["class"]["page_size"] == 16
    disp = Dispatcher(path, "sm90", device_name=DEV["name"], tuned_dir="")
    assert disp.table is not None and disp.ranking
    for pt, family in ((DECODE, "fwd_pagedkv"), (PREFILL, "batch_prefill")):
        p = _paged_problem(pt)
        rows = disp.explain(p)
        assert rows[0]["selected"] and rows[0]["source"] == "seqtune" and rows[0]["measured_us"] is not None
        assert disp.select(p).sig["family"] == family
        plan = disp.plan(p)
        assert type(plan).__name__ == "PagedPlan" and plan.entry.sig["family"] == family
        assert len(plan.stages) == (2 if family == "fwd_pagedkv" else 1)    # the split kernel with its combine
    # another page size or lookup: the same kernels' times are not theirs -- the cost model ranks
    for p in (_paged_problem(page=1024), _paged_problem(lookup="sglang")):
        rows = [r for r in disp.explain(p) if not r.get("excluded")]
        assert len(rows) == 2 and all(r["source"] == "cost-model" for r in rows)


# ---------------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------------
FP8_SET = """kernel_set f { backend(triton) arch(sm90) dtype(fp8bf16) hdim(128)
  kernel p { signature { family(batch_prefill) qscale(pertensor | kv_blockscale) mask(causal)
                         kv_cache(linear, vllm, 16) }
             algorithm { pipeline(qr_nwarp_sshuffle) tile(64 | 128, 64, *, *, *, *) wave(4, *, *, *, *, *, *, *, *) } }
}"""


def test_an_fp8_table_ranks_only_its_descale_kind(tmp_path):
    """A registry with a table of an FP8 KV block-scale class loads (the schema takes its qscale) and ranks that
    class's kernels by it; per-tensor problems over the same cache keep the cost model's ranking."""
    reg = fmha_dsl.loads(FP8_SET).registry(arch="sm90")
    blocks = [e for e in reg if e.sig["qscale"] == "kv_blockscale"]
    assert len(blocks) == 2 and len(reg) == 4
    prob = _paged_problem(PREFILL).model_copy(update={"dtype": "fp8bf16", "qscale": "kv_blockscale"})
    cls = seqtune.class_of_problem(prob)
    assert cls["qscale"] == "kv_blockscale"
    table = seqtune.Table(DEV, "fp8-test")
    fast, slow = sorted(blocks, key=lambda e: e.alg["tile"][0])     # the 64-row tile measured fastest (not the
    assert Dispatcher(reg, "sm90", tuned_dir="").explain(prob)[0]["kernel"] == slow.identifier   # static choice)
    table.record(cls, PREFILL, slow.identifier, 900.0)
    table.record(cls, PREFILL, fast.identifier, 600.0)
    table.store(reg)
    path = tmp_path / "registry.json"
    reg.save(path)
    back = Registry.load(path)
    assert back.seqtune["classes"][0]["class"]["qscale"] == "kv_blockscale"
    disp = Dispatcher(str(path), "sm90", device_name=DEV["name"], tuned_dir="")
    rows = disp.explain(prob)
    assert rows[0]["source"] == "seqtune" and rows[0]["kernel"] == fast.identifier
    assert {r["kernel"] for r in rows if not r.get("excluded")} == {e.identifier for e in blocks}
    assert all("qscale" in r["why"][0] for r in rows if r.get("excluded"))    # the per-tensor kernels: not its kind
    per_tensor = disp.explain(prob.model_copy(update={"qscale": "pertensor"}))
    assert per_tensor and all(r.get("source") != "seqtune" for r in per_tensor)
    assert {r["kernel"] for r in per_tensor if not r.get("excluded")} == {e.identifier for e in reg} - {
        e.identifier for e in blocks}


def test_the_report_draws_a_serving_table(tmp_path):
    from fmha_dsl import report

    path = _tuned_registry(tmp_path)
    out = tmp_path / "r.html"
    assert report.write_report(path, str(out), png=True, png_backend_name="builtin") == [str(out),
                                                                                         str(tmp_path / "r.png")]
    text = out.read_text()
    assert "batch_prefill bf16 group d128/128 mask=causal page_size=16 lookup=vllm kv_layout=linear" in text
    assert "K/V GB/s" in text and "effective K/V bandwidth" in text and "TFLOP/s" in text
    cls = seqtune.class_of_problem(_paged_problem())
    pt = dict(zip(seqtune.POINT_FIELDS, DECODE))
    # 16 x 8192 x 8 heads x 256 dims x 2 bytes in 50 us
    assert report.point_value(cls, pt, 50.0) == (pytest.approx(16 * 8192 * 8 * 256 * 2 / 50e-6 / 1e9), "GB/s")
    assert report.point_value(cls, dict(zip(seqtune.POINT_FIELDS, PREFILL)), 900.0)[1] == "TFLOP/s"
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_tune_progress_names_the_cache_and_skips_classes_without_kernels(tmp_path, capsys, monkeypatch):
    from fmha_dsl import cli
    from fmha_dsl.runtime import tune as tune_module

    cls = seqtune.class_of_problem(_paged_problem())
    fwd = seqtune.class_of_problem(Problem(dtype="bf16", seqlen_q=512, seqlen_k=512))

    def fake(build_dir, progress=None, **kw):
        progress({"event": "class", "cls": fwd, "class_index": 0, "classes": 2, "kernels": 0})
        progress({"event": "time", "cls": cls, "point": DECODE, "kernel": "k", "us": 5.0, "class_index": 1,
                  "classes": 2, "point_index": 0, "points": 1})
        progress({"event": "class", "cls": cls, "class_index": 1, "classes": 2, "kernels": 2})
        return tune_module.TuneResult(path=str(tmp_path / "registry.json"), measured=1, classes=2)

    monkeypatch.setattr(tune_module, "tune", fake)
    assert cli.main(["tune", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "[1/2]" not in err and "batch_prefill bf16 d128x128 causal page 16 vllm linear" in err
    assert "[2/2] batch_prefill bf16 d128x128 causal page 16 vllm linear: saved" in err


# ---------------------------------------------------------------------------------------------------------
# a point's inputs and truth, under Triton's interpreter
# ---------------------------------------------------------------------------------------------------------
INTERP = r'''
import fmha_dsl
from fmha_dsl.registry import Registry
from fmha_dsl.runtime.dispatch import Dispatcher
from fmha_dsl.runtime.tune import expand_shapes, problem_of
from fmha_dsl.runtime.tune_inputs import PagedCall, promise_kept

SET = """kernel_set t { backend(triton) arch(sm90) dtype(fp16) hdim(32)
  kernel p { signature { family(batch_prefill) mask(no | causal) kv_cache(linear, vllm | sglang, 4 | 16) }
             algorithm { pipeline(qr_async) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32) wave_m0(4)
                         padding(true, true, true, true) } }
  kernel d { signature { family(fwd_pagedkv) mask(no | causal) kv_cache(linear, vllm | sglang, 4 | 16) }
             algorithm { pipeline(qr_nwarp_sshuffle) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32)
                         wave_m0(4) padding(true, true, true, true) max_splits_log2(2) } }
  kernel pv { signature { family(batch_prefill) mask(no | causal) kv_cache(vectorized, vllm | sglang, 16) }
              algorithm { pipeline(qr_async) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32) wave_m0(4)
                          padding(true, true, true, true) } }
  kernel dv { signature { family(fwd_pagedkv) mask(no | causal) kv_cache(vectorized, vllm | sglang, 16) }
              algorithm { pipeline(qr_nwarp_sshuffle) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32)
                          wave_m0(4) padding(true, true, true, true) max_splits_log2(2) } }
}"""
reg = fmha_dsl.loads(SET).registry(arch="sm90")
disp = Dispatcher(reg, "sm90", launcher="interpret", tuned_dir="")
doc = {"classes": [
    {"family": "batch_prefill", "dtype": "fp16", "hdim": 32, "mask": ["no", "causal"], "page_size": [4, 16],
     "lookup": ["vllm", "sglang"], "nhead_q": 4, "nhead_k": 2, "seqlens": [24], "seqlens_k": [24, 40], "batch": [2]},
    {"family": "fwd_pagedkv", "dtype": "fp16", "hdim": 32, "mask": ["no", "causal"], "page_size": [4, 16],
     "lookup": ["vllm", "sglang"], "nhead_q": 4, "nhead_k": 2, "seqlens": [1], "seqlens_k": [37], "batch": [3]},
    {"family": "batch_prefill", "dtype": "fp16", "hdim": 32, "mask": ["no", "causal"], "page_size": 16,
     "kv_layout": "vectorized", "lookup": ["vllm", "sglang"], "nhead_q": 4, "nhead_k": 2, "seqlens": [24],
     "seqlens_k": [24, 40], "batch": [2]},
    {"family": "fwd_pagedkv", "dtype": "fp16", "hdim": 32, "mask": ["no", "causal"], "page_size": 16,
     "kv_layout": "vectorized", "lookup": ["vllm", "sglang"], "nhead_q": 4, "nhead_k": 2, "seqlens": [1],
     "seqlens_k": [37], "batch": [3]}]}
runs, scattered = 0, 0
for cls, pts in expand_shapes(doc):
    for pt in pts:
        prob = problem_of(cls, pt, "sm90")
        assert promise_kept(cls, pt)
        [prefill] = disp.candidates(prob)          # (a split kernel serves it once built with its combine)
        split = next(e for e in reg if e.sig["family"] == "fwd_pagedkv" and all(
            e.sig[f] == prefill.sig[f] for f in ("mask", "kv_layout", "kv_lookup", "page_size")))
        call = PagedCall(cls, pt, device="cpu")
        lookups = sorted(k for k in call.kw if k in ("block_table", "kv_indptr", "kv_indices"))
        assert lookups == (["block_table"] if cls["kv_lookup"] == "vllm" else ["kv_indices", "kv_indptr"])
        pages = call.pages.flatten().tolist()
        assert len(set(pages)) == len(pages)     # never shared
        scattered += pages != sorted(pages)
        for e in (prefill, split):
            plan = disp.plan_for(e, prob)
            call.out.zero_()
            call.runner(plan)()
            err = call.error()
            assert err < 2e-3, (cls["mask"], cls["kv_lookup"], cls["page_size"], pt, e.name, err)
            runs += 1
        call.out.zero_()
        assert call.error() > 0.5                  # the check sees a wrong output
assert scattered > 20, scattered
print("runs", runs)
'''


def test_a_serving_points_inputs_and_truth_under_the_interpreter():
    """Each serving point's inputs (scattered pages, both table forms, causal bottom-right) run through the prefill
    kernel and the split-KV plan (with its combine and workspace) under Triton's interpreter and match the truth the
    tuner checks against: SDPA on the K/V gathered from the cache."""
    run_interpreted(INTERP, "runs 72", timeout=600)
