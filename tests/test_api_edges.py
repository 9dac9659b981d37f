"""The NumPy API at the edges of its arguments' ranges: values that used to give NaN, a non-FmhaError exception or a
message naming the wrong argument (found by fuzzing the four API functions against an independent float64 oracle).
Each case asserts the located error, or the result an independent computation gives."""

import numpy as np
import pytest

import fmha_dsl
from fmha_dsl import FmhaError, UsageError

A, AB, PA, AK = fmha_dsl.attention, fmha_dsl.attention_backward, fmha_dsl.paged_attention, fmha_dsl.append_kv


def _rng(seed=0):
    return np.random.default_rng(seed)


def _qkv(b=1, h=2, s=5, d=8):
    r = _rng()
    return tuple(r.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))


def _naive(q, k, v, scale):
    """softmax(scale q k^T) v in float64, one head at a time (no mask)."""
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def _raises(fn, rule, *fragments, **kw):
    with pytest.raises(UsageError) as e:
        fn(**kw)
    d = e.value.diagnostics[0]
    assert d.rule == rule, str(e.value)
    for f in fragments:
        assert f in d.message, d.message
    assert d.hint, f"no hint: {d.message}"
    assert "hint: " + d.hint in str(e.value)   # str() carries the hint (tracebacks and logs show it)
    return d


@pytest.mark.parametrize("kw,text", [
    ({"softcap": 1e39}, "softcap must be None (off) or a number in [2**-126"),
    ({"softcap": 1e-50}, "softcap must be None (off) or a number in [2**-126"),
    ({"scale": 1e39}, "scale must be a finite number of magnitude <= 2.36e+38"),
    ({"scale": 10 ** 400}, "got 1000000000000000000000000000000000000..."),   # an int too big for a float
    ({"softcap": 10 ** 400}, "softcap must be None"),
])
def test_scalars_outside_float32_are_refused_not_nan(kw, text):
    q, k, v = _qkv()
    _raises(lambda: A(q, k, v, **kw), "usage.value", text)


