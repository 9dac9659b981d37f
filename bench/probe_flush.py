"""How the L2 flush before each timed call moves a decode figure: triton's ``do_bench`` flushes by zeroing a 256 MB
buffer, which leaves the L2 (50 MB on an H100/H200) full of dirty lines that the timed kernel's first misses must
write back to DRAM; a flush that reads a buffer leaves clean lines, which cost nothing to evict.

    python3 -P bench/probe_flush.py [--json OUT.json]

Decode (Sq = 1, GQA 8:1, 8 K/V heads, d128, bf16) through ``fmha_dsl.paged_attention`` (pages of 16 and 1024,
scattered) and ``fmha_dsl.attention`` on the contiguous K/V, next to SDPA's FA2 and cuDNN backends, each timed
after (a) ``zero``: do_bench's flush, (b) ``read``: a read of a 512 MB buffer, and (c) ``none``: no flush (back to
back: the small shapes then time the host's launch path, the others read K/V partly from L2; not a figure).  Also
the copy bandwidth under (a) and (b).  Timing: bench_serving's loop (``_bench``) with each flush; run 2 in
docs/benchmarks.md took a fixed 100 calls after 10 warm-up calls instead.  A diagnostic of the method, not a
benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    import fmha_dsl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import _bench, _flush, _sdpa, paged_copy

    zero_buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flushes = {"zero": zero_buf.zero_, "read": _flush, "none": lambda: None}

    res = {"device": torch.cuda.get_device_name(), "rows": []}
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for mode in ("zero", "read"):
        ms = _bench(lambda: y.copy_(x), flush=flushes[mode])
        res[f"copy_gbps_{mode}"] = 2 * (1 << 30) / ms / 1e6
        print(f"copy ({mode} flush): {res[f'copy_gbps_{mode}']:.0f} GB/s", flush=True)
    del x, y
    hk, d, ratio = 8, 128, 8
    for b, sk in ((1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 8192), (32, 8192), (128, 1024)):
        torch.manual_seed(0)
        q = torch.randn(b, hk * ratio, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        nbytes = 2 * b * hk * sk * d * 2
        q3 = q[:, :, 0].contiguous()
        cq = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        calls = {"fa2": _sdpa(q, k, v, False, "flash"), "cudnn": _sdpa(q, k, v, False, "cudnn"),
                 "attention": lambda: fmha_dsl.attention(q, k, v)}
        caches = []
        for page in (16, 1024):
            kc, vc, bt, _, _ = paged_copy(k, v, page)
            caches.append((kc, vc, bt))
            calls[f"paged{page}"] = (lambda kc=kc, vc=vc, bt=bt: fmha_dsl.paged_attention(
                q3, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq, max_seqlen_q=1, max_seqlen_k=sk))
        row = {"batch": b, "seqlen_k": sk, "kv_bytes": nbytes}
        for name, fn in calls.items():
            fn()   # first use decides outside the timing
            for mode, flush in flushes.items():
                ms = _bench(fn, flush=flush)
                row[f"{name}_{mode}_gbps"] = nbytes / ms / 1e6
        res["rows"].append(row)
        print(f"b{b:>3} sk{sk:>6} " + "  ".join(
            f"{n}: " + "/".join(f"{row[f'{n}_{m}_gbps']:.0f}" for m in flushes) for n in calls)
            + "  (GB/s zero/read/none flush)", flush=True)
        del q, k, v, caches, calls
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
