"""``fmha_dsl.paged_attention`` / ``append_kv``: the NumPy path (the reference), located errors for bad tables, lengths
and caches, the serving kernel set's build for AMD and NVIDIA, and the torch path end to end under Triton's interpreter
(a dispatcher over a declared set, the split-KV decode plan, append-KV through the dispatcher)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from interpreted import run_interpreted

import fmha_dsl
from fmha_dsl.errors import UsageError
from fmha_dsl.reference import attention_fwd


def _cache(lens, page=4, hk=2, d=16, seed=0):
    rng = np.random.default_rng(seed)
    need = [-(-n // page) for n in lens]
    total = sum(need) + 1
    perm = rng.permutation(total)
    bt = np.zeros((len(lens), max(need + [1])), np.int32)
    i = 0
    for b, n in enumerate(need):
        bt[b, :n] = perm[i:i + n]
        i += n
    kc = rng.standard_normal((total, page, hk, d)).astype(np.float32)
    vc = rng.standard_normal((total, page, hk, d)).astype(np.float32)
    return kc, vc, bt


def test_numpy_paged_attention_is_attention_on_the_gathered_kv_and_causal_means_bottom_right():
    kc, vc, bt = _cache([9, 6])
    q = np.random.default_rng(1).standard_normal((5, 4, 16)).astype(np.float32)
    cq, lens = np.array([0, 3, 5], np.int32), np.array([9, 6], np.int32)
    out, lse = fmha_dsl.paged_attention(q, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq, causal=True,
                                        return_lse=True)
    k = np.concatenate([kc[bt[0, :3]].reshape(12, 2, 16)[:9], kc[bt[1, :2]].reshape(8, 2, 16)[:6]])
    v = np.concatenate([vc[bt[0, :3]].reshape(12, 2, 16)[:9], vc[bt[1, :2]].reshape(8, 2, 16)[:6]])
    want, wl = attention_fwd(q, k, v, causal="bottom_right", cu_seqlens_q=cq, cu_seqlens_k=np.array([0, 9, 15]))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, wl, rtol=1e-5, atol=1e-5)


def test_numpy_append_kv_updates_the_arrays_in_place():
    kc, vc, bt = _cache([5, 2], page=4)
    kc0 = kc.copy()
    kn = np.ones((3, 2, 16), np.float32)
    fmha_dsl.append_kv(kc, vc, kn, kn, block_table=bt, seqlens_k=[5, 2], cu_seqlens_new=[0, 2, 3])
    assert (kc[bt[0, 1], 1] == 1).all() and (kc[bt[0, 1], 2] == 1).all() and (kc[bt[1, 0], 2] == 1).all()
    untouched = np.ones(kc.shape[:2], bool)
    untouched[bt[0, 1], 1:3] = untouched[bt[1, 0], 2] = False
    assert np.array_equal(kc[untouched], kc0[untouched])
    contiguous = np.zeros((2, 8, 2, 16), np.float32)            # no table: [B, capacity, Hk, D]
    fmha_dsl.append_kv(contiguous, contiguous.copy(), kn, kn, seqlens_k=[5, 2], cu_seqlens_new=[0, 2, 3])
    assert (contiguous[0, 5:7] == 1).all() and (contiguous[1, 2] == 1).all() and contiguous.sum() == 3 * 32


@pytest.mark.parametrize("kw,match", [
    ({"block_table": np.full((2, 3), 99, np.int32)}, "page id 99 .* outside the cache"),
    ({"block_table": np.zeros((2, 1), np.int32)}, "9 cached tokens need 3 pages of 4, its table has 1"),
    ({"block_table": np.zeros((3, 3), np.int32)}, "one row per sequence"),
    ({"block_table": np.zeros((2, 3), np.float32)}, "must be an integer array"),
    ({}, "give exactly one page table"),
    ({"block_table": np.zeros((2, 3), np.int32), "kv_indptr": [0, 1, 2], "kv_indices": [0, 1]},
     "give exactly one page table"),
    ({"kv_indptr": [0, 3, 1], "kv_indices": [0, 1, 2]}, "never decrease"),
])
def test_numpy_errors_name_the_table_problem(kw, match):
    kc, vc, _ = _cache([9, 6])
    with pytest.raises(UsageError, match=match):
        fmha_dsl.paged_attention(np.zeros((2, 4, 16), np.float32), kc, vc, seqlens_k=[9, 6], cu_seqlens_q=[0, 1, 2],
                                 **kw)


def test_numpy_paged_attention_reads_a_numpy_bool_as_a_bool_and_fills_out():
    """causal=np.True_ is causal=True (bottom-right here), not top-left; ``out`` is written and returned."""
    kc, vc, bt = _cache([9, 6])
    q = np.random.default_rng(1).standard_normal((5, 4, 16)).astype(np.float32)
    kw = dict(block_table=bt, seqlens_k=np.array([9, 6], np.int32), cu_seqlens_q=np.array([0, 3, 5], np.int32))
    want = fmha_dsl.paged_attention(q, kc, vc, causal=True, **kw)
    assert not np.allclose(want, fmha_dsl.paged_attention(q, kc, vc, causal="top_left", **kw))
    np.testing.assert_array_equal(fmha_dsl.paged_attention(q, kc, vc, causal=np.bool_(True), **kw), want)
    np.testing.assert_array_equal(fmha_dsl.paged_attention(q, kc, vc, causal=np.bool_(False), **kw),
                                  fmha_dsl.paged_attention(q, kc, vc, **kw))
    out = np.zeros_like(want)
    assert fmha_dsl.paged_attention(q, kc, vc, causal=True, out=out, **kw) is out
    np.testing.assert_array_equal(out, want)
    with pytest.raises(UsageError, match=r"`out` must be a writable numpy array of shape \(5, 4, 16\)"):
        fmha_dsl.paged_attention(q, kc, vc, out=np.zeros((5, 4, 15), np.float32), **kw)
    with pytest.raises(UsageError, match=r"max_seqlen_k=8 is below the longest sequence \(9\)"):
        fmha_dsl.paged_attention(q, kc, vc, max_seqlen_k=8, **kw)
    with pytest.raises(UsageError, match=r"max_seqlen_q=2 is below the longest sequence \(3\)"):
        fmha_dsl.paged_attention(q, kc, vc, max_seqlen_q=2, **kw)
    with pytest.raises(UsageError, match="scale >= 0"):
        fmha_dsl.paged_attention(q, kc, vc, scale=-1.0, **kw)
    with pytest.raises(UsageError, match=r"page size \(their second dim\) must be >= 1"):
        fmha_dsl.paged_attention(q, kc[:, :0], vc[:, :0], **kw)
    with pytest.raises(UsageError, match=r"`q` must be \[Tq, Hq, D = 16\] \(the caches' head dim\)"):
        fmha_dsl.paged_attention(q[..., :8], kc, vc, **kw)
    with pytest.raises(UsageError, match="`q` must have the caches' dtype float32, got float16"):
        fmha_dsl.paged_attention(q.astype(np.float16), kc, vc, **kw)
    with pytest.raises(UsageError, match=r"`seqlens_k` must have one length per sequence \(2\), got 3"):
        fmha_dsl.paged_attention(q, kc, vc, **dict(kw, seqlens_k=np.array([9, 6, 1], np.int32)))   # (B: cu_seqlens)
    with pytest.raises(UsageError, match="workspace_numel\\(\\): `q` must be a torch tensor"):
        fmha_dsl.paged.workspace_numel(q, kc, vc, batch=2, max_seqlen_q=3, max_seqlen_k=9)


@pytest.mark.parametrize("kw,match", [
    ({"q": np.array(1.0, np.float32)}, r"`q` must be the new tokens' queries \[Tnew = 3, Hq, D = 16\]"),
    ({"q": np.zeros((3, 3, 16), np.float32)}, "Hq a multiple of Hk = 2, got \\(3, 3, 16\\)"),
    ({"q": np.zeros((3, 4, 8), np.float32)}, "D = 16"),
    ({"rotary_cos": "a", "rotary_sin": "b"}, "`rotary_cos` must be float16, float32 or float64"),
    ({"rotary_cos": np.zeros((8, 0)), "rotary_sin": np.zeros((8, 0))}, "rotary_dim >= 2"),
    ({"rotary_cos": np.ones((8, 2)), "rotary_sin": np.ones((8, 2)), "rotary_interleaved": "no"},
     "rotary_interleaved must be True or False, got 'no'"),
    ({"k_new": np.ones((3, 2, 16), np.float16)}, "`k_new` must have the cache's dtype float32, got float16"),
    ({"k_new": np.ones((2, 16), np.float32)}, "`k_new`/`v_new` must be 3-D"),
])
def test_numpy_append_kv_errors_are_located(kw, match):
    kc, vc, bt = _cache([5, 2], page=4)
    args = dict(k_new=np.ones((3, 2, 16), np.float32), v_new=np.ones((3, 2, 16), np.float32), block_table=bt,
                seqlens_k=[5, 2], cu_seqlens_new=[0, 2, 3])
    args.update(kw)
    with pytest.raises(UsageError, match=match):
        fmha_dsl.append_kv(kc, vc, **args)


def test_numpy_append_kv_without_a_table_takes_a_contiguous_cache_only():
    kn = np.ones((3, 2, 16), np.float32)
    vec = np.zeros((2, 2, 2, 8, 8), np.float32)   # CK's vectorized K layout: paged, so it needs its table
    with pytest.raises(UsageError, match="without a page table is contiguous"):
        fmha_dsl.append_kv(vec, vec.copy(), kn, kn, seqlens_k=[1, 1], cu_seqlens_new=[0, 2, 3])
    kc, vc, _ = _cache([5, 2], page=4)
    with pytest.raises(UsageError, match=r"page size \(their second dim\) must be >= 1"):
        fmha_dsl.append_kv(kc[:, :0].copy(), vc[:, :0].copy(), kn, kn, block_table=np.zeros((2, 1), np.int32),
                           seqlens_k=[1, 1], cu_seqlens_new=[0, 2, 3])


def test_torch_argument_errors_are_located():
    torch = pytest.importorskip("torch")
    kc, vc, bt = _cache([9, 6])
    q = torch.zeros(2, 4, 16)
    good = dict(block_table=torch.tensor(bt), seqlens_k=torch.tensor([9, 6], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32))
    kct, vct = torch.tensor(kc), torch.tensor(vc)
    from fmha_dsl.runtime.dispatch import Dispatcher

    cpu = Dispatcher(None, "sm90", launcher="interpret", tuned_dir="")  # CPU tensors reach the argument checks
    cases = [
        (dict(good, block_table=torch.tensor(bt).float()), "block_table.*int32"),
        (dict(good, seqlens_k=torch.tensor([9], dtype=torch.int32)), "seqlens_k.*one entry per sequence"),
        (dict(good, kv_indptr=torch.tensor([0, 1, 2], dtype=torch.int32)), "not both"),
        ({k: v for k, v in good.items() if k != "block_table"}, "give a page table"),
        (dict(good, cu_seqlens_q=torch.tensor([[0, 1]], dtype=torch.int32)), "cu_seqlens_q.*1-D"),
    ]
    for kw, match in cases + [
            (dict(good, max_seqlen_k=100), "max_seqlen_k=100 needs 25 pages of 4 per sequence, block_table has 3"),
            (dict(good, block_table=torch.tensor(bt) + 50), "page id 5[0-9] .* outside the cache"),
            (dict(good, scale=-1.0), "scale >= 0"),
            (dict(good, out=torch.zeros(2, 4, 8)), "`out` must be a \\[2, 4, 16\\]"),
            (dict(good, alibi_slopes=torch.zeros(3)), "alibi_slopes.*\\[Hq\\] = \\[4\\]")]:
        with pytest.raises(UsageError, match=match) as e:
            fmha_dsl.paged_attention(q, kct, vct, registry=cpu, **kw)
        assert "paged_attention()" in str(e.value) and e.value.hint
    with pytest.raises(UsageError, match="torch tensors run on a GPU"):
        fmha_dsl.paged_attention(q, kct, vct, **good)
    with pytest.raises(UsageError, match="page size must be a power of two for the kernels, got 3") as e:
        fmha_dsl.paged_attention(q, kct[:, :3], vct[:, :3], registry=cpu, **good)
    assert "reference" in e.value.hint
    with pytest.raises(UsageError, match="k_cache.*4-D"):
        fmha_dsl.paged_attention(q, kct[0], vct, registry=cpu, **good)
    from fmha_dsl.reference_paged import vectorized_caches

    k5, v5 = vectorized_caches(kct, vct)                        # float32: 4 elements are 16 bytes
    assert k5.shape == (kct.shape[0], 2, 4, 4, 4) and v5.shape == (kct.shape[0], 2, 1, 16, 4)
    v_want = r"v_cache` in CK's vectorized layout is 5-D \[num_pages, Hk, page_size / 4, D, 4\]"
    for kk, vv, match in ((k5, vct, v_want),
                          (k5.reshape(k5.shape[0], 2, 2, 4, 8), v5, "k_cache` in CK's vectorized layout is 5-D"),
                          (k5.transpose(2, 3), v5, "k_cache`'s last two dims must be contiguous"),
                          (k5, v5[:, :1], "must agree on num_pages, Hk and page_size")):
        with pytest.raises(UsageError, match=match) as e:
            fmha_dsl.paged_attention(q, kk, vv, registry=cpu, **good)
        assert e.value.hint
    with pytest.raises(UsageError, match="contiguous .* not in the vectorized layout"):
        fmha_dsl.append_kv(k5, v5, torch.zeros(2, 2, 16), torch.zeros(2, 2, 16), seqlens_k=good["seqlens_k"],
                           cu_seqlens_new=torch.tensor([0, 1, 2], dtype=torch.int32), registry=cpu)
    with pytest.raises(UsageError, match="q's dtype"):
        fmha_dsl.paged_attention(q, kct.half(), vct.half(), registry=cpu, **good)
    with pytest.raises(UsageError, match="append_kv\\(\\).*rotary_cos"):
        fmha_dsl.append_kv(kct, vct, torch.zeros(1, 2, 16), torch.zeros(1, 2, 16), seqlens_k=good["seqlens_k"],
                           cu_seqlens_new=torch.tensor([0, 1, 1], dtype=torch.int32), block_table=good["block_table"],
                           rotary_cos=torch.zeros(8, 4), registry=cpu)
    flat = torch.zeros(2, 10, 2, 16)                                      # contiguous [B, capacity, Hk, D]
    new1 = dict(seqlens_k=good["seqlens_k"], cu_seqlens_new=torch.tensor([0, 2, 3], dtype=torch.int32), registry=cpu)
    with pytest.raises(UsageError, match="sequence 0: 9 cached \\+ 2 new tokens exceed the cache's capacity 10"):
        fmha_dsl.append_kv(flat, flat.clone(), torch.zeros(3, 2, 16), torch.zeros(3, 2, 16), **new1)
    with pytest.raises(UsageError, match="without a page table the caches are contiguous"):
        fmha_dsl.append_kv(torch.zeros(3, 10, 2, 16), torch.zeros(3, 10, 2, 16), torch.zeros(3, 2, 16),
                           torch.zeros(3, 2, 16), **new1)
    with pytest.raises(UsageError, match="rotary tables of at least 11 rows, they have 8"):
        fmha_dsl.append_kv(kct, vct, torch.zeros(3, 2, 16), torch.zeros(3, 2, 16), block_table=good["block_table"],
                           rotary_cos=torch.zeros(8, 4), rotary_sin=torch.zeros(8, 4), **new1)
    with pytest.raises(UsageError, match="append_kv\\(\\).*sequence 0: 9 cached \\+ 4 new tokens need 4 pages"):
        fmha_dsl.append_kv(kct, vct, torch.zeros(4, 2, 16), torch.zeros(4, 2, 16), seqlens_k=good["seqlens_k"],
                           cu_seqlens_new=torch.tensor([0, 4, 4], dtype=torch.int32), block_table=good["block_table"],
                           registry=cpu)


def test_fp8_argument_errors_are_located():
    """FP8 (float8_e4m3fn q and caches): the three descales, their dtype/shape/device, descales on other dtypes, the
    bf16 output, FP8 appends' new rows and descales -- each a located UsageError with a hint, before anything is
    compiled."""
    torch = pytest.importorskip("torch")
    from fmha_dsl.runtime.dispatch import Dispatcher

    cpu = Dispatcher(None, "sm90", launcher="interpret", tuned_dir="")
    kc, vc, bt = _cache([9, 6])
    k8, v8 = (torch.tensor(x).to(torch.float8_e4m3fn) for x in (kc, vc))
    q8 = torch.zeros(2, 4, 16).to(torch.float8_e4m3fn)
    one = torch.ones(1)
    good = dict(block_table=torch.tensor(bt), seqlens_k=torch.tensor([9, 6], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32), registry=cpu)
    ds = dict(q_descale=one, k_descale=one, v_descale=one)
    for q, k, v, kw, match in (
            (q8, k8, v8, dict(q_descale=one, v_descale=one), "FP8 data needs `k_descale`"),
            (q8, k8, v8, dict(ds, k_descale=one.double()), "`k_descale` must be a float32 tensor of one element"),
            (q8, k8, v8, dict(ds, v_descale=torch.ones(2)), "`v_descale` must be a float32 tensor of one element"),
            (q8, k8, v8, dict(ds, q_descale=1.0), "`q_descale` must be a float32 tensor"),
            (q8, k8.to(torch.bfloat16), v8, ds, "`k_cache` must have q's dtype"),
            (q8.float(), torch.tensor(kc), torch.tensor(vc), dict(q_descale=one), "`q_descale` scales FP8"),
            (q8, k8, v8, dict(ds, out=torch.zeros(2, 4, 16).to(torch.float8_e4m3fn)),
             "`out` must be a \\[2, 4, 16\\] torch.bfloat16 tensor"),
            (q8, k8, v8, dict(ds, k_descale=torch.ones(5, 2)), "`k_descale` must be a float32 tensor of one element "
             "or \\[num_pages, Hk\\] = \\[6, 2\\] .* got Tensor \\(5, 2\\)"),
            (q8, k8, v8, dict(ds, k_descale=torch.ones(6, 2)), "`k_descale` and `v_descale` must be of one kind"),
            (q8, k8, v8, dict(ds, q_descale=torch.ones(6, 2)), "`q_descale` must be a float32 tensor of one element "
             "or \\[Tq, Hq\\] = \\[2, 4\\] .* got Tensor \\(6, 2\\)"),
            # CK's per_token_head: K/V [num_pages, page_size, Hk], q's one element or [Tq, Hq]
            (q8, k8, v8, dict(ds, k_descale=torch.ones(6, 5, 2), v_descale=torch.ones(6, 5, 2)),
             "`k_descale` must be .* or \\[num_pages, page_size, Hk\\] = \\[6, 4, 2\\] .* got Tensor \\(6, 5, 2\\)"),
            (q8, k8, v8, dict(ds, k_descale=torch.ones(6, 4, 2), v_descale=torch.ones(6, 2)),
             "`k_descale` and `v_descale` must be of one kind, got per_token_head"),
            (q8, k8, v8, dict(q_descale=torch.ones(2, 4), k_descale=torch.ones(6, 2), v_descale=torch.ones(6, 2)),
             "a per-token `q_descale` \\(2, 4\\) goes with per-token-head \\(or one-element\\) K/V descales, not KV "
             "block scales")):
        with pytest.raises(UsageError, match=match) as e:
            fmha_dsl.paged_attention(q, k, v, **good, **kw)
        assert "paged_attention()" in str(e.value) and e.value.hint
    new = torch.zeros(2, 2, 16, dtype=torch.bfloat16)
    app = dict(block_table=good["block_table"], seqlens_k=good["seqlens_k"], cu_seqlens_new=good["cu_seqlens_q"],
               registry=cpu)
    for k, v, kn, kw, match in (
            (k8, v8, new.to(torch.float8_e4m3fn), dict(k_descale=one, v_descale=one), "bfloat16 for an FP8 cache"),
            (k8, v8, new.half(), dict(k_descale=one, v_descale=one), "FP8 .* cache takes bfloat16 new rows"),
            (k8, v8, new, dict(k_descale=one), "FP8 data needs `v_descale`"),
            (k8, v8, new, dict(k_descale=one, v_descale=torch.ones(1, 1, dtype=torch.float16)),
             "`v_descale` must be a float32 tensor of one element"),
            (k8, v8, new, dict(k_descale=torch.ones(6, 2), v_descale=torch.ones(6, 3)),
             "`v_descale` must be .* or \\[num_pages, Hk\\] = \\[6, 2\\]"),
            (k8, v8, new, dict(k_descale=torch.ones(6, 4, 2), v_descale=torch.ones(6, 4, 2)),   # (attention only)
             "`k_descale` must be a float32 tensor of one element or \\[num_pages, Hk\\] = \\[6, 2\\] \\(one per "
             "page and K/V head\\) on cpu, got"),
            (torch.tensor(kc).bfloat16(), torch.tensor(vc).bfloat16(), new, dict(k_descale=one),
             "`k_descale` scales FP8"),
            (k8, torch.tensor(vc).bfloat16(), new, dict(k_descale=one, v_descale=one),
             "`v_cache` must have k_cache's dtype torch.float8_e4m3fn")):
        with pytest.raises(UsageError, match=match) as e:
            fmha_dsl.append_kv(k, v, kn, kn, **app, **kw)
        assert "append_kv()" in str(e.value) and e.value.hint
    with pytest.raises(UsageError, match="`q` must be .* in k_new's dtype torch.bfloat16 .*float8_e4m3fn") as e:
        fmha_dsl.append_kv(k8, v8, new, new, q=torch.zeros(2, 4, 16).to(torch.float8_e4m3fn), k_descale=one,
                           v_descale=one, **app)
    assert "bfloat16 for an FP8 cache" in e.value.hint


def test_a_one_element_descale_of_any_shape_is_per_tensor():
    """[1, 1] K/V descales are one number (per tensor), not block scales of a one-page cache; block scales are
    exactly [num_pages, Hk]."""
    torch = pytest.importorskip("torch")
    from fmha_dsl.paged_args import descales

    one, sq = torch.ones(1), torch.ones(1, 1)
    assert descales("fp8bf16", (one, sq, sq), -1, pages=(6, 2))[1] == "pertensor"
    assert descales("fp8bf16", (sq, torch.ones(6, 2), torch.ones(6, 2)), -1, pages=(6, 2))[1] == "kv_blockscale"
    assert descales("bf16", (None, None, None), -1, pages=(6, 2)) == ((None, None, None), "no")
    tok = torch.ones(6, 4, 2)   # per token and head: q's one element or [Tq, Hq]
    assert descales("fp8bf16", (one, tok, tok), -1, pages=(6, 2), page=4, tokens=(3, 8))[1] == "per_token_head"
    assert descales("fp8bf16", (torch.ones(3, 8), tok, tok), -1, pages=(6, 2), page=4,
                    tokens=(3, 8))[1] == "per_token_head"
    from fmha_dsl.fp8 import round_e4m3

    kc, vc, bt = _cache([9, 6])
    kc, vc = round_e4m3(kc), round_e4m3(vc)   # (FP8 inputs hold e4m3 values)
    kw = dict(block_table=bt, seqlens_k=[9, 6], cu_seqlens_q=[0, 1, 2])
    q = np.ones((2, 4, 16), np.float32)
    got = fmha_dsl.paged_attention(q, kc, vc, q_descale=[[0.5]], k_descale=[[2.0]], v_descale=np.array([3.0]), **kw)
    assert np.allclose(got, fmha_dsl.paged_attention(q, kc, vc, q_descale=0.5, k_descale=2.0, v_descale=3.0, **kw))


PER_TOKEN = r'''
import numpy as np, torch, fmha_dsl
from fmha_dsl.reference_paged import paged_attention as ref
from fmha_dsl.runtime.dispatch import Dispatcher

SET = """kernel_set t { backend(triton) arch(sm90) dtype(fp8bf16) qscale(*) hdim(32)
  kernel p { signature { family(batch_prefill) mask(no | causal) kv_cache(linear, vllm, 4) }
             algorithm { pipeline(qr_async) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32) wave_m0(4)
                         padding(true, true, true, true) } }
}"""
disp = Dispatcher(fmha_dsl.loads(SET).registry(arch="sm90"), "sm90", launcher="interpret", tuned_dir="")
rng = np.random.default_rng(0)
lens_q, lens_k, pages, page, hq, hk, d = [3, 5], [10, 13], 9, 4, 4, 2, 32
bt = np.zeros((2, 4), np.int32)
perm = rng.permutation(pages)
bt[0, :3], bt[1, :4] = perm[:3], perm[3:7]
f8, t = torch.float8_e4m3fn, torch.from_numpy
kc, vc = (torch.tensor(rng.standard_normal((pages, page, hk, d)).astype(np.float32)).to(f8) for _ in range(2))
q = torch.tensor(rng.standard_normal((sum(lens_q), hq, d)).astype(np.float32)).to(f8)
cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
kd, vd = ((2.0 ** rng.integers(-4, 3, (pages, page, hk))).astype(np.float32) for _ in range(2))
qd = (rng.uniform(0.1, 0.5, (sum(lens_q), hq)) * rng.choice([-1, 1], (sum(lens_q), hq))).astype(np.float32)


def host(x):
    return float(x.reshape(-1)[0]) if x.numel() == 1 else x.contiguous().numpy()


def check(qdt, kdt, vdt):
    want = ref(q.float().numpy(), kc.float().numpy(), vc.float().numpy(), block_table=bt, seqlens_k=lens_k,
               cu_seqlens_q=cq, causal="bottom_right", descales=tuple(host(x) for x in (qdt, kdt, vdt)))
    disp.fast_paged.clear()   # (each call plans afresh: the plan it gets names its kernel's qscale)
    out = fmha_dsl.paged_attention(q, kc, vc, block_table=t(bt), seqlens_k=t(np.int32(lens_k)), cu_seqlens_q=t(cq),
                                   causal=True, registry=disp, q_descale=qdt, k_descale=kdt, v_descale=vdt,
                                   max_seqlen_q=5, max_seqlen_k=13)
    err = np.abs(out.float().numpy() - want).max() / np.abs(want).max()
    assert err < 2e-2, (qdt.stride(), kdt.stride(), err)
    [plan] = disp.fast_paged.values()
    return plan.entry.sig["qscale"]


assert check(t(qd), t(kd), t(vd)) == "per_token_head"
kp = t(np.ascontiguousarray(kd.transpose(0, 2, 1))).permute(0, 2, 1)      # strides (8, 1, 4)
vp = t(np.ascontiguousarray(vd.transpose(2, 0, 1))).permute(1, 2, 0)      # strides (4, 1, 36)
check(t(np.ascontiguousarray(qd.T)).t(), kp, vp)
ke, ve = (t(x[:, :1, :].copy()).expand(pages, page, hk) for x in (kd, vd))  # one per page: slot stride 0
check(t(qd[:, :1].copy()).expand(sum(lens_q), hq), ke, ve)
check(t(np.float32([0.3])), kp, vp)
one = t(np.float32([0.5]))
assert check(t(qd), one, t(np.float32([2.0]))) == "per_token_head"   # [Tq, Hq] q, one-element K/V: per token too
assert check(one, one, t(np.float32([2.0]))) == "pertensor"
print("per token ok")
'''


def test_per_token_head_descales_through_the_api_any_strides():
    """paged_attention on torch tensors with per-token-head descales, run by Triton's interpreter: contiguous,
    permuted (strides other than the natural ones), expanded (stride 0) and a one-element q -- and a [Tq, Hq] q with
    one-element K/V descales (per token at zero strides) -- each against the reference; the kernel's qscale is the
    call's."""
    run_interpreted(PER_TOKEN, "per token ok", timeout=600)