def test_the_extremes_of_the_float32_range_still_compute():
    q, k, v = _qkv()
    got = A(q, k, v, softcap=2.0 ** -126)   # every logit capped to ~0: a uniform average of V
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, np.broadcast_to(v.mean(axis=2, keepdims=True), got.shape), rtol=1e-5, atol=1e-6)
    got = A(q, k, v, scale=0.0)
    np.testing.assert_allclose(got, _naive(q, k, v, 0.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [(10 ** 30, 0), (np.uint64(2 ** 64 - 1), 0), (-10 ** 30, 10 ** 30)])
def test_a_window_wider_than_int64_is_the_unbounded_one(window):
    q, k, v = _qkv(s=7)
    left, right = (int(x) for x in window)
    want = A(q, k, v, window=(-1 if left < 0 else 100, -1 if right < 0 else (0 if right == 0 else 100)))
    np.testing.assert_array_equal(A(q, k, v, window=window), want)


def test_non_finite_alibi_slopes_are_refused():
    q, k, v = _qkv()
    _raises(lambda: A(q, k, v, alibi_slopes=np.array([0.5, np.inf], np.float32)), "usage.value",
            "`alibi_slopes[1]` is inf")


def test_backward_refuses_a_nan_lse_instead_of_zero_gradients():
    q, k, v = _qkv()
    o, lse = A(q, k, v, return_lse=True)
    for bad in (np.nan, np.inf):
        l2 = lse.copy()
        l2[0, 1, 2] = bad
        _raises(lambda: AB(q, k, v, o, l2, o), "usage.value", f"`lse[0, 1, 2]` is {bad}")
    l2 = lse.copy()
    l2[0, 1, 2] = -np.inf   # -inf is a row that saw no key; this one saw keys: not the forward's LSE
    _raises(lambda: AB(q, k, v, o, l2, o), "usage.value", "`lse[0, 1, 2]` is not the forward's LSE")
    k2, v2 = k[:, :, :2], v[:, :, :2]   # causal bottom-right with Sq > Sk: the first rows see no key
    o, lse = A(q, k2, v2, causal="bottom_right", return_lse=True)
    assert lse[0, 1, 0] == -np.inf
    dq = AB(q, k2, v2, o, lse, o, causal="bottom_right")[0]
    assert np.all(dq[0, 1, 0] == 0) and np.isfinite(dq).all()


@pytest.mark.parametrize("change,what", [
    ({"causal": True}, "sum to"),                 # the forward had no mask: the backward forgot nothing, added one
    ({"softcap": 2.0}, "sum to"),
    ({"scale": 0.5}, "sum to"),
    ({"bias": "ones"}, "sum to"),
])
def test_backward_refuses_another_calls_lse(change, what):
    """The forward's LSE normalises each row's scores under the same arguments; the backward's keywords (or its lse)
    differing from the forward's gave silently wrong gradients (dq off by 23 with causal forgotten)."""
    q, k, v = _qkv()
    o, lse = A(q, k, v, return_lse=True)
    kw = {n: (np.ones(q.shape[:3] + k.shape[2:3], q.dtype) if x == "ones" else x) for n, x in change.items()}
    _raises(lambda: AB(q, k, v, o, lse, o, **kw), "usage.value", "is not the forward's LSE for these arguments")
    o2, lse2 = A(q, k, v, return_lse=True, **kw)   # the forward with the same keywords: accepted
    AB(q, k, v, o2, lse2, o2, **kw)
    o3, lse3 = A(q, k, v, causal=True, return_lse=True)   # and the reverse: causal forward, unmasked backward
    _raises(lambda: AB(q, k, v, o3, lse3, o3), "usage.value", what)


@pytest.mark.parametrize("kw,text", [
    ({"dropout_p": np.array([0.1, 0.2]), "seed": 1}, "dropout_p must be in [0, 1)"),
    ({"dropout_p": 0.1, "seed": np.array([1, 2])}, "seed must be an int"),
])
def test_backward_array_scalars_are_usage_errors(kw, text):
    q, k, v = _qkv()
    o, lse = A(q, k, v, return_lse=True)
    _raises(lambda: AB(q, k, v, o, lse, o, **kw), "usage.value", text)


@pytest.mark.parametrize("fn", ["forward", "backward"])
def test_numpy_checks_max_seqlen_as_the_torch_path_does(fn):
    r = _rng()
    q, k = r.standard_normal((5, 1, 4)).astype(np.float32), r.standard_normal((7, 1, 4)).astype(np.float32)
    cu = {"cu_seqlens_q": np.array([0, 5], np.int32), "cu_seqlens_k": np.array([0, 7], np.int32)}
    o, lse = A(q, k, k, return_lse=True, **cu)
    call = (lambda **kw: A(q, k, k, **cu, **kw)) if fn == "forward" else (lambda **kw: AB(q, k, k, o, lse, o, **cu,
                                                                                         **kw))
    _raises(lambda: call(max_seqlen_q=1), "usage.value", "max_seqlen_q=1 is below the longest sequence (5)")
    _raises(lambda: call(max_seqlen_k="x"), "usage.value", "max_seqlen_k must be an int >= 0, got 'x'")
    call(max_seqlen_q=5, max_seqlen_k=9)   # an upper bound is fine
    qb, kb, vb = _qkv(s=6)
    _raises(lambda: A(qb, kb, vb, max_seqlen_k=5), "usage.value", "max_seqlen_k=5 is below the longest sequence (6)")


@pytest.mark.parametrize("fn", ["forward", "backward"])
def test_numpy_checks_max_seqlen_before_it_computes(fn, monkeypatch):
    import fmha_dsl.reference as ref
    import fmha_dsl.reference_bwd as ref_bwd

    q, k, v = _qkv(s=6)
    o, lse = A(q, k, v, return_lse=True)

    def computed(*a, **kw):
        raise AssertionError("the reference computed before it checked max_seqlen_q")
    monkeypatch.setattr(ref, "_head", computed)
    monkeypatch.setattr(ref_bwd, "_head", computed)
    call = A if fn == "forward" else (lambda q, k, v, **kw: AB(q, k, v, o, lse, o, **kw))
    _raises(lambda: call(q, k, v, max_seqlen_q=2), "usage.value", "max_seqlen_q=2 is below the longest sequence (6)")


@pytest.mark.parametrize("arg", ["cu_seqlens_q", "alibi_slopes", "bias"])
def test_ragged_lists_are_usage_errors(arg):
    r = _rng()
    q, k = r.standard_normal((5, 2, 4)).astype(np.float32), r.standard_normal((7, 2, 4)).astype(np.float32)
    kw = {"cu_seqlens_q": [0, 3, 5], "cu_seqlens_k": [0, 3, 7]}
    kw[arg] = [0, [3], 5]
    text = "must be an array (or nested lists of one shape)" if arg == "cu_seqlens_q" else \
        "must be a numpy array like q, got list"   # (as the torch path takes tensors only for them)
    _raises(lambda: A(q, k, k, **kw), "usage.type", f"`{arg}` {text}")


@pytest.mark.parametrize("fn", ["forward", "backward"])
@pytest.mark.parametrize("kw,rule,text", [
    ({"bias": np.zeros((1, 1, 6, 6), np.float16)}, "usage.dtype", "`bias` must have q's dtype float32, got float16"),
    ({"alibi_slopes": [0.5, 0.25]}, "usage.type", "`alibi_slopes` must be a numpy array like q, got list"),
    ({"registry": "out/registry.json"}, "usage.value", "`registry` picks GPU kernels"),
    ({"cu_seqlens_q": "torch"}, "usage.type", "`cu_seqlens_q` is a torch tensor but q is a numpy array"),
])
def test_numpy_calls_take_what_the_torch_path_takes(fn, kw, rule, text):
    q, k, v = _qkv(s=6)
    o, lse = A(q, k, v, return_lse=True)
    if kw.get("cu_seqlens_q") == "torch":
        torch = pytest.importorskip("torch")
        kw = {"cu_seqlens_q": torch.tensor([0, 6], dtype=torch.int32), "cu_seqlens_k": np.array([0, 6], np.int32)}
        q, k, v, o = q[0].transpose(1, 0, 2), k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2), o[0].transpose(1, 0, 2)
        lse = lse[0]
    call = (lambda **x: A(q, k, v, **x)) if fn == "forward" else (lambda **x: AB(q, k, v, o, lse, o, **x))
    _raises(lambda: call(**kw), rule, text)


