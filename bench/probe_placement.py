"""Probe: does a small page cost decode bandwidth through the kernel's addressing, or through where the pages lie?

    python3 -P bench/probe_placement.py [--json PATH]

``fmha_dsl.paged_attention`` (default arguments, first use decides) on pages of 16 and 1024 tokens, each laid out
two ways: scattered over the cache at random (as bench_serving lays them out) and in order (each sequence's pages
one after another, so that a 16-token page's sequence is as contiguous as a 1024-token page's), next to cuDNN-SDPA on
the same K/V contiguous.  GQA 8:1, 8 K/V heads, d128, bf16, one query per sequence; bench_serving's timing (read
flush, median).  If the in-order page-16 cache reads as fast as page 1024, what page 16 loses in bench_serving is the
placement (DRAM and TLB locality), not the kernel.  A diagnostic, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    import fmha_dsl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import _bench, _sdpa, paged_copy

    hk, d, rows = 8, 128, []
    for b, sk in ((128, 1024), (32, 8192), (8, 32768)):
        torch.manual_seed(0)
        q = torch.randn(b, 8 * hk, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        q3 = q[:, :, 0].contiguous()
        cq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        nbytes = 2 * b * hk * sk * d * 2
        row = {"batch": b, "seqlen_k": sk, "cudnn_gbps": nbytes / _bench(_sdpa(q, k, v, False, "cudnn")) / 1e6}
        for page in (16, 1024):
            for scatter in (True, False):
                kc, vc, bt, _, _ = paged_copy(k, v, page, scatter=scatter)

                def run(kc=kc, vc=vc, bt=bt):
                    return fmha_dsl.paged_attention(q3, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq,
                                                    max_seqlen_q=1, max_seqlen_k=sk)
                run()
                row[f"page{page}_{'scattered' if scatter else 'in_order'}_gbps"] = nbytes / _bench(run) / 1e6
                del kc, vc, bt
        rows.append(row)
        print(" ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