def test_numpy_fp8_descales_are_numbers():
    kc, vc, bt = _cache([9, 6])
    kw = dict(block_table=bt, seqlens_k=[9, 6], cu_seqlens_q=[0, 1, 2])
    q = np.zeros((2, 4, 16), np.float32)
    for kw2, match in ((dict(q_descale="a", k_descale=1.0, v_descale=1.0), "on NumPy inputs `q_descale` is a number"),
                       (dict(q_descale=np.ones((2, 4)), k_descale=np.ones((6, 2)), v_descale=np.ones((6, 2))),
                        "a per-token `q_descale` \\(2, 4\\) goes with per-token-head \\(or one-element\\) K/V "
                        "descales, not KV block scales"),
                       (dict(q_descale=np.ones((2, 2)), k_descale=1.0, v_descale=1.0),
                        "`q_descale` must be one number or \\[Tq, Hq\\] = \\[2, 4\\] .* got shape \\(2, 2\\)"),
                       (dict(q_descale=np.ones((2, 2)), k_descale=np.ones((6, 4, 2)), v_descale=np.ones((6, 4, 2))),
                        "`q_descale` must be one number or \\[Tq, Hq\\] = \\[2, 4\\] .* got shape \\(2, 2\\)"),
                       (dict(q_descale=1.0, k_descale=np.ones((6, 3, 2)), v_descale=np.ones((6, 3, 2))),
                        "`k_descale` must be .* \\[num_pages, page_size, Hk\\] = \\[6, 4, 2\\] .* shape \\(6, 3, 2\\)"),
                       (dict(q_descale=1.0, k_descale=np.ones((6, 4, 2)), v_descale=np.ones((6, 2))),
                        "`k_descale` and `v_descale` must be of one kind"),
                       (dict(q_descale=np.ones((2, 4, 1)), k_descale=1.0, v_descale=1.0),
                        "`q_descale` is a number or a \\[Tq, Hq\\] array"),
                       (dict(q_descale=1.0, k_descale=np.ones(3), v_descale=1.0),
                        "`k_descale` is a number or a \\[num_pages, Hk\\] array .* shape \\(3,\\)"),
                       (dict(q_descale=1.0, k_descale=np.ones((3, 2)), v_descale=1.0),
                        "`k_descale` and `v_descale` must be of one kind"),
                       (dict(q_descale=1.0, k_descale=np.ones((3, 2)), v_descale=np.ones((3, 2))),
                        "`k_descale` must be \\[num_pages, Hk\\] = \\[6, 2\\] .* got shape \\(3, 2\\)")):
        with pytest.raises(UsageError, match="paged_attention\\(\\): .*" + match) as e:
            fmha_dsl.paged_attention(q, kc, vc, **kw, **kw2)
        assert e.value.hint
    new = dict(block_table=bt, seqlens_k=[9, 6], cu_seqlens_new=[0, 1, 2])
    kn = np.zeros((2, 2, 16), np.float32)
    for kw2, match in ((dict(k_descale=1.0), "append_kv\\(\\): FP8 descales come as a set: v_descale missing"),
                       (dict(k_descale=0.0, v_descale=1.0), "`k_descale` divides .* finite and nonzero, got 0.0"),
                       (dict(k_descale=1.0, v_descale=float("inf")), "`v_descale` divides"),
                       (dict(k_descale=np.ones((6, 2)), v_descale=np.array([[1.0, 0.0]] * 6)),
                        "`v_descale\\[0, 1\\]` divides .* got 0.0")):
        with pytest.raises(UsageError, match=match) as e:
            fmha_dsl.append_kv(kc.copy(), vc.copy(), kn, kn, **new, **kw2)
        assert e.value.hint


