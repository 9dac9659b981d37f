"""Split-KV in the Triton backend (docs/triton.md "Split-KV"): the family's rules, its build (split kernel +
shared combine kernel), matching (a built split kernel also serves plain forward problems), the split count a
launch uses, and how prediction and the cost model count split programs.  The kernels themselves are checked
against the reference in tests/test_triton_fwd_interp.py (interpreter), tests/test_runtime.py (attention() and
Plan.run under the interpreter) and tests/test_gpu.py."""

import json
import os

import pytest

import fmha_dsl
from fmha_dsl import seqtune
from fmha_dsl.errors import FmhaError
from fmha_dsl.keys import Algorithm, KernelKey, Problem, Signature
from fmha_dsl.registry import Entry, Registry
from fmha_dsl.runtime.dispatch import Dispatcher
from fmha_dsl.runtime.match import mismatches

SET = """kernel_set s {{
    backend(triton)
    arch({arch})
    kernel k {{
        signature {{ family({family}) dtype(fp16) mode(batch) hdim(64) mask(no) bias(no) lse({lse}) dropout(false)
                    logits(false) sink(false) }}
        algorithm {{ pipeline(qr_async) tile_m0(16) tile_n0(64) tile_k0(64) tile_n1(64) tile_k0max(64) wave_m0(4)
                    padding(true, true, true, true) {extra} }}
    }}
}}
"""


def kset(family="fwd_splitkv", extra="", arch="sm90", lse="false"):
    return fmha_dsl.loads(SET.format(family=family, extra=extra, arch=arch, lse=lse), "split.fmha")


# ---------------------------------------------------------------------------------------------------------
# rules and names
# ---------------------------------------------------------------------------------------------------------
def test_split_family_expands_with_its_split_count_in_the_name():
    names = sorted(e.name for e in kset(extra="max_splits_log2(2 | 5)").registry())
    assert [n.split("_d64")[0] for n in names] == ["fmha_fwd_splitkv_s32", "fmha_fwd_splitkv_s4"]
    default = list(kset().registry())
    assert len(default) == 1 and default[0].alg["max_splits_log2"] == 4 and "_splitkv_s16_" in default[0].name
    every = list(kset(extra="max_splits_log2(*)").registry())
    assert sorted(e.alg["max_splits_log2"] for e in every) == [1, 2, 3, 4, 5, 6, 7]
    # a forward kernel with the same fields is another kernel (another name and identifier)
    fwd = list(kset(family="fwd").registry())
    assert fwd[0].name.startswith("fmha_fwd_d64") and fwd[0].identifier != default[0].identifier


def test_a_split_count_out_of_range_is_a_located_error():
    with pytest.raises(FmhaError) as ei:
        kset(extra="max_splits_log2(9)").registry()
    assert ei.value.rule == "triton.splits" and str(ei.value).startswith("split.fmha:8:")
    assert "got 9" in str(ei.value) and "max_splits_log2(4)" in ei.value.hint


# ---------------------------------------------------------------------------------------------------------
# matching and plans
# ---------------------------------------------------------------------------------------------------------
def _entries(build_combine=True):
    out = []
    for fam, name in (("fwd", "plain"), ("fwd_splitkv", "split")):
        sig = Signature(family=fam, dtype="fp16", mode="batch", hdim_q=64, hdim_v=64)
        alg = Algorithm(pipeline="qr_async", tile=(64, 64, 64, 64, 64, 64), wave=(4, 1, 1, 4, 1, 1, 1, 1, 1),
                        max_splits_log2=3 if fam == "fwd_splitkv" else 0)
        build = {"num_warps": 4, "resources": {"regs": 128}}   # 4 resident programs per SM
        if fam == "fwd_splitkv" and build_combine:
            build.update(combine={"entry": "fmha_fwd_combine"}, splits=8)
        out.append(Entry(KernelKey(signature=sig, algorithm=alg, arch="sm90"), name, f"t.fmha:{name}", build))
    return out


def P(**kw):
    base = dict(dtype="fp16", hdim_q=64, hdim_v=64, seqlen_q=1, seqlen_k=8192, batch=2, nhead_q=8, nhead_k=8)
    return Problem(**{**base, **kw})


def test_a_built_split_kernel_serves_forward_problems_and_not_the_reverse():
    plain, split = _entries()
    assert mismatches(split, P()) == []                                   # fwd problem, split kernel with combine
    assert [f for f, _ in mismatches(plain, P(family="fwd_splitkv", num_splits=4))] == ["family"]
    assert mismatches(split, P(family="fwd_splitkv", num_splits=8)) == []
    assert [f for f, _ in mismatches(split, P(family="fwd_splitkv", num_splits=16))] == ["max_splits_log2"]
    _, unbuilt = _entries(build_combine=False)                            # no combine kernel: not for fwd problems
    assert [f for f, _ in mismatches(unbuilt, P())] == ["family"]
    disp = Dispatcher(Registry("r", _entries()), arch="sm90", launcher="interpret")
    assert {e.name for e in disp.candidates(P())} == {"plain", "split"}
    assert [e.name for e in disp.candidates(P(family="fwd_splitkv", num_splits=2))] == ["split"]


