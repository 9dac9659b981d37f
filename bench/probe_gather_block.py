"""Probe: does the gathered route's K/V copy cost paged prefill through the size of its programs?

    python3 -P bench/probe_gather_block.py --rows 16 [--json PATH]

``fmha_dsl.paged_attention`` (default arguments: first use decides between the paged kernels and the gathered route)
on a causal prefill of 1,024 and 4,096 tokens, h = 6/1, d128, bf16, batch 1, pages of 1 and 16 scattered at random,
next to ``fmha_dsl.attention`` varlen on the same K/V contiguous (the overhead goal's reference), with the copy kernel
(``kernels/triton_gather.py``) moving ``--rows`` cached rows a program (the shipped value is
``paged_abi.GATHER_BLOCK_M``).  Run each value in a process of its own, with a cache folder of its own
(``FMHA_DSL_CACHE_DIR``): the route decisions are recorded there.  bench_serving's timing (read flush, median of
three).  A diagnostic, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, required=True, help="cached rows a copy program moves (16, 32, 64 ...)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.rows < 1 or args.rows & (args.rows - 1):
        ap.error(f"--rows must be a power of two >= 1, got {args.rows}")

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import _bench, _timed_paged, check_json, paged_copy

    check_json(ap, args.json)
    import fmha_dsl.kernels.paged_abi as pa
    import fmha_dsl.kernels.triton_gather as tg

    pa.GATHER_BLOCK_M = tg.GATHER_BLOCK_M = args.rows   # (before any plan or compile reads it)
    import torch

    import fmha_dsl
    rows = []
    hq, hk, d = 6, 1, 128
    for s in (1024, 4096):
        torch.manual_seed(0)
        q = torch.randn(s, hq, d, device="cuda", dtype=torch.bfloat16)
        k4, v4 = (torch.randn(1, hk, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (x[0].transpose(0, 1).contiguous() for x in (k4, v4))
        cu = torch.tensor([0, s], dtype=torch.int32, device="cuda")
        lens = torch.tensor([s], dtype=torch.int32, device="cuda")

        def varlen():
            return fmha_dsl.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s,
                                      max_seqlen_k=s)
        varlen()
        for page in (1, 16):
            kc, vc, bt, _, _ = paged_copy(k4, v4, page)

            def paged():
                return fmha_dsl.paged_attention(q, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cu,
                                                max_seqlen_q=s, max_seqlen_k=s, causal=True)
            row = {}
            _timed_paged(row, "paged", q, paged, None)
            tv = sorted(_bench(varlen) for _ in range(3))[1]
            tp = sorted(_bench(paged) for _ in range(3))[1]
            r = dict(bm=args.rows, s=s, page=page, varlen_us=tv * 1e3, paged_us=tp * 1e3,
                     kernel=row["paged"].get("kernel", ""))
            rows.append(r)
            print(f"rows {args.rows:>3} s{s:>6} page{page:>3}: varlen {tv * 1e3:7.2f} us  paged {tp * 1e3:7.2f} us  "
                  f"overhead {tp / tv - 1:+.1%}  {r['kernel'][:70]}", flush=True)
    if args.json:
        from fmha_dsl.atomic_file import write_atomic

        write_atomic(args.json, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