SERVING_SET = """kernel_set serving_ci {
    backend(triton)
    arch(gfx942, gfx950, sm90)
    dtype(bf16)
    hdim(128)
    kernel prefill {
        signature { family(batch_prefill) mask(causal) kv_cache(linear, vllm, 16) }
        algorithm { pipeline(qr_async) tile_m0(64) tile_n0(64) tile_k0(128) tile_n1(128) tile_k0max(128) wave_m0(4)
                    padding(true, true, false, false) }
    }
    kernel decode {
        signature { family(fwd_pagedkv) mask(no) kv_cache(linear, sglang, 1) }
        algorithm { pipeline(qr_nwarp_sshuffle) tile_m0(16) tile_n0(64) tile_k0(128) tile_n1(128) tile_k0max(128)
                    wave_m0(4) max_splits_log2(4) }
    }
    kernel append { signature { family(fwd_appendkv) rope(half) paged_kv(true) kv_cache(linear, vllm, 16) } }
}
"""


def test_a_serving_set_builds_for_amd_and_nvidia_without_a_gpu(tmp_path):
    pytest.importorskip("triton")
    from fmha_dsl.build import build

    src = tmp_path / "serving.fmha"
    src.write_text(SERVING_SET)
    res = build(fmha_dsl.load(str(src)), str(tmp_path / "out"), jobs=2, cache_dir=str(tmp_path / "cache"))
    assert not res.failures, res.failures
    assert res.by_arch == {"gfx942": 3, "gfx950": 3, "sm90": 3}
    reg = json.loads((tmp_path / "out" / "registry.json").read_text())
    entries = {k["build"]["entry"] for k in reg["kernels"]}
    assert entries == {"fmha_paged", "fmha_appendkv"}
    for k in reg["kernels"]:
        assert k["build"]["binary_kind"] == ("cubin" if k["gfx_arch"] == "sm90" else "hsaco")
        if k["signature"]["family"] == "fwd_pagedkv":
            assert k["build"]["combine"]["entry"] == "fmha_fwd_combine"
        if k["gfx_arch"] == "sm90" and k["signature"]["family"] == "batch_prefill":
            # K/V behind a page-table load are staged as deep as the forward's: three 64 x (128 + 128) bf16 buffers
            # (the compiler's default for 3 stages gave such loads two)
            assert k["build"]["num_stages"] == 5
            assert k["build"]["shared"] >= 3 * 64 * (128 + 128) * 2


