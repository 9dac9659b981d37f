"""The serving families' NumPy reference (fmha_dsl/reference_paged.py) against independent truth: paged attention
equals the forward reference over contiguous K/V that were scattered into shuffled pages (both table forms, several
page sizes, shared prefix pages, empty sequences); append-KV equals the concatenation, with RoPE computed here as
complex rotations; every inconsistent table is a located UsageError."""

import numpy as np
import pytest

from fmha_dsl.errors import UsageError
from fmha_dsl.reference import attention_fwd
from fmha_dsl.reference_paged import append_kv, gather_kv, paged_attention, rotary


def scatter(lens, page, hk=2, d=8, dv=8, spare=3, seed=0, share_prefix=False):
    """Contiguous per-sequence K/V, and a cache holding them in shuffled pages: ``(k, v, cu, k_cache, v_cache,
    block_table, kv_indptr, kv_indices)``."""
    rng = np.random.default_rng(seed)
    need = [-(-n // page) for n in lens]
    total = sum(need) + spare
    order = rng.permutation(total)
    k_cache = rng.standard_normal((total, page, hk, d)).astype(np.float32)   # garbage outside the sequences
    v_cache = rng.standard_normal((total, page, hk, dv)).astype(np.float32)
    pages, at = [], 0
    for n in need:
        pages.append(order[at:at + n])
        at += n
    if share_prefix and len(lens) > 1 and need[0] and need[1] and lens[0] >= page and lens[1] >= page:
        pages[1] = np.concatenate([pages[0][:1], pages[1][1:]])    # sequence 1 reuses sequence 0's first page
    ks, vs = [], []
    for b, n in enumerate(lens):
        kb = rng.standard_normal((n, hk, d)).astype(np.float32)
        vb = rng.standard_normal((n, hk, dv)).astype(np.float32)
        if b == 1 and share_prefix and lens[1] >= page and lens[0] >= page:
            kb[:page], vb[:page] = ks[0][:page], vs[0][:page]            # the shared prefix is the same tokens
        for t in range(n):
            k_cache[pages[b][t // page], t % page] = kb[t]
            v_cache[pages[b][t // page], t % page] = vb[t]
        ks.append(kb)
        vs.append(vb)
    width = max(need) + 1
    bt = np.zeros((len(lens), width), np.int32)      # entries past a sequence's pages are never read
    for b, p in enumerate(pages):
        bt[b, :len(p)] = p
    ip = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
    ix = np.concatenate(pages).astype(np.int32) if pages else np.zeros(0, np.int32)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return np.concatenate(ks), np.concatenate(vs), cu, k_cache, v_cache, bt, ip, ix


@pytest.mark.parametrize("page", [1, 4, 16])
@pytest.mark.parametrize("form", ["block_table", "indptr"])
def test_paged_attention_is_attention_over_the_gathered_keys(page, form):
    lens = [37, 0, 16, 5]
    k, v, cu_k, kc, vc, bt, ip, ix = scatter(lens, page, share_prefix=True)
    tables = {"block_table": bt} if form == "block_table" else {"kv_indptr": ip, "kv_indices": ix}
    lq = [3, 2, 16, 1]
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    q = np.random.default_rng(9).standard_normal((sum(lq), 4, 8)).astype(np.float32)
    kw = dict(causal="bottom_right", softcap=5.0)
    got, lse = paged_attention(q, kc, vc, seqlens_k=lens, cu_seqlens_q=cq, return_lse=True, **tables, **kw)
    want, wlse = attention_fwd(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=cu_k, **kw)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(lse, wlse)
    gk, gv, gcu = gather_kv(kc, vc, seqlens_k=lens, **tables)
    np.testing.assert_array_equal(gk, k)
    np.testing.assert_array_equal(gcu, cu_k)


def test_inconsistent_tables_are_located_usage_errors():
    lens = [9, 4]
    _, _, _, kc, vc, bt, ip, ix = scatter(lens, 4)
    cases = [
        (dict(block_table=bt, kv_indptr=ip, kv_indices=ix), "exactly one page table"),
        (dict(), "exactly one page table"),
        (dict(block_table=bt.astype(np.float32)), "integer"),
        (dict(block_table=bt[:1]), "one row per sequence"),
        (dict(block_table=np.where(bt == bt[0, 0], 99, bt)), "outside the cache"),
        (dict(block_table=bt[:, :2]), "need 3 pages of 4"),
        (dict(kv_indptr=ip[::-1], kv_indices=ix), "kv_indptr"),
    ]
    for tables, words in cases:
        with pytest.raises(UsageError, match=words):
            gather_kv(kc, vc, seqlens_k=lens, **tables)
    with pytest.raises(UsageError, match="cu_seqlens_q"):
        paged_attention(np.zeros((3, 2, 8), np.float32), kc, vc, block_table=bt, seqlens_k=lens,
                        cu_seqlens_q=[0, 3])
    with pytest.raises(UsageError, match="vectorized caches must be K \\[num_pages, Hk, D / x, page_size, x\\]"):
        gather_kv(kc, vc, seqlens_k=lens, block_table=bt, layout="vectorized")     # 4-D caches declared vectorized
    with pytest.raises(UsageError, match="unknown kv layout 'swizzled'"):
        gather_kv(kc, vc, seqlens_k=lens, block_table=bt, layout="swizzled")


def _rope_complex(x, pos, theta, interleaved):
    """RoPE as a complex rotation by pos x theta_i, written independently of the reference."""
    half = theta.shape[0]
    x = x.astype(np.float64)
    if interleaved:
        z = x[..., 0:2 * half:2] + 1j * x[..., 1:2 * half:2]
    else:
        z = x[..., :half] + 1j * x[..., half:2 * half]
    z = z * np.exp(1j * pos[:, None, None] * theta[None, None, :])
    out = x.copy()
    if interleaved:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = z.real, z.imag
    else:
        out[..., :half], out[..., half:2 * half] = z.real, z.imag
    return out


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_is_a_complex_rotation_of_the_first_rotary_dims(interleaved):
    rng = np.random.default_rng(1)
    theta = 10000.0 ** (-np.arange(3) / 3)
    pos = np.array([0, 1, 7, 40])
    cos, sin = np.cos(np.arange(64)[:, None] * theta), np.sin(np.arange(64)[:, None] * theta)
    x = rng.standard_normal((4, 2, 8))
    got = rotary(x, pos, cos, sin, interleaved)
    np.testing.assert_allclose(got, _rope_complex(x, pos, theta, interleaved), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[0], x[0])          # position 0 rotates by nothing
    np.testing.assert_array_equal(got[..., 6:], x[..., 6:])  # dims past rotary_dim = 6 are untouched


@pytest.mark.parametrize("form", ["block_table", "indptr"])
def test_append_kv_is_the_concatenation_with_rope(form):
    lens, new = [5, 0, 8], [3, 2, 0]
    k, v, cu_k, kc, vc, bt, ip, ix = scatter([n + a for n, a in zip(lens, new)], 4, seed=3)
    tables = {"block_table": bt} if form == "block_table" else {"kv_indptr": ip, "kv_indices": ix}
    rng = np.random.default_rng(4)
    cn = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    kn = rng.standard_normal((sum(new), 2, 8)).astype(np.float32)
    vn = rng.standard_normal((sum(new), 2, 8)).astype(np.float32)
    q = rng.standard_normal((sum(new), 4, 8)).astype(np.float32)
    theta = 10000.0 ** (-np.arange(4) / 4)
    cos, sin = np.cos(np.arange(32)[:, None] * theta), np.sin(np.arange(32)[:, None] * theta)
    kc2, vc2, q2 = append_kv(kc, vc, kn, vn, seqlens_k=lens, cu_seqlens_new=cn, rotary_cos=cos, rotary_sin=sin,
                             q=q, **tables)
    pos = np.concatenate([lens[b] + np.arange(new[b]) for b in range(3)])
    after_k, after_v, _ = gather_kv(kc2, vc2, seqlens_k=[n + a for n, a in zip(lens, new)], **tables)
    before_k, before_v, cu_before = gather_kv(kc, vc, seqlens_k=lens, **tables)
    kr = _rope_complex(kn, pos, theta, False).astype(np.float32)
    for b in range(3):
        old = slice(cu_before[b], cu_before[b + 1])
        add = slice(cn[b], cn[b + 1])
        want_k = np.concatenate([before_k[old], kr[add]])
        want_v = np.concatenate([before_v[old], vn[add]])
        start = sum(n + a for n, a in zip(lens[:b], new[:b]))
        np.testing.assert_allclose(after_k[start:start + lens[b] + new[b]], want_k, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(after_v[start:start + lens[b] + new[b]], want_v)
    np.testing.assert_allclose(q2, _rope_complex(q, pos, theta, False), rtol=1e-6, atol=1e-6)
    assert not np.shares_memory(kc2, kc)                  # the reference does not modify its arguments
    with pytest.raises(UsageError, match="8 cached \\+ 5 new tokens need 4 pages of 4"):
        append_kv(kc, vc, np.zeros((5, 2, 8), np.float32), np.zeros((5, 2, 8), np.float32), seqlens_k=[8, 0, 0],
                  cu_seqlens_new=[0, 5, 5, 5], block_table=bt[:, :2])


def test_cks_vectorized_layout_holds_the_same_values():
    """Element [p, h, d // x, s, d % x] of K and [p, h, s // x, d, s % x] of V are the linear [p, s, h, d] (checked
    element by element against the definition), and attention over either layout is the same."""
    from fmha_dsl.reference_paged import linear_caches, vectorized_caches

    rng = np.random.default_rng(3)
    k = rng.standard_normal((3, 16, 2, 32)).astype(np.float16)
    v = rng.standard_normal((3, 16, 2, 24)).astype(np.float16)
    k5, v5 = vectorized_caches(k, v)
    assert k5.shape == (3, 2, 4, 16, 8) and v5.shape == (3, 2, 2, 24, 8)
    for p, s, h, d in [(0, 0, 0, 0), (2, 15, 1, 31), (1, 9, 0, 13), (2, 7, 1, 8)]:
        assert k5[p, h, d // 8, s, d % 8] == k[p, s, h, d]
    for p, s, h, d in [(0, 0, 0, 0), (2, 15, 1, 23), (1, 9, 0, 13)]:
        assert v5[p, h, s // 8, d, s % 8] == v[p, s, h, d]
    back_k, back_v = linear_caches(k5, v5)
    assert np.array_equal(back_k, k) and np.array_equal(back_v, v)
    q = rng.standard_normal((4, 4, 32)).astype(np.float32)
    bt = np.array([[2, 0], [1, 2]], np.int32)
    kw = dict(block_table=bt, seqlens_k=[20, 9], cu_seqlens_q=[0, 3, 4], causal="bottom_right")
    f32 = (lambda a: a.astype(np.float32))
    np.testing.assert_array_equal(paged_attention(q, f32(k5), f32(v5), **kw), paged_attention(q, f32(k), f32(v), **kw))
    with pytest.raises(UsageError, match="vectorized caches must be"):
        paged_attention(q, f32(k5), f32(v5[:, :1]), **kw)
    with pytest.raises(UsageError, match="multiples of the vector"):
        vectorized_caches(k[:, :4], v[:, :4])
