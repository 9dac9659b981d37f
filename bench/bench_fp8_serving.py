"""Decode over an FP8 KV cache against the same pages in bf16, through the public API as a server calls it.

    python3 -P bench/bench_fp8_serving.py [--quick] [--parts decode,prefill] [--json OUT.json]

``fmha_dsl.paged_attention(q, k_cache, v_cache, block_table=..., seqlens_k=..., cu_seqlens_q=..., max_seqlen_q=1,
max_seqlen_k=..., [q_descale=..., k_descale=..., v_descale=...])`` with default arguments otherwise (first use compiles
and times the candidates; the figures are the steady state after it), Sq = 1, GQA 8:1 (32 query heads, 8 K/V heads),
d128, page 16, pages scattered at random; the FP8 cache (``torch.float8_e4m3fn``, CK's ``fp8bf16`` contract: q in
e4m3 too, bf16 output) holds the bf16 cache's values rounded to e4m3.  Reported: time per call, the bytes each reads
(K + V: 1 byte an element in FP8, 2 in bf16) per second, the fraction of the device's copy bandwidth (read + write,
measured in the run), and the FP8 call's speed-up over the bf16 one.  Timing: bench_serving's (CUDA events, median,
the L2 flushed by a 512 MB read before each call).  FP8 output is checked against the bf16 call's (rel. err < 8 %:
e4m3 has 3 mantissa bits).

Prefill (``--parts prefill``; default: both): one sequence of S queries over its S keys in the same pages (32 query
heads over 8 K/V heads, causal), S = 2048 and 8192, TFLOP/s (4 * Hq * S * S * D, halved for causal) of each dtype.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

SHAPES = ((1, 8192), (1, 32768), (8, 8192), (32, 8192), (128, 1024), (8, 32768), (32, 32768), (1, 131072))
HQ, HK, D, PAGE = 32, 8, 128, 16


def row(b: int, s: int) -> dict:
    import torch
    from bench_serving import _bench, paged_copy

    import fmha_dsl

    g = torch.Generator(device="cuda").manual_seed(0)
    k, v = (torch.randn(b, HK, s, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kc, vc, bt, _, _ = paged_copy(k, v, PAGE)
    del k, v
    q = torch.randn(b, HQ, D, generator=g, device="cuda", dtype=torch.bfloat16)
    kw = dict(block_table=bt, seqlens_k=torch.full((b,), s, dtype=torch.int32, device="cuda"),
              cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32, device="cuda"), max_seqlen_q=1, max_seqlen_k=s)
    ones = [torch.ones(1, device="cuda") for _ in range(3)]
    q8, kc8, vc8 = (x.to(torch.float8_e4m3fn) for x in (q, kc, vc))
    out = {"batch": b, "seqlen_k": s}
    ref = fmha_dsl.paged_attention(q, kc, vc, **kw)
    got = fmha_dsl.paged_attention(q8, kc8, vc8, q_descale=ones[0], k_descale=ones[1], v_descale=ones[2], **kw)
    out["rel_err"] = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    for name, elem, fn in (("bf16", 2, lambda: fmha_dsl.paged_attention(q, kc, vc, **kw)),
                           ("fp8", 1, lambda: fmha_dsl.paged_attention(q8, kc8, vc8, q_descale=ones[0],
                                                                        k_descale=ones[1], v_descale=ones[2], **kw))):
        ms = _bench(fn)
        out[name] = {"us": ms * 1e3, "gbs": 2 * b * s * HK * D * elem / ms / 1e6}
    out["speedup"] = out["bf16"]["us"] / out["fp8"]["us"]
    return out


def prefill_row(s: int) -> dict:
    import torch
    from bench_serving import _bench, paged_copy

    import fmha_dsl

    g = torch.Generator(device="cuda").manual_seed(0)
    k, v = (torch.randn(1, HK, s, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kc, vc, bt, _, _ = paged_copy(k, v, PAGE)
    del k, v
    q = torch.randn(s, HQ, D, generator=g, device="cuda", dtype=torch.bfloat16)
    kw = dict(block_table=bt, seqlens_k=torch.tensor([s], dtype=torch.int32, device="cuda"),
              cu_seqlens_q=torch.tensor([0, s], dtype=torch.int32, device="cuda"), max_seqlen_q=s, max_seqlen_k=s,
              causal=True)
    ones = [torch.ones(1, device="cuda") for _ in range(3)]
    q8, kc8, vc8 = (x.to(torch.float8_e4m3fn) for x in (q, kc, vc))
    out = {"seqlen": s}
    ref = fmha_dsl.paged_attention(q, kc, vc, **kw)
    got = fmha_dsl.paged_attention(q8, kc8, vc8, q_descale=ones[0], k_descale=ones[1], v_descale=ones[2], **kw)
    out["rel_err"] = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    flops = 4 * HQ * s * s * D / 2
    for name, fn in (("bf16", lambda: fmha_dsl.paged_attention(q, kc, vc, **kw)),
                     ("fp8", lambda: fmha_dsl.paged_attention(q8, kc8, vc8, q_descale=ones[0], k_descale=ones[1],
                                                              v_descale=ones[2], **kw))):
        ms = _bench(fn)
        out[name] = {"us": ms * 1e3, "tflops": flops / ms / 1e9}
    out["speedup"] = out["bf16"]["us"] / out["fp8"]["us"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="three shapes")
    ap.add_argument("--parts", default="decode,prefill", help="decode, prefill or both (comma-separated)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts or parts - {"decode", "prefill"}:
        ap.error(f"--parts takes decode, prefill or decode,prefill, got {args.parts!r}")
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import copy_bandwidth

    doc = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "python": platform.python_version(),
           "copy_gbs": copy_bandwidth(), "rows": []}
    print(f"{doc['device']}: copy {doc['copy_gbs']:.0f} GB/s (read + write)", flush=True)
    for b, s in (SHAPES[:1] + SHAPES[3:5] if args.quick else SHAPES) if "decode" in parts else ():
        r = row(b, s)
        doc["rows"].append(r)
        print(f"B={b:4d} Sk={s:6d}  bf16 {r['bf16']['us']:8.1f} us {r['bf16']['gbs']:6.0f} GB/s "
              f"({r['bf16']['gbs'] / doc['copy_gbs']:4.0%})   fp8 {r['fp8']['us']:8.1f} us {r['fp8']['gbs']:6.0f} GB/s "
              f"({r['fp8']['gbs'] / doc['copy_gbs']:4.0%})   fp8 speed-up {r['speedup']:.2f}x   err {r['rel_err']:.3f}",
              flush=True)
        if not r["rel_err"] < 0.08:
            print(f"  FP8 output off by {r['rel_err']:.3f}", flush=True)
    if doc["rows"]:
        sp = [r["speedup"] for r in doc["rows"]]
        doc["geomean_speedup"] = math.exp(sum(map(math.log, sp)) / len(sp))
        print(f"fp8 / bf16 decode speed-up: geomean {doc['geomean_speedup']:.2f}x, min {min(sp):.2f}x, "
              f"max {max(sp):.2f}x")
    doc["prefill"] = []
    for s in (2048, 8192) if "prefill" in parts else ():
        r = prefill_row(s)
        doc["prefill"].append(r)
        print(f"prefill S={s:5d} causal  bf16 {r['bf16']['tflops']:6.1f} TFLOP/s   fp8 {r['fp8']['tflops']:6.1f} "
              f"TFLOP/s   fp8 speed-up {r['speedup']:.2f}x   err {r['rel_err']:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