# --- paged_attention / append_kv ---------------------------------------------------------------------------------
def _paged(**over):
    r = _rng(1)
    kc = r.standard_normal((4, 2, 1, 4)).astype(np.float32)
    kw = dict(q=r.standard_normal((1, 1, 4)).astype(np.float32), k_cache=kc, v_cache=kc.copy(),
              block_table=np.array([[2, 1]], np.int32), seqlens_k=np.array([3], np.int32),
              cu_seqlens_q=np.array([0, 1], np.int32))
    kw.update(over)
    return kw


def test_a_ragged_block_table_is_a_usage_error():
    _raises(lambda: PA(**_paged(block_table=[[0, 1, 2], [3]], seqlens_k=[3, 1], cu_seqlens_q=[0, 1, 1])),
            "usage.type", "`block_table` must be an array")


def test_a_broadcast_block_table_reads_only_the_pages_it_uses():
    kw = _paged()
    want = PA(**kw)
    wide = np.broadcast_to(np.int32(0), (1, 2 ** 36))   # 2**36 columns (256 GiB as int32), one value
    kw["block_table"] = wide
    got = PA(**kw)   # used to materialise the whole table (MemoryError)
    kw["block_table"] = np.zeros((1, 2), np.int32)
    np.testing.assert_array_equal(got, PA(**kw))
    assert not np.array_equal(got, want)   # (pages 2, 1 against 0, 0: a different result, so the table was read)


@pytest.mark.parametrize("over,rule,text", [
    ({"q_descale": float("nan"), "k_descale": 1.0, "v_descale": 1.0}, "usage.value", "`q_descale` must be finite"),
    ({"q_descale": 1.0, "k_descale": -np.inf, "v_descale": 1.0}, "usage.value", "`k_descale` scales the FP8"),
    ({"q_descale": False, "k_descale": 1.0, "v_descale": 1.0}, "usage.value", "`q_descale` is a number"),
    ({"q_descale": 1.0, "k_descale": 10 ** 400, "v_descale": 1.0}, "usage.value", "is beyond float64"),
])
def test_fp8_descales_are_checked_on_numpy(over, rule, text):
    _raises(lambda: PA(**_paged(**over)), rule, text)


