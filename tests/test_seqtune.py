"""The seqtune table, its lookup, the cost model, the dispatcher's measured selection and CK's first-fit rule,
on synthetic timings (no GPU)."""

import json
import math
import random
import warnings

import pytest

from fmha_dsl import seqtune
from fmha_dsl.keys import Algorithm, KernelKey, Problem, Signature
from fmha_dsl.registry import Entry, Registry
from fmha_dsl.runtime.dispatch import Dispatcher

CLS = {"family": "fwd", "dtype": "fp16", "mode": "batch", "vlayout": "r", "hdim_q": 128, "hdim_v": 128,
       "mask": "no", "bias": "no", "lse": False, "dropout": False, "logits": False, "sink": False}
DEV = {"name": "NVIDIA H100 80GB HBM3", "arch": "sm90", "compute_units": 132, "driver": "1", "triton": "3",
       "torch": "2"}


def key(tile=(128, 64), pads=(1, 1, 1, 1), dtype="fp16", mask="no", rank=0, pipeline="qr_async", warps=4):
    sig = Signature(family="fwd", dtype=dtype, mode="batch", hdim_q=128, hdim_v=128, mask=mask)
    m0, n0 = tile
    alg = Algorithm(pipeline=pipeline, tile=(m0, n0, 128, 128, n0, 128), wave=(warps, 1, 1, warps, 1, 1, 1, 1, 1),
                    pad_s=pads[0], pad_sk=pads[1], pad_d=pads[2], pad_dv=pads[3], selection_rank=rank)
    return KernelKey(signature=sig, algorithm=alg, arch="sm90")


def entry(name, build=None, **kw):
    return Entry(key(**kw), name, f"t.fmha:{name}", build)


def problem(sq=512, sk=None, b=1, hq=16, hk=None, **kw):
    return Problem(dtype="fp16", hdim_q=128, hdim_v=128, seqlen_q=sq, seqlen_k=sq if sk is None else sk, batch=b,
                   nhead_q=hq, nhead_k=hq if hk is None else hk, **kw)