def test_the_shipped_serving_set_checks_on_every_arch_it_names():
    out = subprocess.run([sys.executable, "-m", "fmha_dsl.cli", "check", "serving"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "gfx942: 104, gfx950: 104, sm90: 104" in out.stdout


INTERP = r'''
import os
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch, fmha_dsl
from fmha_dsl.keys import Problem
from fmha_dsl.reference_paged import paged_attention as ref, append_kv as ref_append
from fmha_dsl.runtime.dispatch import Dispatcher

SET = """kernel_set t { backend(triton) arch(sm90) dtype(fp16) hdim(32)
  kernel p { signature { family(batch_prefill) mask(no | causal) lse(true | false)
                         kv_cache(linear | vectorized, vllm | sglang, 16) }
             algorithm { pipeline(qr_async) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32) wave_m0(4)
                         padding(true, true, true, true) } }
  kernel d { signature { family(fwd_pagedkv) mask(no) lse(false) kv_cache(linear, vllm, 16) }
             algorithm { pipeline(qr_nwarp_sshuffle) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32)
                         wave_m0(4) padding(true, true, true, true) max_splits_log2(2) } }
  kernel a { signature { family(fwd_appendkv) rope(none | half | inter) paged_kv(true)
                         kv_cache(linear | vectorized, vllm | sglang, 16) } }
  kernel c { signature { family(fwd_appendkv) rope(inter) paged_kv(false) kv_cache(linear, vllm, 1) } }
}"""
disp = Dispatcher(fmha_dsl.loads(SET).registry(arch="sm90"), "sm90", launcher="interpret")
rng = np.random.default_rng(0)
lens_q, lens_k = [3, 1, 0, 5], [10, 37, 5, 0]
B, P, Hq, Hk, D = 4, 9, 4, 2, 32
perm = rng.permutation(P)
bt = np.zeros((B, 4), np.int32)
bt[0, :1], bt[1, :3], bt[2, :1] = perm[:1], perm[1:4], perm[4:5]
kc = rng.standard_normal((P, 16, Hk, D)).astype(np.float16)
vc = rng.standard_normal((P, 16, Hk, D)).astype(np.float16)
q = rng.standard_normal((sum(lens_q), Hq, D)).astype(np.float16)
cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
T = torch.from_numpy
for causal in (False, True):
    want, wl = ref(q.astype(np.float32), kc.astype(np.float32), vc.astype(np.float32), block_table=bt,
                   seqlens_k=lens_k, cu_seqlens_q=cq, causal="bottom_right" if causal else False, return_lse=True)
    out, lse = fmha_dsl.paged_attention(T(q), T(kc), T(vc), block_table=T(bt), seqlens_k=T(np.int32(lens_k)),
                                        cu_seqlens_q=T(cq), causal=causal, registry=disp, return_lse=True)
    assert np.abs(out.float().numpy() - want).max() < 3e-3, causal
    live = np.isfinite(wl)
    assert np.abs(lse.numpy()[live] - wl[live]).max() < 1e-3
    assert np.array_equal(np.isfinite(lse.numpy()), live)
# a window is a plan of its own in paged_attention()'s cache, apart from its mask alone
n = len(disp.fast_paged)
want, _ = ref(q.astype(np.float32), kc.astype(np.float32), vc.astype(np.float32), block_table=bt,
              seqlens_k=lens_k, cu_seqlens_q=cq, causal="bottom_right", window=(4, 0), return_lse=True)
out, _ = fmha_dsl.paged_attention(T(q), T(kc), T(vc), block_table=T(bt), seqlens_k=T(np.int32(lens_k)),
                                  cu_seqlens_q=T(cq), causal=True, window=(4, 0), registry=disp, return_lse=True)
assert np.abs(out.float().numpy() - want).max() < 3e-3 and len(disp.fast_paged) == n + 1, list(disp.fast_paged)
# CK's vectorized layout: the same values as 5-D caches pick the vectorized kernels
from fmha_dsl.reference_paged import vectorized_caches, linear_caches
k5, v5 = vectorized_caches(T(kc), T(vc))
want = ref(q.astype(np.float32), kc.astype(np.float32), vc.astype(np.float32), block_table=bt, seqlens_k=lens_k,
           cu_seqlens_q=cq, causal="bottom_right")
out = fmha_dsl.paged_attention(T(q), k5, v5, block_table=T(bt), seqlens_k=T(np.int32(lens_k)), cu_seqlens_q=T(cq),
                               causal=True, registry=disp)
assert np.abs(out.float().numpy() - want).max() < 3e-3
print("paged ok")
# the split-KV decode plan (fwd_pagedkv + combine) through the dispatcher
p = Problem(family="fwd_pagedkv", dtype="fp16", hdim_q=32, hdim_v=32, nhead_q=4, nhead_k=2, batch=4, mode="group",
            seqlen_q=1, seqlen_k=40, max_seqlen_q=1, max_seqlen_k=40, paged_kv=True, kv_layout="linear",
            kv_lookup="vllm", page_size=16)
plan = disp.plan(p)
assert plan.splits == 4 and len(plan.stages) == 2, plan
q1 = rng.standard_normal((4, Hq, D)).astype(np.float16)
out = torch.empty(4, Hq, D, dtype=torch.float16)
plan.run(T(q1), T(kc), T(vc), out, block_table=T(bt), seqlens_k=T(np.int32(lens_k)),
         cu_seqlens_q=T(np.arange(5, dtype=np.int32)), max_seqlen_q=1, max_seqlen_k=40)
want = ref(q1.astype(np.float32), kc.astype(np.float32), vc.astype(np.float32), block_table=bt, seqlens_k=lens_k,
           cu_seqlens_q=np.arange(5))
assert np.abs(out.float().numpy() - want).max() < 3e-3
try:  # a caller's workspace too small for the split plan: located, with the sizing function in the hint
    plan.run(T(q1), T(kc), T(vc), out, block_table=T(bt), seqlens_k=T(np.int32(lens_k)),
             cu_seqlens_q=T(np.arange(5, dtype=np.int32)), max_seqlen_q=1, max_seqlen_k=40,
             workspace=torch.empty(3))
    raise AssertionError("a 3-element workspace was accepted")
except fmha_dsl.UsageError as exc:
    assert "workspace must be" in str(exc) and "workspace_numel" in str(exc.diagnostics[0].hint)
print("split ok")
# append-KV: paged (rope half) and contiguous (rope inter), q rotated in place
half = 8
th = np.arange(64)[:, None] * (10000.0 ** (-np.arange(half) / half))
cos, sin = np.cos(th).astype(np.float32), np.sin(th).astype(np.float32)
kn = rng.standard_normal((4, Hk, D)).astype(np.float16)
vn = rng.standard_normal((4, Hk, D)).astype(np.float16)
qn = rng.standard_normal((4, Hq, D)).astype(np.float16)
cn, lens2 = np.array([0, 1, 1, 3, 4], np.int32), np.array([10, 30, 5, 0], np.int32)
bt2 = bt.copy()
bt2[3, 0] = perm[5]
for inter, tab in ((False, {"block_table": bt2}), (True, None)):
    if tab is None:
        kcache, vcache = np.zeros((4, 40, Hk, D), np.float16), np.zeros((4, 40, Hk, D), np.float16)
        rt = {"block_table": np.arange(4, dtype=np.int32)[:, None]}
    else:
        kcache, vcache, rt = kc.copy(), vc.copy(), tab
    wk, wv, wq = ref_append(kcache.astype(np.float32), vcache.astype(np.float32), kn, vn, seqlens_k=lens2,
                            cu_seqlens_new=cn, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=inter, q=qn, **rt)
    kt, vt, qt = T(kcache.copy()), T(vcache.copy()), T(qn.copy())
    fmha_dsl.append_kv(kt, vt, T(kn), T(vn), seqlens_k=T(lens2), cu_seqlens_new=T(cn), rotary_cos=T(cos),
                       rotary_sin=T(sin), rotary_interleaved=inter, q=qt, registry=disp,
                       **({k: T(v) for k, v in tab.items()} if tab else {}))
    for got, w in ((kt, wk), (vt, wv), (qt, wq)):
        assert np.abs(got.float().numpy() - w).max() < 3e-3
kn2 = rng.standard_normal((4, Hk, D)).astype(np.float16)
wk, wv, _ = ref_append(kc.astype(np.float32), vc.astype(np.float32), kn2, kn2, seqlens_k=lens2, cu_seqlens_new=cn,
                       block_table=bt2)
k5, v5 = vectorized_caches(T(kc.copy()), T(vc.copy()))
fmha_dsl.append_kv(k5, v5, T(kn2), T(kn2), seqlens_k=T(lens2), cu_seqlens_new=T(cn), block_table=T(bt2),
                   registry=disp)
gk, gv = linear_caches(k5, v5)
assert np.abs(gk.float().numpy() - wk).max() < 3e-3 and np.abs(gv.float().numpy() - wv).max() < 3e-3
print("append ok")
# an index past int32 is refused, never cast (2**32 + 3 read as page 3, a length of 2**32 + 10 as 10)
big = 2**32
for kw, name in (({"seqlens_k": torch.tensor([big + 10, 37, 5, 0])}, "seqlens_k"),
                 ({"block_table": torch.tensor(bt.astype(np.int64) + np.array([[big, 0, 0, 0]] + [[0] * 4] * 3))},
                  "block_table"),
                 ({"cu_seqlens_q": [0, big + 3, big + 4, big + 4, big + 9]}, "cu_seqlens_q"),
                 ({"seqlens_k": np.array([2**64 - 1, 37, 5, 0], np.uint64)}, "seqlens_k")):
    args = dict(block_table=T(bt), seqlens_k=T(np.int32(lens_k)), cu_seqlens_q=T(cq))
    args.update(kw)
    try:
        fmha_dsl.paged_attention(T(q), T(kc), T(vc), registry=disp, **args)
        raise AssertionError(f"{name} past int32 was accepted")
    except fmha_dsl.UsageError as exc:
        assert f"`{name}` holds" in str(exc) and "outside int32" in str(exc), exc
ip = torch.tensor([0, 1, 4, 5, 5])
ix = torch.tensor([int(perm[0]), int(perm[1]), big + int(perm[2]), int(perm[3]), int(perm[4])])
try:
    fmha_dsl.paged_attention(T(q), T(kc), T(vc), kv_indptr=ip, kv_indices=ix, seqlens_k=T(np.int32(lens_k)),
                             cu_seqlens_q=T(cq), registry=disp)
    raise AssertionError("kv_indices past int32 was accepted")
except fmha_dsl.UsageError as exc:
    assert "`kv_indices` holds" in str(exc), exc
e = fmha_dsl.paged_attention(T(q[:0]), T(kc), T(vc), block_table=T(bt[:0]), seqlens_k=[], cu_seqlens_q=[0],
                             registry=disp)   # an empty batch given as lists
assert e.shape == (0, Hq, D)
print("int32 ok")
# two sequences appending into one slot: refused on the host check (no max_seqlen_new given), as on NumPy
one = torch.ones(2, Hk, D, dtype=torch.float16)
try:
    fmha_dsl.append_kv(T(kc.copy()), T(vc.copy()), one, one, block_table=T(np.array([[3], [3]], np.int32)),
                       seqlens_k=T(np.array([3, 3], np.int32)), cu_seqlens_new=T(np.array([0, 1, 2], np.int32)),
                       registry=disp)
    raise AssertionError("two appends into one slot were accepted")
except fmha_dsl.UsageError as exc:
    assert "both appended to page 3, slot 3" in str(exc), exc
print("slots ok")
# workspace_numel's arguments, and a caller's workspace checked whatever plan the call gets (this one: no split)
ws_args = dict(batch=4, max_seqlen_q=8, max_seqlen_k=40, registry=disp)
assert fmha_dsl.paged.workspace_numel(T(q), T(kc), T(vc), **ws_args) > 0
for change, text in (({"max_seqlen_k": None}, "`max_seqlen_k` must be an int >= 0, got None"),
                     ({"batch": 4.5}, "`batch` must be an int >= 0, got 4.5"),
                     ({"k_cache": kc}, "`k_cache` must be a torch tensor like q"),
                     ({"q": T(q[0])}, "`q` must be 3-D [Tq, Hq, D]")):
    a = dict(ws_args, q=T(q), k_cache=T(kc), v_cache=T(vc))
    a.update(change)
    try:
        fmha_dsl.paged.workspace_numel(a.pop("q"), a.pop("k_cache"), a.pop("v_cache"), **a)
        raise AssertionError(f"{change} was accepted")
    except fmha_dsl.UsageError as exc:
        assert "workspace_numel(): " + text in str(exc), exc
for bad, text in (([0.0] * 10, "workspace must be a torch tensor"), (np.zeros(10, np.float32), "must be a torch"),
                  (torch.zeros(10, dtype=torch.int32), "contiguous float32 tensor"),
                  (torch.zeros(20)[::2], "(not contiguous)")):
    try:
        fmha_dsl.paged_attention(T(q), T(kc), T(vc), block_table=T(bt), seqlens_k=T(np.int32(lens_k)),
                                 cu_seqlens_q=T(cq), registry=disp, workspace=bad)
        raise AssertionError(f"workspace {type(bad)} was accepted")
    except fmha_dsl.UsageError as exc:
        assert text in str(exc) and "workspace_numel" in str(exc.diagnostics[0].hint), exc
print("workspace ok")
# append_kv names what is wrong: a NumPy cache or q beside torch rows, integer rotary tables
for kw, text in (({"k_cache": kc}, "`k_cache` must be a torch tensor like k_new"),
                 ({"q": qn}, "`q` must be a torch tensor like k_new, got ndarray"),
                 ({"rotary_cos": torch.ones(64, 8, dtype=torch.int32), "rotary_sin": T(sin)},
                  "`rotary_cos` must hold floats (float32), got torch.int32")):
    a = dict(k_cache=T(kc.copy()), v_cache=T(vc.copy()), block_table=T(bt2), seqlens_k=T(lens2), cu_seqlens_new=T(cn))
    a.update(kw)
    try:
        fmha_dsl.append_kv(a.pop("k_cache"), a.pop("v_cache"), T(kn), T(vn), registry=disp, **a)
        raise AssertionError(f"{list(kw)} was accepted")
    except fmha_dsl.UsageError as exc:
        assert text in str(exc), exc
print("names ok")
'''


def test_the_torch_path_end_to_end_under_the_interpreter():
    run_interpreted(INTERP, "names ok", timeout=600)


def test_decode_gets_the_short_split_tiles_at_any_batch_and_prefill_only_when_the_grid_is_small():
    """First use of paged attention: a decode problem (at most 16 query rows per K/V head) is offered the split-KV
    family's 16-row tiles whatever its batch (a 64-row prefill tile spends its loop on rows decode does not have);
    a large prefill is not, a small-grid prefill is (split-KV fills the device)."""
    from fmha_dsl.first_use import Builder
    from fmha_dsl.keys import Problem

    def fams(batch, sq, hq=64, limit=24):
        p = Problem(family="batch_prefill", dtype="bf16", mode="group", batch=batch, nhead_q=hq, nhead_k=8,
                    seqlen_q=sq, seqlen_k=8192, max_seqlen_q=sq, max_seqlen_k=8192, hdim_q=128, hdim_v=128,
                    paged_kv=True, kv_layout="linear", kv_lookup="vllm", page_size=16)
        return {e.sig["family"]: e for e in Builder().candidates(p, "sm90", limit=limit)}

    big_decode = fams(128, 1)  # 1,024 GQA-packed programs: more than two waves
    assert "fwd_pagedkv" in big_decode and big_decode["fwd_pagedkv"].alg["tile"][0] == 16
    assert "batch_prefill" in big_decode
    assert "fwd_pagedkv" in fams(128, 2)            # 2 x 8 = 16 rows per K/V head: still decode
    assert "fwd_pagedkv" not in fams(128, 4)        # 32 rows, 128 x 8 programs: prefill-like
    assert "fwd_pagedkv" in fams(1, 512)            # a small grid: split-KV candidates as before