@pytest.mark.parametrize("name", ["q", "k_cache", "v_cache"])
def test_numpy_fp8_inputs_must_hold_e4m3_values_where_attention_reads_them(name):
    from fmha_dsl.fp8 import round_e4m3

    descales = dict(q_descale=1.0, k_descale=2.0, v_descale=1.0)
    kw = _paged(**descales)
    for n in ("q", "k_cache", "v_cache"):
        kw[n] = round_e4m3(kw[n])
    kw["k_cache"][0], kw["v_cache"][3] = 0.1, np.inf   # pages no sequence reads (the table holds 2, 1) may hold anything
    want = PA(**kw)
    assert want.dtype == np.float64 and np.isfinite(want).all()
    kw[name] = kw[name].copy()
    kw[name][(0, 0, 0) if name == "q" else (1, 0, 0, 2)] = 0.1   # 0.1 lies between e4m3's 0.1015625 and 0.09375
    _raises(lambda: PA(**kw), "usage.value", f"`{name}` holds 0.1")


@pytest.mark.parametrize("form", ["blocks", "tokens"])
def test_numpy_fp8_descales_must_be_finite_on_the_slots_attention_reads(form):
    """Block (per-page) and per-token descales are read where attention reads the cache: a NaN or inf there was a
    NaN output; elsewhere (page 0 and 3: no sequence reads them; slot 1 of page 1: past the 3 keys) anything goes."""
    from fmha_dsl.fp8 import round_e4m3

    kw = _paged()
    for n in ("q", "k_cache", "v_cache"):
        kw[n] = round_e4m3(kw[n])
    shape = (4, 1) if form == "blocks" else (4, 2, 1)
    unread = np.ones(shape)
    unread[0] = unread[3] = np.nan
    if form == "tokens":
        unread[1, 1] = np.inf   # the table holds 2, 1: keys 0-1 on page 2, key 2 on page 1 slot 0
    out = PA(**kw, q_descale=1.0, k_descale=unread, v_descale=unread.copy())
    assert np.isfinite(out).all()
    for name in ("k_descale", "v_descale"):
        bad = unread.copy()
        bad[(1, 0) if form == "blocks" else (1, 0, 0)] = np.inf
        d = {"k_descale": unread, "v_descale": unread, name: bad}
        at = "[1, 0]" if form == "blocks" else "[1, 0, 0]"
        _raises(lambda: PA(**kw, q_descale=1.0, **d), "usage.value", f"`{name}{at}` scales a page attention reads")
    _raises(lambda: PA(**kw, q_descale=1e30, k_descale=1e30 * unread, v_descale=unread), "usage.value",
            "scale x q_descale x k_descale reaches")


def test_an_append_never_writes_two_rows_into_one_slot():
    kc = np.zeros((4, 16, 1, 8), np.float32)
    one = np.ones((2, 1, 8), np.float32)
    _raises(lambda: fmha_dsl.append_kv(kc, kc.copy(), one, one, block_table=np.array([[0], [0]]),
                                       seqlens_k=np.array([3, 3]), cu_seqlens_new=np.array([0, 1, 2])),
            "usage.value", "sequence 0's token 3 and sequence 1's token 3 are both appended to page 0, slot 3")
    many = np.ones((20, 1, 8), np.float32)   # one sequence whose table names page 1 twice
    _raises(lambda: fmha_dsl.append_kv(kc, kc.copy(), many, many, block_table=np.array([[1, 1]]),
                                       seqlens_k=np.array([3]), cu_seqlens_new=np.array([0, 20])),
            "usage.value", "sequence 0's token 3 and sequence 0's token 19 are both appended to page 1, slot 3")
    shared = np.array([[0, 1], [0, 2]])   # a shared prefix page (0) is fine: the new rows go to pages 1 and 2
    fmha_dsl.append_kv(kc, kc.copy(), one, one, block_table=shared, seqlens_k=np.array([16, 16]),
                       cu_seqlens_new=np.array([0, 1, 2]))