# ---------------------------------------------------------------------------------------------------------
# format
# ---------------------------------------------------------------------------------------------------------
def _table(order):
    t = seqtune.Table(DEV, "default")
    rows = [((s, s, 16384 // s, 16, 16), kid, float(s) / 7 + i) for s in (128, 512, 2048) for i, kid in
            enumerate(("kA", "kB", "kC"))]
    rows.append(((512, 512, 32, 16, 16), "kD", None))
    random.Random(order).shuffle(rows)
    for pt, kid, us in rows:
        if us is None:
            t.record(CLS, pt, kid, failed="wrong result")
        else:
            t.record(CLS, pt, kid, us)
    t.record(dict(CLS, mask="causal"), (128, 128, 1, 16, 16), "kA", 1.5)
    return t


def _registry_with_table():
    """A registry of four kernels with :func:`_table`'s measurements, named by their identifiers (as a table names
    kernels: a saved table keeps only its registry's kernels)."""
    kernels = [entry(n, tile=t) for n, t in (("k0", (128, 64)), ("k1", (64, 64)), ("k2", (128, 128)), ("k3", (64, 32)))]
    reg = Registry("r", kernels)
    ids = dict(zip(("kA", "kB", "kC", "kD"), (e.identifier for e in kernels)))
    _table(0).store(reg)
    for c in reg.seqtune["classes"]:
        for p in c["points"]:
            for part in ("times_us", "failed"):
                if part in p:
                    p[part] = {ids[k]: v for k, v in p[part].items()}
    return reg


def test_table_json_is_deterministic_and_round_trips(tmp_path):
    texts = {_table(seed).to_json() for seed in range(5)}
    assert len(texts) == 1
    d = json.loads(texts.pop())
    assert [c["class"]["mask"] for c in d["classes"]] == ["causal", "no"]      # sorted by the class dict
    pts = d["classes"][1]["points"]
    assert [(p["seqlen_q"], p["batch"]) for p in pts] == [(128, 128), (512, 32), (2048, 8)]
    assert pts[1]["failed"] == {"kD": "wrong result"} and "failed" not in pts[0]
    assert seqtune.Table.from_dict(d).to_dict() == d

    reg = _registry_with_table()
    reg.save(tmp_path / "registry.json")
    text = (tmp_path / "registry.json").read_text()
    assert json.loads(text)["schema_version"] == 2
    back = Registry.load(tmp_path / "registry.json")
    assert back.seqtune == reg.seqtune
    back.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text
    # a registry without a table stays version 1, byte for byte
    plain = Registry("r", [entry("k0")])
    plain.save(tmp_path / "v1.json")
    assert json.loads((tmp_path / "v1.json").read_text())["schema_version"] == 1
    assert Registry.load(tmp_path / "v1.json").seqtune is None


def test_schema_rejects_a_bad_table(tmp_path):
    from fmha_dsl.errors import RegistryError

    reg = _registry_with_table()
    doc = json.loads(reg.to_json())
    pt = doc["seqtune"]["classes"][0]["points"][0]["times_us"]
    pt[next(iter(pt))] = "fast"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(RegistryError):
        Registry.load(tmp_path / "bad.json")
    doc = json.loads(reg.to_json())
    doc["schema_version"] = 1
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    with pytest.raises(RegistryError, match="schema_version 2"):
        Registry.load(tmp_path / "v1.json")


def test_merge_is_incremental_and_resumable():
    a = seqtune.Table(DEV)
    a.record(CLS, (512, 512, 1, 16, 16), "kA", 10.0)
    b = seqtune.Table(DEV)
    b.record(CLS, (512, 512, 1, 16, 16), "kB", 12.0)
    b.record(CLS, (1024, 1024, 1, 16, 16), "kA", 30.0)
    a.merge(b)
    assert a.has(CLS, (512, 512, 1, 16, 16), "kA") and a.has(CLS, (512, 512, 1, 16, 16), "kB")
    assert a.has(CLS, (1024, 1024, 1, 16, 16), "kA") and not a.has(CLS, (1024, 1024, 1, 16, 16), "kB")
    assert len(a) == 2
    c = seqtune.Table(DEV)
    c.record(CLS, (512, 512, 1, 16, 16), "kA", failed="crashed")
    a.merge(c)
    assert a.failed(CLS, "kA") == "crashed"
    assert "kA" not in a.points(CLS)[(512, 512, 1, 16, 16)]["times_us"]


# ---------------------------------------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------------------------------------
def _pts(*rows):
    t = seqtune.Table(DEV)
    for pt, us in rows:
        t.record(CLS, pt, "k", us)
    return t.points(CLS)


def test_interpolation_in_log_seqlen():
    pts = _pts(((512, 512, 1, 16, 16), 100.0), ((2048, 2048, 1, 16, 16), 1600.0))
    # power law between the neighbours: 100 * (1024/512)^2 = 400; 100 * (768/512)^2 = 225
    t, used = seqtune.predict(pts, "k", 128, 64, problem(1024), cus=10_000)
    assert t == pytest.approx(400.0) and [u[0] for u in used] == [512, 2048]
    assert seqtune.predict(pts, "k", 128, 64, problem(768), cus=10_000)[0] == pytest.approx(225.0)
    assert seqtune.predict(pts, "k", 128, 64, problem(512), cus=10_000)[0] == pytest.approx(100.0)
    # outside the range: the nearest point, scaled by waves and key blocks (1 wave here; 256/64 vs 512/64 blocks)
    assert seqtune.predict(pts, "k", 128, 64, problem(256), cus=10_000)[0] == pytest.approx(50.0)
    assert seqtune.predict(pts, "k", 128, 64, problem(4096), cus=10_000)[0] == pytest.approx(1600.0 * 2)
    assert seqtune.predict(pts, "nobody", 128, 64, problem(1024), cus=10_000) == (None, [])


def test_interpolation_on_a_decode_grid_uses_the_rows_around_the_problem():
    """Rows of equal seqlen_q: first along seqlen_k inside a row, then across rows (both power laws in log)."""
    pts = _pts(((64, 1024, 1, 16, 16), 100.0), ((64, 4096, 1, 16, 16), 400.0),
               ((256, 1024, 1, 16, 16), 1000.0), ((256, 4096, 1, 16, 16), 4000.0),
               ((128, 128, 1, 16, 16), 1.0))  # a square point nearby must not be used for sq=64 or 256 problems
    t, used = seqtune.predict(pts, "k", 128, 64, problem(64, 2048), cus=10_000)
    assert t == pytest.approx(200.0) and sorted(used) == [(64, 1024, 1, 16, 16), (64, 4096, 1, 16, 16)]
    # between the rows 64 and 256 at seqlen_q 128: the row 128 is a single point (128, 128), carried to 2048 keys
    # (x 32/2 key blocks = 16) -- the measured row wins over the rows around it
    t, used = seqtune.predict(pts, "k", 128, 64, problem(128, 2048), cus=10_000)
    assert t == pytest.approx(16.0) and used == [(128, 128, 1, 16, 16)]
    # no row at 160: interpolate between rows 128 and 256 in log(seqlen_q)
    t, _ = seqtune.predict(pts, "k", 128, 64, problem(160, 2048), cus=10_000)
    w = math.log(160 / 128) / math.log(256 / 128)
    assert t == pytest.approx(math.exp((1 - w) * math.log(16.0) + w * math.log(2000.0)))


def test_wave_quantisation_scales_batch_times_heads():
    # m0 128 at seqlen 512: 4 programs per (batch, head); 33 heads x 1 batch = 132 programs = one wave on 132 SMs
    pts = _pts(((512, 512, 1, 33, 33), 100.0))
    assert seqtune.predict(pts, "k", 128, 64, problem(512, b=1, hq=33), cus=132)[0] == pytest.approx(100.0)
    assert seqtune.predict(pts, "k", 128, 64, problem(512, b=2, hq=33), cus=132)[0] == pytest.approx(200.0)
    assert seqtune.predict(pts, "k", 128, 64, problem(512, b=1, hq=34), cus=132)[0] == pytest.approx(200.0)
    assert seqtune.predict(pts, "k", 128, 64, problem(512, b=1, hq=11), cus=132)[0] == pytest.approx(100.0)
    assert seqtune.waves(133, 132) == 2 and seqtune.programs(100, 64, 2, 3) == 12


def test_buckets():
    assert [seqtune.bucket(n) for n in (15, 16, 17, 18, 512, 576, 1024)] == [15, 16, 16, 17, 56, 57, 64]
    for n in range(1, 5000):
        b = seqtune.bucket(n)
        assert seqtune.bucket_rep(b) <= n and seqtune.bucket(seqtune.bucket_rep(b)) == b
    assert seqtune.bucket_rep(seqtune.bucket(4096)) == 4096


def test_cost_model_on_hand_checked_cases():
    small, big = entry("m64", tile=(64, 64)), entry("m128", tile=(128, 64), warps=8)
    # seqlen 100, one head: one wave either way; m0 128 pads 100 -> 128 rows and does twice the work per program
    c64, d64 = seqtune.cost(small, problem(100, b=1, hq=1), "sm90", 132)
    c128, d128 = seqtune.cost(big, problem(100, b=1, hq=1), "sm90", 132)
    assert c64 < c128 and d64["tile_waste_q"] == pytest.approx(128 / 100) and d128["programs"] == 1
    # 16k x 8 x 16: many waves; the larger tile's reuse wins (249 x 64 / 0.667 vs 125 x 128 / 0.727)
    c64, d64 = seqtune.cost(small, problem(16384, b=8, hq=16), "sm90", 132)
    c128, d128 = seqtune.cost(big, problem(16384, b=8, hq=16), "sm90", 132)
    assert (d64["rounds"], d128["rounds"]) == (249, 125) and c128 < c64
    assert c64 / c128 == pytest.approx((249 * 64 / (4096 / 6144)) / (125 * 128 / (8192 / 11264)))
    # the same tile on 4 warps: 64 fp32 scores a thread, 32 past SCORE_REGS: 1.25x with pointer loads, 1.1x with TMA
    for pipeline, more in (("qr_async", 1.25), ("qr_async_trload", 1.10)):
        one, two = (entry("w", tile=(128, 64), warps=w, pipeline=pipeline) for w in (8, 4))
        p = problem(16384, b=8, hq=16)
        assert seqtune.cost(two, p, "sm90", 132)[0] / seqtune.cost(one, p, "sm90", 132)[0] == pytest.approx(more)
        assert seqtune.cost(two, p, "sm80", 132)[0] == seqtune.cost(one, p, "sm80", 132)[0]   # fitted on wgmma only
    # a partial last wave costs a full one: 133 programs take two rounds on 132 SMs
    assert seqtune.cost(big, problem(128, b=133, hq=1), "sm90", 132)[1]["rounds"] == 2
    # occupancy from the build: 64 regs x 128 threads -> 8 by registers, 16 by threads, by shared 232448 // 40000
    e = entry("occ", build={"num_warps": 4, "warp_size": 32, "shared": 40000, "resources": {"regs": 64}})
    assert seqtune.occupancy(e, "sm90") == 5
    assert seqtune.occupancy(entry("none"), "sm90") == 1
    assert seqtune.occupancy(entry("amd", build={"num_warps": 4, "resources": {"occupancy": 2}}), "gfx942") == 2


def test_ck_first_fit_reference_example():
    m64, m128 = entry("m64", tile=(64, 64)), entry("m128", tile=(128, 64))
    assert seqtune.ck_first_fit(problem(100), [m128, m64]).name == "m64"          # category 1 beats 2
    u64, u128 = entry("u64", tile=(64, 64), pads=(0, 0, 1, 1)), entry("u128", tile=(128, 64), pads=(0, 0, 1, 1))
    assert seqtune.ck_first_fit(problem(128), [u64, u128]).name == "u128"         # max_sq == m0: category 0
    assert seqtune.ck_first_fit(problem(100), []) is None


# ---------------------------------------------------------------------------------------------------------
# the dispatcher
# ---------------------------------------------------------------------------------------------------------
def _crossing_registry(device=DEV):
    reg = Registry("x", [entry("small", tile=(64, 64)), entry("large", tile=(128, 128)),
                         entry("bf16", dtype="bf16")])
    t = seqtune.Table(device)
    ids = {e.name: e.identifier for e in reg}
    for s, a, b in ((512, 100.0, 150.0), (1024, 300.0, 320.0), (2048, 1100.0, 900.0), (4096, 4000.0, 3000.0)):
        t.record(CLS, (s, s, 1, 16, 16), ids["small"], a)
        t.record(CLS, (s, s, 1, 16, 16), ids["large"], b)
    t.store(reg)
    return reg


def test_dispatcher_selection_flips_at_the_measured_crossover():
    reg = _crossing_registry()
    d = Dispatcher(reg, arch="sm90", device_name=DEV["name"])
    assert d.table is not None and d.ranking and d.table_note is None
    picks = {s: d.plan(problem(s)).entry.name for s in (512, 1024, 1536, 2048, 4096, 300, 16384)}
    assert picks == {512: "small", 1024: "small", 1536: "large", 2048: "large", 4096: "large", 300: "small",
                     16384: "large"}
    # static order alone would have taken the larger tile everywhere
    assert [e.name for e in d.candidates(problem(512))] == ["large", "small"]
    # cached per bucket: a second call is a dict hit returning the same plan
    assert d.plan(problem(512)) is d.plan(problem(512))
    assert d.class_key(problem(512)) != d.class_key(problem(2048))


def test_explain_lists_ranked_candidates_and_exclusions():
    d = Dispatcher(_crossing_registry(), arch="sm90", device_name=DEV["name"])
    rows = d.explain(problem(1024))
    ranked = [r for r in rows if not r.get("excluded")]
    assert [r["name"] for r in ranked] == ["small", "large"]
    assert ranked[0]["selected"] and ranked[0]["rank"] == 0 and ranked[0]["source"] == "seqtune"
    assert ranked[0]["measured_us"] == 300.0 and ranked[0]["predicted_us"] == pytest.approx(300.0)
    mid = [r for r in d.explain(problem(1448)) if not r.get("excluded")]
    assert mid[0]["measured_us"] is None and len(mid[0]["points"]) == 2
    ex = [r for r in rows if r.get("excluded")]
    assert [r["name"] for r in ex] == ["bf16"] and any("dtype" in w for w in ex[0]["why"])


def test_a_table_of_another_device_is_ignored_with_a_warning():
    reg = _crossing_registry(dict(DEV, name="NVIDIA A100-SXM4-80GB", arch="sm80"))
    with pytest.warns(seqtune.SeqtuneDeviceWarning, match="sm80"):
        d = Dispatcher(reg, arch="sm90", device_name=DEV["name"])
    assert d.table is None and "sm80" in d.table_note
    reg = _crossing_registry(dict(DEV, name="NVIDIA H200"))
    with pytest.warns(seqtune.SeqtuneDeviceWarning, match="H200"):
        d = Dispatcher(reg, arch="sm90", device_name=DEV["name"])
    assert d.table is None
    assert d.plan(problem(512)).entry.name == "large"   # static order (no builds, no table)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Dispatcher(_crossing_registry(), arch="sm90", device_name=DEV["name"]).table is not None


def test_failed_kernels_are_excluded_and_unmeasured_ones_ranked_after():
    reg = _crossing_registry()
    t = seqtune.Table.of(reg)
    ids = {e.name: e.identifier for e in reg}
    t.record(CLS, (512, 512, 1, 16, 16), ids["small"], failed="wrong result")
    t.store(reg)
    d = Dispatcher(reg, arch="sm90", device_name=DEV["name"])
    assert d.plan(problem(512)).entry.name == "large"
    rows = d.explain(problem(512))
    assert any(r.get("excluded") and r["name"] == "small" and "wrong result" in r["why"][0] for r in rows)
    reg.add(entry("new", tile=(64, 32)))
    d = Dispatcher(reg, arch="sm90", device_name=DEV["name"])
    r = d.ranked(problem(512))
    assert [x["entry"].name for x in r] == ["large", "new"] and r[1]["source"] == "static"


def test_cost_model_selects_without_a_table():
    b = {"num_warps": 4, "warp_size": 32, "shared": 65536, "resources": {"regs": 128}}
    reg = Registry("c", [entry("small", build=dict(b), tile=(64, 64)),
                         entry("large", build=dict(b, num_warps=8, resources={"regs": 64}), tile=(128, 64), warps=8)])
    d = Dispatcher(reg, arch="sm90")
    assert d.table is None and d.ranking
    assert d.plan(problem(100, b=1, hq=1)).entry.name == "small"
    assert d.plan(problem(16384, b=8, hq=16)).entry.name == "large"
    rows = d.explain(problem(100, b=1, hq=1))
    assert rows[0]["source"] == "cost-model" and "rounds" in rows[0]["cost_detail"] and math.isfinite(rows[0]["cost"])


@pytest.mark.parametrize("cls,msg", [
    ({}, "`seqlens` is missing"),
    ({"seqlens": [0]}, "`seqlens` must be a positive integer"),
    ({"seqlens": ["512"]}, "`seqlens` must be a positive integer"),
    ({"seqlens": [512], "hdim": "128"}, "`hdim` must be a positive integer"),
    ({"seqlens": [512], "dtype": "fp8"}, "unknown dtype"),
    ({"seqlens": [512], "mask": "sliding"}, "unknown mask"),
    (3, "a class is an object"),
])
def test_bad_shape_matrix_is_a_located_usage_error(tmp_path, cls, msg):
    """A bad --shapes file is reported (before any GPU work) naming the class and field, never a raw exception."""
    import json as _json

    from fmha_dsl import UsageError
    from fmha_dsl.runtime.tune import load_shapes

    p = tmp_path / "m.json"
    p.write_text(_json.dumps({"classes": [cls]}))
    with pytest.raises(UsageError) as info:
        load_shapes(str(p))
    assert info.value.rule == "usage.file" and "classes[0]" in info.value.message and msg in info.value.message
    assert info.value.hint


def test_shape_matrix_mask_none_means_no_mask():
    from fmha_dsl.runtime.tune import expand_shapes

    [(cls, pts)] = expand_shapes({"classes": [{"seqlens": [512], "mask": "none", "dtype": "fp16"}]})
    assert cls["mask"] == "no" and pts == [(512, 512, 32, 16, 16)]


def test_shape_matrix_seqlens_k_gives_decode_and_chunked_prefill_points():
    from fmha_dsl.runtime.tune import expand_shapes

    doc = {"classes": [{"seqlens": [1, 64], "seqlens_k": [1024, 4096], "batch": [2], "dtype": "fp16"},
                       {"seqlens": [256], "seqlens_k": [8192], "tokens": 16384, "dtype": "fp16"}]}
    [(cls, pts)] = expand_shapes(doc)
    # batch from tokens uses the longer of the two lengths: 16384 // 8192 = 2
    assert pts == [(1, 1024, 2, 16, 16), (1, 4096, 2, 16, 16), (64, 1024, 2, 16, 16), (64, 4096, 2, 16, 16),
                   (256, 8192, 2, 16, 16)]
    from fmha_dsl import UsageError

    with pytest.raises(UsageError, match="not both"):
        expand_shapes({"classes": [{"seqlens": [1], "seqlens_k": [8], "seqlen_k_ratio": 2}]})


def test_shipped_matrix_has_prefill_and_decode_points():
    from fmha_dsl.runtime.tune import expand_shapes, load_shapes

    pts = {pt for _, p in expand_shapes(load_shapes()) for pt in p}
    assert any(sq == sk for sq, sk, *_ in pts) and any(sq == 1 and sk >= 4096 for sq, sk, *_ in pts)


def test_yaml_shape_matrix_equals_its_json_twin(tmp_path):
    """The same matrix written as YAML (ck_fmha_testing_matrix.yaml's style) and as JSON expands identically."""
    yaml = pytest.importorskip("yaml")
    import json as _json

    from fmha_dsl.runtime.tune import expand_shapes, load_shapes

    text = ("# decode tier\nname: decode\nclasses:\n"
            "  - dtype: [bf16, fp16]\n    hdim: [64, [192, 128]]\n    mask: [no, causal]\n"
            "    nhead_q: 32\n    nhead_k: 8\n    seqlens: [1, 16]\n    seqlens_k: [2048]\n    batch: [4]\n")
    (tmp_path / "m.yaml").write_text(text)
    (tmp_path / "m.json").write_text(_json.dumps(yaml.safe_load(text)))
    a, b = load_shapes(str(tmp_path / "m.yaml")), load_shapes(str(tmp_path / "m.json"))
    assert a["name"] == "decode" and expand_shapes(a) == expand_shapes(b)
    classes = expand_shapes(a)
    # YAML's bare `no` is the boolean false: it still means "no mask"
    assert sorted({c["mask"] for c, _ in classes}) == ["causal", "no"]
    assert {(c["hdim_q"], c["hdim_v"]) for c, _ in classes} == {(64, 64), (192, 128)}
    assert all(p == [(1, 2048, 4, 32, 8), (16, 2048, 4, 32, 8)] for _, p in classes)


def test_bad_yaml_matrix_is_a_located_usage_error(tmp_path):
    pytest.importorskip("yaml")
    from fmha_dsl import UsageError
    from fmha_dsl.runtime.tune import load_shapes

    p = tmp_path / "m.yml"
    p.write_text("classes:\n  - seqlens: [1, 2\n")
    with pytest.raises(UsageError) as info:
        load_shapes(str(p))
    assert "not valid YAML" in info.value.message and info.value.hint
    p.write_text("classes:\n  - seqlens: [0]\n")
    with pytest.raises(UsageError, match=r"classes\[0\]: `seqlens` must be a positive integer"):
        load_shapes(str(p))


@pytest.mark.parametrize("doc,msg", [
    ('{"classes": [{"seqlens": [1]', "not valid JSON"),
    ('{"shapes": []}', "a shape matrix is an object with a `classes` list"),
    ('{"classes": [{"seqlens": [1], "seqlen": [2]}]}', "unknown field `seqlen`"),
    ('{"classes": [{"seqlens": [1], "lse": "false"}]}', "`lse` must be true/false"),
    ('{"classes": [{"seqlens": [1], "nhead_q": 16, "nhead_k": 3}]}', "must be a multiple of `nhead_k`"),
    ('{"classes": [{"seqlens": [1], "seqlen_k_ratio": 0}]}', "`seqlen_k_ratio` must be a positive number"),
])
def test_more_bad_shape_matrices(tmp_path, doc, msg):
    from fmha_dsl import UsageError
    from fmha_dsl.runtime.tune import load_shapes

    p = tmp_path / "m.json"
    p.write_text(doc)
    with pytest.raises(UsageError) as info:
        load_shapes(str(p))
    assert msg in info.value.message and info.value.hint


def test_tune_cli_reports_a_bad_matrix_before_touching_the_gpu(tmp_path):
    """Exit 2 with the located message and a hint -- also where torch is not installed (CI).  Run outside the
    source tree, so the installed package (with fmha_dsl.runtime) is the one imported."""
    import subprocess
    import sys

    (tmp_path / "m.json").write_text('{"classes": [{"seqlens": [0]}]}')
    out = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "tune", str(tmp_path), "--shapes",
                          str(tmp_path / "m.json")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "classes[0]: `seqlens` must be a positive integer" in out.stderr and "help:" in out.stderr
    out = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "tune", str(tmp_path), "--shapes",
                          str(tmp_path / "nope.json")], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 2 and "cannot read the shape matrix" in out.stderr and "help:" in out.stderr


def test_explain_of_a_ck_registry_with_one_dimensional_kernels():
    """Kernels with no tile (the split-KV combine, dot_do_o, convert_dq: tile 0) are excluded by their family, not a
    ZeroDivisionError (session 44's review)."""
    import fmha_dsl

    src = """kernel_set s {
        arch(gfx942)
        kernel f { signature { family(fwd_splitkv | fwd_splitkv_combine) dtype(bf16) hdim(128) mode(batch) }
                   algorithm { padding(*) } }
        kernel b { signature { family(bwd_dot_do_o | bwd_convert_dq) dtype(bf16) hdim(128) mode(batch) }
                   algorithm { padding(*) } }
    }"""
    reg = fmha_dsl.loads(src).registry()
    assert {e.family for e in reg} >= {"fwd_splitkv_combine", "bwd_dot_do_o", "bwd_convert_dq"}
    d = Dispatcher(reg, arch="gfx942", launcher="interpret")
    rows = d.explain(Problem(dtype="bf16", batch=2, nhead_q=8, nhead_k=8, seqlen_q=1000, seqlen_k=1000,
                             hdim_q=128, hdim_v=128))
    one_d = [r for r in rows if "combine" in r["name"] or "dot_do_o" in r["name"] or "convert_dq" in r["name"]]
    assert one_d and all(r["excluded"] and any(w.startswith("family") for w in r["why"]) for r in one_d)
