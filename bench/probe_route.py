"""Is a gap between the default path and the best-in-set kernel the route's or the timing's?

    python3 -P bench/probe_route.py [--rounds N] [DTYPE,D,MASK,SEQLEN ...]

For each problem (default: ``bf16,64,causal,16384 fp16,64,full,8192``; 16 heads, 16k tokens, BHSD, as
bench_default.py's prefill matrix) the same kernel is timed two ways, in turn: A = ``fmha_dsl.attention(q, k, v)``
as a user calls it (the torch fast path once it is ready), B = ``plan.run`` of the plan of the kernel first use
decided for it (the route bench_default.py's best-in-set column takes, into a preallocated output).  Printed: the
GPU kernels one call of each launches and their device time (torch profiler), ``--rounds`` do_bench timings of each
alternated A/B and then B/A with the median ratio, and 50 back-to-back calls of each (no L2 flush).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

USAGE = "probe_route.py [--rounds N] [DTYPE,D,MASK,SEQLEN ...]"
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
MASKS = {"full": False, "causal": True}


def shape(text: str) -> tuple[str, int, bool, int]:
    """``DTYPE,D,MASK,SEQLEN`` -> (dtype, head dim, causal, seqlen); ValueError with what is wrong."""
    parts = text.split(",")
    if len(parts) != 4:
        raise ValueError(f"{text!r}: expected DTYPE,D,MASK,SEQLEN (e.g. bf16,64,causal,16384)")
    dt, d, mask, s = parts
    if dt not in TORCH_DTYPES:
        raise ValueError(f"{text!r}: DTYPE is one of {', '.join(TORCH_DTYPES)}")
    if mask not in MASKS:
        raise ValueError(f"{text!r}: MASK is one of {', '.join(MASKS)}")
    if not (d.isdigit() and 0 < int(d) <= 256):
        raise ValueError(f"{text!r}: D is a head dim from 1 to 256")
    if not (s.isdigit() and 0 < int(s) <= 16384):
        raise ValueError(f"{text!r}: SEQLEN is a positive integer up to 16384 (16k tokens per problem)")
    return dt, int(d), MASKS[mask], int(s)


def probe(dt: str, d: int, causal: bool, s: int, rounds: int) -> None:
    import torch
    import triton
    from torch.profiler import ProfilerActivity, profile

    import fmha_dsl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_default import HEADS, TOKENS, _decided, _problem

    b = max(1, TOKENS // s)
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, HEADS, s, d, device="cuda", dtype=getattr(torch, TORCH_DTYPES[dt])) for _ in range(3))
    ref = fmha_dsl.attention(q, k, v, causal=causal)
    disp = sys.modules["fmha_dsl.attention"]._JIT.get(q.get_device())
    prob = _problem(q, k, v, causal)
    name = _decided(disp, q, k, v, causal)
    plan = disp.plan_for(next(e for e in disp.candidates(prob) if e.name == name), prob)
    out = torch.empty_like(q)
    kw = {"window": (-1, 0), "bottom_right": False} if causal else {}
    routes = {"A attention()": lambda: fmha_dsl.attention(q, k, v, causal=causal),
              "B plan.run": lambda: plan.run(q, k, v, out, **kw)}
    routes["B plan.run"]()
    torch.cuda.synchronize()
    print(f"{dt} d{d} {'causal' if causal else 'full'} s{s} (batch {b}): {name}; "
          f"max |A - B| = {(ref.float() - out.float()).abs().max().item():.3g}")
    for label, fn in routes.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        launched = [(e.key[:60], round(e.device_time_total / 3, 1)) for e in prof.key_averages()
                    if e.device_time_total > 0]
        print(f"  {label}: kernels per call (name, device us) {launched}")
    for order in (("A attention()", "B plan.run"), ("B plan.run", "A attention()")):
        us = {n: [] for n in order}
        for _ in range(rounds):
            for n in order:
                us[n].append(triton.testing.do_bench(routes[n]) * 1e3)
        ratio = statistics.median(us["B plan.run"]) / statistics.median(us["A attention()"])
        print(f"  do_bench, {order[0][0]} first in each round: A {[round(x) for x in us['A attention()']]} us, "
              f"B {[round(x) for x in us['B plan.run']]} us, median B/A {ratio:.3f}")
    for label, fn in list(routes.items()) * 2:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(50):
            fn()
        end.record()
        torch.cuda.synchronize()
        print(f"  50 back-to-back calls, {label}: {start.elapsed_time(end) / 50 * 1e3:.0f} us each")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(usage=USAGE)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("shapes", nargs="*", default=["bf16,64,causal,16384", "fp16,64,full,8192"])
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    try:
        shapes = [shape(t) for t in args.shapes]
    except ValueError as exc:
        ap.error(str(exc))
    for sh in shapes:
        probe(*sh, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
