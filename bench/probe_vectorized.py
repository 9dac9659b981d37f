"""Probe: CK's vectorized KV layout against the linear one, the same pages, through ``fmha_dsl.paged_attention``.

    python3 -P bench/probe_vectorized.py

Page 16, vLLM's table, pages scattered at random (bench_serving's ``paged_copy``), bf16, d128.  Decode: one query per
sequence, GQA 8:1, batch x context 1 x 32k, 8 x 8k, 8 x 32k, 32 x 8k, 128 x 1k (GB/s of K + V read); prefill: one
sequence of S queries over its S keys, 32 query heads over 8 K/V heads, S = 2048 and 8192 (TFLOP/s, 4·H·S²·D).  Both
layouts hold the same values, so their outputs must agree; the largest difference is printed.  Default arguments
(first use decides each class); bench_serving's timing.  A diagnostic for the layout's read path (docs/benchmarks.md,
"CK's vectorized KV layout"); bench_serving.py is the benchmark.
"""

from __future__ import annotations

import os
import sys


def _ab(kv, call, work, unit):
    """``{layout: (out, rate)}`` of ``call(k_cache, v_cache)`` for each layout in ``kv``."""
    from bench_serving import _bench

    res = {}
    for name, (kk, vv) in kv.items():
        out = call(kk, vv)
        res[name] = (out, work / _bench(lambda: call(kk, vv)) / unit)
    return res


def _line(label, res, unit):
    err = (res["linear"][0].float() - res["vectorized"][0].float()).abs().max().item()
    lin, vec = res["linear"][1], res["vectorized"][1]
    return f"{label}: linear {lin:.0f} {unit}, vectorized {vec:.0f} {unit} ({vec / lin:.3f}); max |diff| {err:.2e}"


def main() -> int:
    import torch

    import fmha_dsl
    from fmha_dsl.reference_paged import vectorized_caches

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import paged_copy

    hk, d = 8, 128
    for b, sk in ((1, 32768), (8, 8192), (8, 32768), (32, 8192), (128, 1024)):
        torch.manual_seed(0)
        q = torch.randn(b, 8 * hk, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        kc, vc, bt, _, _ = paged_copy(k, v, 16)

        def call(kk, vv):
            return fmha_dsl.paged_attention(q, kk, vv, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                                            max_seqlen_q=1, max_seqlen_k=sk)
        res = _ab({"linear": (kc, vc), "vectorized": vectorized_caches(kc, vc)}, call, 2 * b * hk * sk * d * 2, 1e6)
        print(_line(f"decode b{b} x {sk}", res, "GB/s"), flush=True)
    for s in (2048, 8192):
        torch.manual_seed(0)
        q = torch.randn(s, 4 * hk, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, hk, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cq = torch.tensor([0, s], dtype=torch.int32, device="cuda")
        lens = torch.tensor([s], dtype=torch.int32, device="cuda")
        kc, vc, bt, _, _ = paged_copy(k, v, 16)

        def call(kk, vv):
            return fmha_dsl.paged_attention(q, kk, vv, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                                            max_seqlen_q=s, max_seqlen_k=s)
        res = _ab({"linear": (kc, vc), "vectorized": vectorized_caches(kc, vc)}, call, 4 * 4 * hk * s * s * d, 1e9)
        print(_line(f"prefill {s}", res, "TFLOP/s"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