def test_paged_q_dtype_is_checked_before_descales_convert_it():
    kw = _paged(q_descale=1.0, k_descale=1.0, v_descale=1.0)
    kw["q"] = kw["q"].astype(np.complex64)
    _raises(lambda: PA(**kw), "usage.dtype", "`q` must be float16, float32 or float64, got dtype complex64")


def test_paged_cache_dtypes_name_the_cache_that_differs():
    kw = _paged()
    kw["v_cache"] = kw["v_cache"].astype(np.float64)
    _raises(lambda: PA(**kw), "usage.dtype", "`v_cache` must have k_cache's dtype float32, got float64")


def test_unsigned_cu_seqlens_past_int64_are_named_not_wrapped():
    _raises(lambda: PA(**_paged(cu_seqlens_q=np.array([0, 2 ** 63 + 5, 1], np.uint64))), "usage.value",
            "`cu_seqlens_q` holds 9223372036854775813, beyond int64")


def _append(**over):
    kc = np.zeros((1, 4, 1, 4), np.float32)
    kw = dict(k_cache=kc, v_cache=kc.copy(), k_new=np.ones((1, 1, 4), np.float32),
              v_new=np.ones((1, 1, 4), np.float32), seqlens_k=np.array([1]), cu_seqlens_new=np.array([0, 1]))
    kw.update(over)
    return kw


def test_append_near_int64_max_is_a_usage_error():
    _raises(lambda: AK(**_append(block_table=[[0]], seqlens_k=np.array([2 ** 63 - 1]))), "usage.value",
            "9223372036854775807 cached + 1 new tokens need")


@pytest.mark.parametrize("over,rule,text", [
    ({"seqlens_k": np.array([4])}, "usage.value", "sequence 0: 4 cached + 1 new tokens exceed the cache's capacity 4"),
    ({"seqlens_k": np.array([1, 1]), "cu_seqlens_new": np.array([0, 1, 1])}, "usage.shape",
     "without a page table the caches are contiguous [B, capacity, Hk, D] with B = 2"),
    ({"max_seqlen_new": 0}, "usage.value", "max_seqlen_new=0 is below the longest sequence (1)"),
])
def test_append_to_a_contiguous_cache_speaks_of_rows_not_pages(over, rule, text):
    d = _raises(lambda: AK(**_append(**over)), rule, text)
    assert "block_table" not in d.message and d.message.count("append_kv()") == 1


def test_append_max_seqlen_new_at_the_longest_is_accepted():
    kw = _append(max_seqlen_new=1)
    AK(**kw)
    np.testing.assert_array_equal(kw["k_cache"][0, 1], np.ones((1, 4), np.float32))


def test_every_error_str_is_one_line_with_its_hint():
    with pytest.raises(FmhaError) as e:
        A(*_qkv(), scale=float("nan"))
    assert "\n" not in str(e.value) and str(e.value).endswith("(hint: None means 1/sqrt(Dq))")


def test_a_float64_run_of_the_backward_reference_takes_a_float64_lse():
    """The GPU tests check the kernels against the reference in float64, handing it the kernels' LSE as float64."""
    from fmha_dsl.reference_bwd import attention_bwd

    q, k, v = (x.astype(np.float64) for x in _qkv())
    o, lse = A(q, k, v, return_lse=True)
    got64 = attention_bwd(q, k, v, o, lse.astype(np.float64), o, accum=np.float64)
    got32 = attention_bwd(q, k, v, o, lse.astype(np.float32), o, accum=np.float64)
    for a, b in zip(got64[:3], got32[:3]):
        np.testing.assert_array_equal(a, b)   # (the LSE is read in float32 either way)
    with pytest.raises(UsageError, match=r"`lse` must be the forward's float32 LSE \(or float64\), got dtype float16"):
        attention_bwd(q, k, v, o, lse.astype(np.float16), o, accum=np.float64)


def test_every_api_usage_error_carries_a_hint():
    """Each ``_usage(rule, message, hint)`` of the API's argument checks (NumPy and torch paths) names a hint: a
    user who passes a bad argument learns what to pass instead (read from the source, so a new check needs one)."""
    import ast
    import pathlib

    root = pathlib.Path(fmha_dsl.__file__).parent
    missing = []
    for name in ("attention_args", "attention", "attention_bwd", "reference", "reference_bwd", "reference_paged",
                 "paged", "paged_args", "paged_numpy"):
        src = (root / f"{name}.py").read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_usage" \
                    and len(node.args) < 3 and not any(k.arg == "hint" for k in node.keywords):
                missing.append(f"{name}.py:{node.lineno}")
    assert not missing, missing


