"""Batch-1 decode time against the split count: is ``costmodel.splits_at``'s choice the fastest, and how much of a
call is fixed cost?

    FMHA_DSL_TORCH_FAST=0 python3 -P bench/probe_splits.py [--json OUT.json]

``fmha_dsl.attention`` (GQA 8:1, 8 K/V heads, d128, bf16, one sequence) with the count the cost model picks, then
with the count forced (the runtime's ``splits_at`` replaced, clamped to the chosen kernel's limit; the count each
launch used and the limit are recorded; the Python launch path, since the torch fast path's replay computes the
count in C++), and ``fmha_dsl.paged_attention`` on the same K/V in pages of 16 and 1024 scattered, at the cost
model's count only (a paged call replays its first launch, count included).  Timing: bench_serving's (read flush).
A probe, not the user path.
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
    import fmha_dsl.runtime.plan as plan_mod

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import _bench, paged_copy

    auto = plan_mod.splits_at
    forced = {}

    def splits_at(limit, seqlen_k, n0, nprog, cus, occupancy=1):
        s = auto(limit, seqlen_k, n0, nprog, cus, occupancy)
        s = min(forced["n"], int(limit)) if "n" in forced else s
        forced["last"] = (s, int(limit))   # the count the launch uses, and the kernel's limit
        return s

    plan_mod.splits_at = splits_at
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    hk, d, ratio = 8, 128, 8
    for sk in (8192, 32768, 131072):
        torch.manual_seed(0)
        q = torch.randn(1, hk * ratio, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        nbytes = 2 * hk * sk * d * 2
        q3 = q[:, :, 0].contiguous()
        cq = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
        lens = torch.tensor([sk], dtype=torch.int32, device="cuda")
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)[:, :, 0]
        calls = {"attention": lambda: fmha_dsl.attention(q, k, v)[:, :, 0]}
        for page in (16, 1024):
            kc, vc, bt, _, _ = paged_copy(k, v, page)
            calls[f"paged{page}"] = (lambda kc=kc, vc=vc, bt=bt: fmha_dsl.paged_attention(
                q3, kc, vc, block_table=bt, seqlens_k=lens, cu_seqlens_q=cq, max_seqlen_q=1, max_seqlen_k=sk))
        for name, fn in calls.items():
            forced.clear()
            fn()   # the first call decides (its race launches candidates); the next one launches the decision
            forced.pop("last", None)
            fn()
            count, limit = forced.get("last", (None, None))
            row = {"seqlen_k": sk, "call": name, "auto": count, "limit": limit, "gbps": {}, "count": {}}
            row["gbps"]["auto"] = nbytes / _bench(fn) / 1e6
            for n in (4, 8, 16, 24, 32, 48, 64) if name == "attention" else ():
                forced["n"] = n
                out = fn()
                row["count"][n] = forced["last"][0]
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                if err > 2e-2:
                    row["gbps"][n] = f"wrong (rel err {err:.3g})"
                    continue
                row["gbps"][n] = nbytes / _bench(fn) / 1e6
            res["rows"].append(row)
            print(f"sk{sk:>6} {name:>10} auto={row['auto']} (limit {row['limit']}): " + "  ".join(
                f"{n}:{g:.0f}" if isinstance(g, float) else f"{n}:{g}" for n, g in row["gbps"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
