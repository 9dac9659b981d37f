"""The gathered route of paged attention (fmha_dsl/runtime/plan_gather.py): the copy kernel and the forward kernel
after it under Triton's interpreter against the NumPy reference (both table forms, both layouts, pages 1 / 16 / 64,
GQA, causal, LSE, empty sequences, lengths past the table, a page id past the cache), the fallback to the paged
kernel for a workspace sized without the copy, the workspace's layout and when the route is offered."""

import pytest

from interpreted import run_interpreted

from fmha_dsl.errors import UsageError
from fmha_dsl.kernels import paged_abi

INTERP = r'''
import os
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch, fmha_dsl
from fmha_dsl.keys import Problem
from fmha_dsl.registry import Entry
from fmha_dsl.kernels import paged_abi
from fmha_dsl.kernels.abis import companion_sig
from fmha_dsl.reference_paged import paged_attention as ref, vectorized_caches
from fmha_dsl.runtime.dispatch import Dispatcher
from fmha_dsl.runtime.plan_gather import GatheredPlan, forward_problem
from fmha_dsl.runtime.plan_paged import pack_call

SET = """kernel_set t { backend(triton) arch(sm90) dtype(fp16) hdim(32)
  kernel p { signature { family(batch_prefill) mask(no | causal) lse(true)
                         kv_cache(linear | vectorized, vllm | sglang, 16) }
             algorithm { pipeline(qr_async) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32) wave_m0(4)
                         padding(true, true, true, true) } }
  kernel f { signature { family(fwd) mode(group) mask(no | causal) lse(true) }
             algorithm { pipeline(qr) tile_m0(16) tile_n0(16) tile_k0(32) tile_n1(32) tile_k0max(32) wave_m0(4)
                         padding(true, true, true, true) } }
}"""
disp = Dispatcher(fmha_dsl.loads(SET).registry(arch="sm90"), "sm90", launcher="interpret")
rng = np.random.default_rng(0)
T = torch.from_numpy
lens_q, lens_k = [3, 1, 0, 5, 2], [10, 37, 5, 0, 70]   # the last: 70 tokens asked, its table holds fewer
B, Hq, Hk, D = 5, 4, 2, 32
q = rng.standard_normal((sum(lens_q), Hq, D)).astype(np.float16)
cq = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
for page in (1, 16, 64):
    width = 4 if page == 16 else -(-40 // page) + 1
    P = B * width + 3
    perm = rng.permutation(P)
    bt = perm[:B * width].reshape(B, width).astype(np.int32)
    bt[4, -1] = 10 ** 6                      # a page id past the cache: clamped, never read outside
    indptr = np.array([0, 2, 5, 6, 6, 6 + width], np.int32) if page == 16 else np.arange(B + 1, dtype=np.int32) * width
    indices = bt.reshape(-1)[:indptr[-1]].copy()
    kc = rng.standard_normal((P, page, Hk, D)).astype(np.float16)
    vc = rng.standard_normal((P, page, Hk, D)).astype(np.float16)
    tables = [("vllm", {"block_table": bt}), ("sglang", {"kv_indptr": indptr, "kv_indices": indices})]
    for (lookup, tab), layout in [(t, l) for t in tables for l in ("linear", "vectorized")]:
        if layout == "vectorized" and page < 8:
            continue
        for causal in (False, True):
            prob = Problem(family="batch_prefill", dtype="fp16", arch="sm90", batch=B, nhead_q=Hq, nhead_k=Hk,
                           seqlen_q=max(lens_q), seqlen_k=max(lens_k), max_seqlen_q=max(lens_q),
                           max_seqlen_k=max(lens_k),
                           hdim_q=D, hdim_v=D, mode="group", mask="bottom_right" if causal else "no", lse=True,
                           paged_kv=True, kv_layout=layout, kv_lookup=lookup, page_size=page)
            csig = companion_sig({f: getattr(prob, f) for f in paged_abi.GATHER_FIELDS}, "kv_gather")
            g = disp.loose_stage(Entry(None, "g", "<test>", {}, sig=csig, alg={}, arch="sm90",
                                       ident=f"g{page}{layout}{lookup}"), None)
            fallback = disp.plan(prob) if page == 16 else None
            plan = GatheredPlan(prob, g, disp.plan(forward_problem(prob)), fallback)
            ktab = {k: T(v) for k, v in tab.items()}
            kct, vct = (T(kc), T(vc)) if layout == "linear" else vectorized_caches(T(kc), T(vc))
            out = torch.full((sum(lens_q), Hq, D), float("nan"), dtype=torch.float16)
            lse = torch.empty(Hq, sum(lens_q), dtype=torch.float32)
            args = pack_call(T(q), kct, vct, out, lse, lookup=lookup, seqlens_k=T(np.int32(lens_k)), cu_seqlens_q=T(cq),
                             max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), bottom_right=True,
                             window=(-1, 0) if causal else None,
                             block_table=ktab.get("block_table"), kv_indptr=ktab.get("kv_indptr"),
                             kv_indices=ktab.get("kv_indices"), objects=True)
            steps, buf = plan.launch(-1, B, Hq, max(lens_q), args)
            assert len(steps) == 2 and steps[0][0].entry.sig["family"] == "kv_gather", steps
            # the copy: each sequence's readable rows, one after another, and their offsets
            safe = np.minimum(bt, P - 1) if lookup == "vllm" else None
            got_cu = steps[1][2][8].numpy()[:B + 1]
            kept = []
            for b in range(B):
                pages = safe[b] if lookup == "vllm" else np.minimum(indices[indptr[b]:indptr[b + 1]], P - 1)
                kept.append(min(lens_k[b], len(pages) * page))
            assert list(got_cu) == [0] + list(np.cumsum(kept)), (got_cu, kept)
            want, wl = ref(q.astype(np.float32), kc.astype(np.float32), vc.astype(np.float32),
                           **({"block_table": np.minimum(bt, P - 1)} if lookup == "vllm" else
                              {"kv_indptr": indptr, "kv_indices": np.minimum(indices, P - 1)}),
                           seqlens_k=kept, cu_seqlens_q=cq, causal="bottom_right" if causal else False,
                           return_lse=True)
            err = np.abs(out.float().numpy() - want).max()
            assert err < 3e-3, (page, lookup, layout, causal, err)
            live = np.isfinite(wl)
            assert np.abs(lse.numpy()[live] - wl[live]).max() < 1e-3 and np.array_equal(np.isfinite(lse.numpy()), live)
            if fallback is not None and causal and layout == "linear":  # a workspace sized for the paged plan only
                out.fill_(float("nan"))
                steps, _ = plan.launch(-1, B, Hq, max(lens_q), args, workspace=torch.empty(1))
                assert len(steps) == 1 and steps[0][0].entry.sig["family"] == "batch_prefill"
                assert np.abs(out.float().numpy() - want).max() < 3e-3
print("gather ok")
'''