def test_append_checks_the_block_descales_of_the_pages_it_writes_only():
    """A server's [num_pages, Hk] descales of pages an append does not write may hold anything; the pages it writes
    divide its new rows, so theirs must be finite and nonzero."""
    from fmha_dsl.fp8 import round_e4m3

    kc = round_e4m3(np.zeros((3, 4, 1, 8), np.float32))
    new = np.ones((2, 1, 8), np.float32)
    kw = dict(block_table=np.array([[1]], np.int32), seqlens_k=np.array([1]), cu_seqlens_new=np.array([0, 2]))
    ds = np.ones((3, 1))
    ds[[0, 2]] = np.nan   # pages 0 and 2: not written
    k, v = kc.copy(), kc.copy()
    AK(k, v, new, new, k_descale=ds, v_descale=ds.copy(), **kw)
    np.testing.assert_array_equal(k[1, 1:3, 0], np.ones((2, 8)))   # (1 / descale 1, on e4m3's grid)
    assert np.all(k[[0, 2]] == 0) and np.all(k[1, [0, 3]] == 0)
    ds[1] = 0.0   # the written page's
    _raises(lambda: AK(kc.copy(), kc.copy(), new, new, k_descale=ds, v_descale=ds.copy(), **kw), "usage.value",
            "`k_descale[1, 0]` divides the new rows into the FP8 cache: it must be finite and nonzero")


@pytest.mark.parametrize("causal", ["causal", 1, "bottom-right"])
def test_paged_causal_errors_say_what_true_means_there(causal):
    """paged_attention's causal=True is bottom-right (unlike attention's): its hint must not say top-left."""
    r = _rng()
    q, kc = r.standard_normal((4, 2, 16)).astype(np.float32), r.standard_normal((4, 16, 1, 16)).astype(np.float32)
    with pytest.raises(UsageError) as info:
        fmha_dsl.paged_attention(q, kc, kc, block_table=np.array([[0, 1]], np.int32),
                                 seqlens_k=np.array([20], np.int32), cu_seqlens_q=np.array([0, 4], np.int32),
                                 causal=causal)
    e = info.value
    assert e.rule == "usage.value" and "paged_attention()" in str(e) and "top-left" not in e.hint
    assert "bottom" in e.hint


def test_numpy_append_errors_name_the_array_the_call_was_read_from():
    torch = pytest.importorskip("torch")
    kc = np.zeros((4, 4, 2, 16), np.float32)
    kn = np.ones((3, 2, 16), np.float32)
    with pytest.raises(UsageError) as info:
        fmha_dsl.append_kv(kc, kc.copy(), kn, kn, block_table=torch.zeros((2, 2), dtype=torch.int32),
                           seqlens_k=[1, 1], cu_seqlens_new=[0, 2, 3])
    assert "`block_table` is a torch tensor but k_new is a numpy array" in str(info.value)


@pytest.mark.parametrize("fn,left_out", [("paged", "seqlens_k"), ("paged", "cu_seqlens_q"), ("append", "seqlens_k"),
                                         ("append", "cu_seqlens_new")])
def test_a_required_serving_keyword_left_out_is_a_usage_error(fn, left_out):
    """Not Python's TypeError (README: every error is an FmhaError), nor `None` read as an array of dtype object."""
    kc = np.ones((4, 16, 1, 16), np.float32)
    if fn == "paged":
        kw = {"seqlens_k": np.array([20], np.int32), "cu_seqlens_q": np.array([0, 4], np.int32)}
        kw.pop(left_out)
        call = lambda: fmha_dsl.paged_attention(np.ones((4, 2, 16), np.float32), kc, kc,  # noqa: E731
                                                block_table=np.array([[0, 1]], np.int32), **kw)
    else:
        kw = {"seqlens_k": [1], "cu_seqlens_new": [0, 3]}
        kw.pop(left_out)
        kn = np.ones((3, 1, 16), np.float32)
        call = lambda: fmha_dsl.append_kv(kc.copy(), kc.copy(), kn, kn,  # noqa: E731
                                          block_table=np.array([[0, 1]], np.int32), **kw)
    with pytest.raises(UsageError) as info:
        call()
    assert info.value.rule == "usage.missing" and f"`{left_out}` is required" in str(info.value) and info.value.hint


