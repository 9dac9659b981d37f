"""Decode over an FP8 KV cache against the same pages in bf16, through the public API as a server calls it.

    python3 -P bench/bench_fp8_serving.py [--quick] [--parts decode,prefill] [--json OUT.json]

``fmha_dsl.paged_attention(q, k_cache, v_cache, block_table=..., seqlens_k=..., cu_seqlens_q=..., max_seqlen_q=1,
max_seqlen_k=..., [q_descale=..., k_descale=..., v_descale=...])`` with default arguments otherwise (first use compiles
and times the candidates; the figures are the steady state after it), Sq = 1, GQA 8:1 (32 query heads, 8 K/V heads),
d128, page 16, pages scattered at random; the FP8 cache (``torch.float8_e4m3fn``, CK's ``fp8bf16`` contract: q in
e4m3 too, bf16 output) holds the bf16 cache's values rounded to e4m3.  Reported: time per call, the bytes each reads
(K + V: 1 byte an element in FP8, 2 in bf16) per second, the fraction of the device's copy bandwidth (read + write,
measured in the run), and the FP8 call's speed-up over the bf16 one.  Three FP8 caches: per-tensor descales
(``fp8``, descales of 1), CK's KV block scales (``fp8_blocks``: ``k_descale``/``v_descale`` of shape ``[num_pages,
Hk]``, each page's and head's amax / 448, the pages quantized by them) and CK's per-token-head scales
(``fp8_tokens``: ``[num_pages, page_size, Hk]``, each cached token's and head's amax / 448, and q's ``[Tq, Hq]``).
Timing: bench_serving's (CUDA events, median, the L2 flushed by a 512 MB read before each call).  FP8 output is
checked against the bf16 call's (rel. err < 8 %: e4m3 has 3 mantissa bits).

Prefill (``--parts prefill``; default: both): one sequence of S queries over its S keys in the same pages (32 query
heads over 8 K/V heads, causal), S = 2048 and 8192 over pages of 16, and S = 8192 over pages of 1024 (a key block in
one page: one block scale per block, the only case CK's kernels take), TFLOP/s (4 * Hq * S * S * D, halved for
causal) of each dtype.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

SHAPES = ((1, 8192), (1, 32768), (8, 8192), (32, 8192), (128, 1024), (8, 32768), (32, 32768), (1, 131072))
HQ, HK, D, PAGE = 32, 8, 128, 16


FP8_KINDS = {"fp8": "", "fp8_blocks": "_blocks", "fp8_tokens": "_tokens"}   # call -> suffix of its figures


def fp8_calls(q, kc, vc, kw) -> dict:
    """The calls timed on the same pages: ``bf16``; ``fp8`` (per-tensor descales of 1: the bf16 values rounded to
    e4m3); ``fp8_blocks`` (CK's KV block scales: each page's and head's amax / 448, ``[num_pages, Hk]``);
    ``fp8_tokens`` (CK's per_token_head: each token's and head's amax / 448, q's too)."""
    import torch

    import fmha_dsl

    f8 = torch.float8_e4m3fn
    ones = [torch.ones(1, device="cuda") for _ in range(3)]
    q8, kc8, vc8 = (x.to(f8) for x in (q, kc, vc))
    kd, vd = (x.abs().amax(dim=(1, 3)).float().clamp_min(1e-30) / 448 for x in (kc, vc))   # [num_pages, Hk]
    kb8, vb8 = ((x.float() / d[:, None, :, None]).to(f8) for x, d in ((kc, kd), (vc, vd)))
    qt, kt, vt = (x.abs().amax(dim=-1).float().clamp_min(1e-30) / 448 for x in (q, kc, vc))   # [Tq, Hq], [P, page, Hk]
    qt8, kt8, vt8 = ((x.float() / d[..., None]).to(f8) for x, d in ((q, qt), (kc, kt), (vc, vt)))
    return {"bf16": lambda: fmha_dsl.paged_attention(q, kc, vc, **kw),
            "fp8": lambda: fmha_dsl.paged_attention(q8, kc8, vc8, q_descale=ones[0], k_descale=ones[1],
                                                     v_descale=ones[2], **kw),
            "fp8_blocks": lambda: fmha_dsl.paged_attention(q8, kb8, vb8, q_descale=ones[0], k_descale=kd,
                                                           v_descale=vd, **kw),
            "fp8_tokens": lambda: fmha_dsl.paged_attention(qt8, kt8, vt8, q_descale=qt, k_descale=kt, v_descale=vt,
                                                           **kw)}


def _first_calls(calls: dict, out: dict) -> None:
    """Each call once (its first use: compile and time the candidates), the kernel first use kept for it
    (``out["kernels"]``), and the FP8 outputs' errors against bf16's."""
    import torch

    import fmha_dsl.api_dispatch as api

    disp = api.dispatcher(None, torch.cuda.current_device())   # the default path's (no registry)
    got, out["kernels"] = {}, {}
    for name, fn in calls.items():
        before = set(disp.fast_paged)
        got[name] = fn().float()
        new = [plan for key, plan in disp.fast_paged.items() if key not in before]
        out["kernels"][name] = new[0].entry.name if len(new) == 1 and hasattr(new[0], "entry") else ""
    for name, suffix in FP8_KINDS.items():
        out[f"rel_err{suffix}"] = ((got[name] - got["bf16"]).norm() / got["bf16"].norm()).item()


def _speedups(out: dict) -> None:
    """Each FP8 call's speed-up over bf16 (``speedup``, ``speedup_blocks``, ``speedup_tokens``)."""
    for name, suffix in FP8_KINDS.items():
        out[f"speedup{suffix}"] = out["bf16"]["us"] / out[name]["us"]


def _line(r: dict, unit: str, copy=None) -> str:
    """A row's figures: each call's (``unit``: ``gbs`` with the fraction of ``copy``, or ``tflops``), speed-ups over
    bf16 and FP8 errors (per tensor / block scales / per token)."""
    def fig(n):
        if unit == "gbs":
            return f"{n} {r[n]['us']:8.1f} us {r[n]['gbs']:6.0f} GB/s ({r[n]['gbs'] / copy:4.0%})"
        return f"{n} {r[n]['tflops']:6.1f} TFLOP/s"
    return ("   ".join(fig(n) for n in ("bf16", *FP8_KINDS)) + "   speed-up "
            + " / ".join(f"{r['speedup' + x]:.2f}x" for x in FP8_KINDS.values()) + "   err "
            + " / ".join(f"{r['rel_err' + x]:.3f}" for x in FP8_KINDS.values()))


def _timed_calls(b: int, sq: int, s: int, page: int, out: dict, figure, **kw) -> dict:
    """``out`` with every call of :func:`fp8_calls` timed on one problem: ``b`` sequences of ``sq`` queries over their
    ``s`` cached keys (bf16 values, pages of ``page`` scattered at random), first calls checked, ``figure(name, ms)``
    per call and the speed-ups over bf16."""
    import torch
    from bench_serving import _bench, paged_copy

    g = torch.Generator(device="cuda").manual_seed(0)
    k, v = (torch.randn(b, HK, s, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    kc, vc, bt, _, _ = paged_copy(k, v, page)
    del k, v
    q = torch.randn(b * sq, HQ, D, generator=g, device="cuda", dtype=torch.bfloat16)
    kw.update(block_table=bt, seqlens_k=torch.full((b,), s, dtype=torch.int32, device="cuda"),
              cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32, device="cuda") * sq, max_seqlen_q=sq,
              max_seqlen_k=s)
    calls = fp8_calls(q, kc, vc, kw)
    _first_calls(calls, out)
    for name, fn in calls.items():
        out[name] = figure(name, _bench(fn))
    _speedups(out)
    return out


def row(b: int, s: int) -> dict:
    """Decode: ``b`` sequences of one query over ``s`` keys; bytes of K and V read per second."""
    return _timed_calls(b, 1, s, PAGE, {"batch": b, "seqlen_k": s}, lambda name, ms: {
        "us": ms * 1e3, "gbs": 2 * b * s * HK * D * (2 if name == "bf16" else 1) / ms / 1e6})


def prefill_row(s: int, page: int = PAGE) -> dict:
    """Prefill: one causal sequence of ``s`` queries over its ``s`` keys; TFLOP/s."""
    flops = 4 * HQ * s * s * D / 2
    return _timed_calls(1, s, s, page, {"seqlen": s, "page": page},
                        lambda name, ms: {"us": ms * 1e3, "tflops": flops / ms / 1e9}, causal=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="three shapes")
    ap.add_argument("--parts", default="decode,prefill", help="decode, prefill or both (comma-separated)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if not parts or parts - {"decode", "prefill"}:
        ap.error(f"--parts takes decode, prefill or decode,prefill, got {args.parts!r}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import copy_bandwidth, device_doc

    doc = dict(device_doc(ap), copy_gbs=copy_bandwidth(), rows=[])
    print(f"{doc['device']}: copy {doc['copy_gbs']:.0f} GB/s (read + write)", flush=True)
    for b, s in (SHAPES[:1] + SHAPES[3:5] if args.quick else SHAPES) if "decode" in parts else ():
        r = row(b, s)
        doc["rows"].append(r)
        print(f"B={b:4d} Sk={s:6d}  " + _line(r, "gbs", doc["copy_gbs"]), flush=True)
        print("  kernels: " + ", ".join(f"{n} {k}" for n, k in r["kernels"].items()), flush=True)
        for n in ("rel_err" + x for x in FP8_KINDS.values()):
            if not r[n] < 0.08:
                print(f"  FP8 output off: {n} {r[n]:.3f}", flush=True)
    if doc["rows"]:
        for key, what in (("speedup", "per-tensor"), ("speedup_blocks", "block scales"),
                          ("speedup_tokens", "per-token-head scales")):
            sp = [r[key] for r in doc["rows"]]
            doc[f"geomean_{key}"] = math.exp(sum(map(math.log, sp)) / len(sp))
            print(f"fp8 ({what}) / bf16 decode speed-up: geomean {doc[f'geomean_{key}']:.2f}x, min {min(sp):.2f}x, "
                  f"max {max(sp):.2f}x")
    doc["prefill"] = []
    for s, page in ((2048, PAGE), (8192, PAGE), (8192, 1024)) if "prefill" in parts else ():
        r = prefill_row(s, page)
        doc["prefill"].append(r)
        print(f"prefill S={s:5d} page {page:4d} causal  " + _line(r, "tflops"), flush=True)
        print("  kernels: " + ", ".join(f"{n} {k}" for n, k in r["kernels"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