def test_the_copy_and_the_forward_kernel_under_the_interpreter():
    run_interpreted(INTERP, "gather ok", timeout=600)


def test_the_workspace_layout_by_hand():
    # 2 sequences x 100 rows x 3 heads: K 600 rows x 64 x 2 bytes = 76,800 (a multiple of 256), V 600 x 32 x 2 =
    # 38,400 -> 38,400 (multiple of 256), cu_seqlens_k 3 x 4 = 12 bytes -> 256
    assert paged_abi.gather_layout(2, 3, 100, 64, 32, "bf16") == (0, 76_800, 115_200, 115_456)
    assert paged_abi.gather_numel(2, 3, 100, 64, 32, "bf16") == 115_456 // 4
    assert paged_abi.gather_layout(1, 1, 1, 8, 8, "fp32")[1:] == (256, 512, 768)   # each part on 256 bytes


def test_the_route_is_offered_to_prefills_within_the_budget(monkeypatch):
    from fmha_dsl.runtime.plan_gather import fits

    # 128 query rows per K/V head: 16 rows x a group of 8 is a prefill, 15 x 8 (and any decode) is not
    assert fits("bf16", 128, 128, 4, 32, 4, 16, 4096) and not fits("bf16", 128, 128, 4, 32, 4, 15, 4096)
    assert not fits("bf16", 128, 128, 64, 32, 8, 1, 32768)
    # 8 x 65,536 rows x 8 heads x (128 + 128) x 2 bytes = 2 GiB: over the default 1 GiB, within a 4 GiB budget
    assert not fits("bf16", 128, 128, 8, 64, 8, 4096, 65536)
    monkeypatch.setenv("FMHA_DSL_GATHER_MIB", "4096")
    assert fits("bf16", 128, 128, 8, 64, 8, 4096, 65536)
    monkeypatch.setenv("FMHA_DSL_GATHER_MIB", "0")                  # off
    assert not fits("bf16", 128, 128, 4, 32, 4, 16, 4096)
    for bad in ("-1", "lots"):                                      # located, with the way back
        monkeypatch.setenv("FMHA_DSL_GATHER_MIB", bad)
        with pytest.raises(UsageError, match=f"FMHA_DSL_GATHER_MIB={bad}: expected a whole number >= 0") as exc:
            fits("bf16", 128, 128, 4, 32, 4, 16, 4096)
        assert "unset it" in str(exc.value.diagnostics[0].hint)
    monkeypatch.delenv("FMHA_DSL_GATHER_MIB")
    # rows x heads x head dim past int32 element offsets: never, whatever the budget
    assert not paged_abi.gather_fits(1, 8, 8, 1024, 1 << 21, 256, 256, "bf16", 1 << 62)