def test_split_plans_have_two_stages_and_the_problem_can_ask_for_a_count():
    disp = Dispatcher(Registry("r", _entries()[1:]), arch="sm90", launcher="interpret")
    plan = disp.plan(P())
    assert [s.family for s in plan.stages] == ["fwd_splitkv", "fwd_splitkv_combine"] and plan.splits == 8
    assert disp.plan(P(family="fwd_splitkv", num_splits=3)).splits == 3
    assert disp.plan(P()) is plan  # cached per class
    # the count a launch uses (costmodel.splits_at): the shortest critical path over 132 SMs x 4 resident programs
    # (128 registers x 128 threads), at most the kernel's count and the key blocks, int32 strides
    sl = plan._split
    assert sl.occupancy == 4
    assert sl.count(8, 2, 8, 1, 8192) == 8                 # 16 programs: all 8 splits, one wave
    assert sl.count(8, 2, 8, 1, 100) == 2                  # two key blocks of 64
    assert sl.count(8, 64, 16, 1, 8192) == 1               # 1024 programs: splitting only adds waves
    # 64 programs of 128 blocks: 8 splits fill one wave of 528 (16 + 1 block-times); 9 or more take 2 waves
    assert sl.count(8, 4, 16, 1, 8192) == 8 and sl.count(64, 4, 16, 1, 8192) == 8
    assert sl.count(8, 1, 1, 2 ** 24, 8192) == 1           # 2**24 rows x 64 x 2 splits would overflow int32


def test_an_unbuilt_split_kernel_cannot_be_planned_on_a_gpu_launcher():
    disp = Dispatcher(Registry("r", _entries(build_combine=False)[1:]), arch="sm90", launcher="cuda")
    with pytest.raises(FmhaError, match="no combine kernel"):
        disp.plan(P(family="fwd_splitkv", num_splits=2))


# ---------------------------------------------------------------------------------------------------------
# prediction and cost
# ---------------------------------------------------------------------------------------------------------
CLS = {"family": "fwd", "dtype": "fp16", "mode": "batch", "vlayout": "r", "hdim_q": 64, "hdim_v": 64,
       "mask": "no", "bias": "no", "lse": False, "dropout": False, "logits": False, "sink": False}


def test_prediction_counts_split_programs_and_resident_programs_per_sm():
    t = seqtune.Table({"name": "x", "arch": "sm90", "compute_units": 132})
    t.record(CLS, (1, 8192, 1, 16, 16), "k", 100.0)
    pts = t.points(CLS)
    # measured at 16 programs; at batch 4: 64 programs.  Split x8: 128 -> 512 programs, 16 key blocks each.
    # one program per SM: 1 -> 4 waves (4x the time); 4 resident per SM: one wave either way
    p = P(batch=4, nhead_q=16, nhead_k=16)
    assert seqtune.predict(pts, "k", 64, 64, p, 132, splits=8)[0] == pytest.approx(400.0)
    assert seqtune.predict(pts, "k", 64, 64, p, 132, splits=8, occ=4)[0] == pytest.approx(100.0)
    # not split: 16 -> 64 programs, one wave: the same time with any occupancy
    assert seqtune.predict(pts, "k", 64, 64, p, 132)[0] == pytest.approx(100.0)
    # to 2048 keys: a quarter of the key blocks, and a split count capped at 32 blocks still 8
    assert seqtune.predict(pts, "k", 64, 64, P(seqlen_k=2048, batch=1, nhead_q=16, nhead_k=16), 132,
                           splits=8)[0] == pytest.approx(25.0)


def test_the_cost_model_counts_splits_and_the_combine_pass():
    plain, split = _entries()
    p = P(batch=1, nhead_q=8, nhead_k=8)
    cp, dp = seqtune.cost(plain, p, "sm90", 132)
    cs, ds = seqtune.cost(split, p, "sm90", 132)
    assert (dp["programs"], ds["programs"], ds["splits"]) == (8, 64, 8)
    assert cs < cp            # 8 programs on 132 SMs: splitting 128 key blocks 8 ways wins
    big = P(seqlen_q=4096, seqlen_k=4096, batch=8, nhead_q=16, nhead_k=16)
    cp, _ = seqtune.cost(plain, big, "sm90", 132)
    cs, ds = seqtune.cost(split, big, "sm90", 132)
    assert ds["splits"] == 1 and cs > cp    # a full grid: no split, and the combine pass is pure overhead


# ---------------------------------------------------------------------------------------------------------
# build (CPU: Triton compiles for the targets without a GPU)
# ---------------------------------------------------------------------------------------------------------
def _no_combine(kind, sig, alg, arch):
    """The real compile, but every combine kernel fails (module level: the build's spawned workers import it)."""
    from fmha_dsl.build_triton import _compile_in_worker

    if kind == "companion" and sig["family"] == "fwd_splitkv_combine":
        return None, "OutOfResources: combine"
    return _compile_in_worker(kind, sig, alg, arch)


