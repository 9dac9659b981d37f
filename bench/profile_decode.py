"""Decode calls for Nsight Compute: each shape once, after a warm-up process has made every decision.

    python3 -P bench/profile_decode.py warm        # first use: compile, time and record the decisions
    ncu --clock-control none -k regex:"fmha|flash" --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section MemoryWorkloadAnalysis python3 -P bench/profile_decode.py one

Shapes (d128, bf16, 8 K/V heads, GQA 8:1): ``fmha_dsl.attention`` and SDPA's flash backend at batch 8 x 8k keys, and
``fmha_dsl.paged_attention`` (vLLM table, pages scattered) at batch 128 x 8k with pages of 16, 1024 and 1 -- default
arguments, as a user calls them.  A diagnostic (occupancy, waves, DRAM throughput per kernel), not a benchmark:
bench/results/2026-11-24_h200_ncu_decode_s11run4.txt is its output.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in ("warm", "one"):
        sys.exit("usage: python3 -P bench/profile_decode.py warm|one")
    import torch

    import fmha_dsl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import paged_copy

    hk, d, ratio = 8, 128, 8
    for kind, b, sk, page in (("attention", 8, 8192, 0), ("sdpa_flash", 8, 8192, 0), ("paged", 128, 8192, 16),
                              ("paged", 128, 8192, 1024), ("paged", 128, 8192, 1)):
        torch.manual_seed(0)
        q = torch.randn(b, hk * ratio, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        if kind == "attention":
            def call():
                return fmha_dsl.attention(q, k, v)
        elif kind == "sdpa_flash":
            def call():
                with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:
            q3 = q[:, :, 0].contiguous()
            cq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
            lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
            kc, vc, bt, _, _ = paged_copy(k, v, page)

            def call():
                return fmha_dsl.paged_attention(q3, kc, vc, seqlens_k=lens, cu_seqlens_q=cq, max_seqlen_q=1,
                                                max_seqlen_k=sk, block_table=bt)
        for _ in range(3 if sys.argv[1] == "warm" else 1):
            call()
        torch.cuda.synchronize()
        print(kind, b, sk, page, flush=True)


if __name__ == "__main__":
    main()