def test_a_recorded_route_holds_only_for_the_kernels_and_space_it_was_measured_with():
    """recorded_route: the route of a record measured under this candidate space between this paged kernel and the
    forward problem's current decision; anything else (or no forward decision yet, or a damaged record) is timed."""
    from fmha_dsl.keys import Problem
    from fmha_dsl.runtime.plan_gather import recorded_route, route_key

    rec = {"route": "gathered", "space": "s1", "paged": "P", "forward": "F", "sig": {}, "alg": {}}
    assert recorded_route(rec, "s1", "P", "F") == "gathered"
    assert recorded_route(dict(rec, route="paged"), "s1", "P", "F") == "paged"
    for bad, args in ((rec, ("s2", "P", "F")), (rec, ("s1", "Q", "F")), (rec, ("s1", "P", "G")),
                      (rec, ("s1", "P", None)), (dict(rec, route="sideways"), ("s1", "P", "F")),
                      (dict(rec, route=None), ("s1", "P", "F")), ({k: v for k, v in rec.items() if k != "forward"},
                                                                  ("s1", "P", "F")),
                      (None, ("s1", "P", "F")), ("gathered", ("s1", "P", "F"))):
        assert recorded_route(bad, *args) is None, (bad, args)
    p = Problem(family="batch_prefill", dtype="bf16", arch="sm90", batch=2, nhead_q=16, nhead_k=4, seqlen_q=1024,
                seqlen_k=4096, max_seqlen_q=1024, max_seqlen_k=4096, hdim_q=128, hdim_v=128, mode="group",
                paged_kv=True, kv_layout="linear", kv_lookup="vllm", page_size=16)
    assert route_key(p, True).endswith("|route") and route_key(p, True) != route_key(p, False)


@pytest.mark.parametrize("arch", ["sm90", "gfx942"])
def test_the_copy_kernel_compiles_without_spills(arch):
    pytest.importorskip("triton")
    from fmha_dsl.compile_triton import compile_companion
    from fmha_dsl.kernels.abis import companion_name, companion_sig

    for layout, page in (("linear", 1), ("linear", 1024), ("vectorized", 16)):
        csig = companion_sig(dict(dtype="bf16", hdim_q=128, hdim_v=128, kv_layout=layout, kv_lookup="vllm",
                                  page_size=page), "kv_gather")
        meta, data = compile_companion(csig, arch)
        assert meta is not None, data
        assert meta["entry"] == "fmha_kv_gather" and int(meta["resources"].get("spills") or 0) == 0, meta["resources"]
        assert companion_name(csig, arch).startswith(f"fmha_kv_gather_d128_128_bf16_{layout}_vllm_ps{page}_")