def test_build_compiles_one_shared_combine_kernel_per_signature(tmp_path):
    pytest.importorskip("triton")
    from fmha_dsl.build import build

    ks = fmha_dsl.loads(SET.format(family="fwd_splitkv", extra="max_splits_log2(2 | 4)", arch="sm90, gfx942",
                                   lse="true"), "split.fmha")
    res = build(ks, str(tmp_path / "out"), jobs=1, cache_dir=str(tmp_path / "cache"))
    assert not res.failures and res.by_arch == {"gfx942": 2, "sm90": 2}
    reg = json.loads((tmp_path / "out" / "registry.json").read_text())
    for arch in ("sm90", "gfx942"):
        mine = [k for k in reg["kernels"] if k["gfx_arch"] == arch]
        combs = {k["build"]["combine"]["binary"] for k in mine}
        assert len(combs) == 1, combs                   # both split counts share the combine binary
        comb = mine[0]["build"]["combine"]
        assert comb["entry"] == "fmha_fwd_combine" and comb["params"][:3] == ["Ows", "Lws", "Out"]
        assert os.path.getsize(tmp_path / "out" / comb["binary"]) == comb["size"]
        assert sorted(k["build"]["splits"] for k in mine) == [4, 16]
        assert all(k["build"]["grid"].startswith("[cdiv(max_seqlen_q, BLOCK_M), nhead_q * splits") for k in mine)
    # a rebuild compiles nothing; a failing combine fails its split kernels with the reason
    again = build(ks, str(tmp_path / "out2"), jobs=1, cache_dir=str(tmp_path / "cache"))
    assert again.compiled == 0 and again.cached == 4
    from fmha_dsl import build_triton as bt

    import pytest as _p

    mp = _p.MonkeyPatch()
    mp.setattr(bt, "_compile_in_worker", _no_combine)
    try:
        bad = build(ks, str(tmp_path / "out3"), jobs=1, cache_dir=str(tmp_path / "cache-empty"))
    finally:
        mp.undo()
    assert len(bad.failures) == 4 and all("combine kernel failed" in f["reason"] for f in bad.failures)


def test_the_split_count_takes_the_shortest_critical_path_with_the_fewest_splits():
    """Checked against the definition by brute force on a grid: the critical path is waves of non-empty programs over
    cus x occupancy slots times (key blocks per split + SPLIT_SETUP); the count is the fewest splits within 5 % of the
    shortest path over 1 .. min(limit, blocks, twice what fills SPLIT_WAVES waves of one program per CU); and the
    paged workspace bound covers every count a launch of at least batch x nhead_k programs can take.  Hand-checked:
    64 programs of 128 blocks on 132 SMs, two resident each, split 4 ways (one wave of 33 block-times; 10 splits
    took 3 waves of 14)."""
    from fmha_dsl.costmodel import SPLIT_SETUP, SPLIT_WAVES, splits_at
    from fmha_dsl.kernels.fwd_abi import block_d
    from fmha_dsl.kernels.paged_abi import workspace_bound

    def path(n, s, blocks, slots):
        per = -(-blocks // s)
        return -(-n * -(-blocks // per) // slots) * (per + SPLIT_SETUP)

    assert splits_at(64, 8192, 64, 64, 132, 2) == 4
    assert splits_at(64, 8192, 64, 64, 132, 1) == 2  # one resident: 2 x 64 programs still fit one wave of 132
    assert splits_at(0, 8192, 64, 64, 132, 2) == 1
    for cus in (80, 132, 304):
        for occ in (1, 2, 4):
            for nprog in range(1, 400, 13):
                for limit in (2, 8, 32, 128):
                    for blocks in (1, 3, 40, 1000):
                        s = splits_at(limit, blocks * 64, 64, nprog, cus, occ)
                        most = max(1, min(limit, blocks, 2 * -(-SPLIT_WAVES * cus // nprog)))
                        paths = [path(nprog, t, blocks, cus * occ) for t in range(1, most + 1)]
                        assert 1 <= s <= most
                        assert paths[s - 1] * 20 <= min(paths) * 21
                        assert all(p * 20 > min(paths) * 21 for p in paths[:s - 1]), (cus, occ, nprog, limit, blocks)
    for b, hq, hk, sk in ((1, 32, 8, 131072), (8, 64, 8, 131072), (3, 12, 3, 5000), (64, 32, 4, 8192)):
        ws = workspace_bound(b, hq, hk, 1, sk, 128, 132)
        for limit in (16, 32, 64, 128):
            s = max(splits_at(limit, sk, 16, b * hk, 132, occ) for occ in (1, 2, 4, 8))
            assert b * hq * s * (block_d(128) + 1) <= ws, (b, hq, hk, sk, limit, s)