def test_the_reference_refuses_non_finite_inputs_where_it_reads_them():
    """The reference multiplies every V row by its probability (0 where masked), so a NaN anywhere is a NaN out,
    where the kernels skip masked blocks: non-finite q, k, v, out, dout and +inf/NaN bias entries are errors."""
    q, k, v = _qkv()
    for name, i in (("q", 0), ("k", 1), ("v", 2)):
        for bad in (np.nan, np.inf, -np.inf):
            x = [q, k, v]
            x[i] = x[i].copy()
            x[i][0, 1, 3, 2] = bad
            _raises(lambda: A(*x), "usage.value", f"`{name}[0, 1, 3, 2]` is {bad}")
    bias = np.zeros((1, 1, 5, 5), np.float32)
    bias[0, 0, 1, 2] = -np.inf   # -inf masks: allowed
    assert np.isfinite(A(q, k, v, bias=bias)).all()
    for bad in (np.nan, np.inf):
        b2 = bias.copy()
        b2[0, 0, 4, 0] = bad
        _raises(lambda: A(q, k, v, bias=b2), "usage.value", f"`bias[0, 0, 4, 0]` is {bad}")
    # group mode: a bias entry no sequence reads (past sequence 0's 2 x 3 corner, sequence 1 is empty) may be NaN
    gq, gk, gv = q[0].transpose(1, 0, 2)[:2], k[0].transpose(1, 0, 2)[:3], v[0].transpose(1, 0, 2)[:3]
    cq, ck = np.array([0, 2, 2], np.int32), np.array([0, 3, 3], np.int32)
    gb = np.full((1, 2, 4, 4), np.nan, np.float32)
    gb[:, :, :2, :3] = 0.5
    out = A(gq, gk, gv, bias=gb, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=4, max_seqlen_k=4)
    assert np.isfinite(out).all()
    gb[0, 1, 1, 2] = np.nan
    _raises(lambda: A(gq, gk, gv, bias=gb, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=4, max_seqlen_k=4),
            "usage.value", "`bias[0, 1, 1, 2]` is nan")
    o, lse = A(q, k, v, return_lse=True)
    for name in ("out", "dout"):
        args = [q, k, v, o, lse, o]
        bad = o.copy()
        bad[0, 0, 0, 0] = np.nan
        args[3 if name == "out" else 5] = bad
        _raises(lambda: AB(*args), "usage.value", f"`{name}[0, 0, 0, 0]` is nan")


def test_numpy_calls_check_what_the_gpu_path_checks():
    q, k, v = _qkv()
    _raises(lambda: A(q, k, v[..., :0]), "usage.shape", "head dims must be >= 1, got Dq=8, Dv=0")
    _raises(lambda: A(q[..., :0], k[..., :0], v, scale=1.0), "usage.shape", "head dims must be >= 1, got Dq=0")
    _raises(lambda: A(q.astype(np.int32), k, v), "usage.dtype", "`q` must be float16, float32 or float64")
    o, lse = A(q, k, v, return_lse=True)
    _raises(lambda: AB(q.astype(np.int64), k, v, o, lse, o), "usage.dtype", "`q` must be float16")
    for bad in ("no", 1, None):
        _raises(lambda: A(q, k, v, return_lse=bad), "usage.value", "`return_lse` must be True or False")
        _raises(lambda: AB(q, k, v, o, lse, o, deterministic=bad), "usage.value",
                "`deterministic` must be True or False")
    assert len(A(q, k, v, return_lse=np.bool_(True))) == 2   # NumPy's bool is a bool


def test_serving_calls_name_the_argument_that_is_wrong():
    kw = _paged(block_table=np.array([[2, 1], [0, 3], [1, 2]], np.int32), seqlens_k=[3, 1],
                cu_seqlens_q=[0, 1, 1, 1])
    _raises(lambda: PA(**kw), "usage.shape", "`seqlens_k` must have one length per sequence (3), got 2")
    kc = np.zeros((4, 16, 1, 8), np.float32)
    _raises(lambda: fmha_dsl.append_kv(kc, kc, [[1.0]], np.zeros((1, 1, 8)), block_table=np.zeros((1, 1), np.int32),
                                       seqlens_k=[1], cu_seqlens_new=[0, 1]),
            "usage.type", "`k_new` must be a numpy array or a torch tensor, got list")
    _raises(lambda: PA(**_paged(), return_lse="no"), "usage.value", "`return_lse` must be True or False, got 'no'")
    _raises(lambda: PA(**_paged(q_descale="1", k_descale=1.0, v_descale=1.0)), "usage.value",
            "on NumPy inputs `q_descale` is a number")


def test_a_padding_row_masked_by_a_large_negative_bias_keeps_its_gradients():
    """Hugging Face's padding mask: a bias row of -1e9 (or float32's lowest).  float32 cannot hold that row's LSE to
    better than its rounding, so its probabilities do not sum to 1 exactly: the check that refuses another call's
    lse leaves such a row alone (it refused the forward's own lse)."""
    q, k, v = _qkv()
    for big in (-1e9, float(np.finfo(np.float32).min)):
        bias = np.zeros((1, 1, 5, 5), np.float32)
        bias[0, 0, 2] = big
        o, lse = A(q, k, v, bias=bias, return_lse=True)
        dq, dk, dv, db = AB(q, k, v, o, lse, np.ones_like(o), bias=bias)
        assert np.isfinite(dq).all() and np.isfinite(db).all()
    o, lse = A(q, k, v, return_lse=True)   # (an ordinary row is still checked)
    _raises(lambda: AB(q, k, v, o, lse, o, causal=True), "usage.value", "is not the forward's LSE")


def test_the_fp8_reference_leaves_a_bad_scale_to_the_forwards_own_error():
    from fmha_dsl.fp8 import round_e4m3
    from fmha_dsl.reference_paged import paged_attention as ref

    kw = _paged()
    for n in ("q", "k_cache", "v_cache"):
        kw[n] = round_e4m3(kw[n])
    with pytest.raises(UsageError) as e:
        ref(kw.pop("q"), kw.pop("k_cache"), kw.pop("v_cache"), descales=(1.0, 1.0, 1.0), scale="abc", **kw)
    assert "scale" in str(e.value)


def test_the_lse_check_skips_only_rows_whose_own_scores_float32_cannot_hold():
    """The -1e9 padding row is left alone, but an lse of that size against ordinary scores (its bias forgotten in
    the backward, or an lse of 1e6) is still refused: the skip looks at the row's scores, not at the lse."""
    q, k, v = _qkv()
    bias = np.zeros((1, 1, 5, 5), np.float32)
    bias[0, 0, 2] = -1e9
    o, lse = A(q, k, v, bias=bias, return_lse=True)
    AB(q, k, v, o, lse, np.ones_like(o), bias=bias)
    _raises(lambda: AB(q, k, v, o, lse, np.ones_like(o)), "usage.value", "`lse[0, 0, 2]` is not the forward's LSE")
    o, lse = A(q, k, v, return_lse=True)
    _raises(lambda: AB(q, k, v, o, np.full_like(lse, 1e6), o), "usage.value", "is not the forward's LSE")


def test_a_call_that_reads_device_values_back_checks_every_wide_index_tensor(monkeypatch):
    """One maximum given and the other not: the call reads values back anyway, so each wide tensor is checked
    (it was decided tensor by tensor: the one whose maximum was given was cast unchecked)."""
    torch = pytest.importorskip("torch")
    from fmha_dsl import index_args

    seen = []
    real = index_args.int32_of
    monkeypatch.setattr(index_args, "int32_of", lambda *a: seen.append(a[3] if len(a) > 3 else True) or real(*a))
    cu = torch.tensor([0, 2, 5])
    for max_q, max_k in ((4, None), (None, 4)):
        seen.clear()
        index_args.group_lengths(cu, cu, 5, 5, -1, max_q, max_k)
        assert seen == [True, True]
    seen.clear()
    index_args.group_lengths(cu, cu, 5, 5, -1, 4, 4)
    assert seen == [False, False]
