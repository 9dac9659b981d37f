"""Does timing a candidate after a run of itself (sustained) rank first use's prefill candidates as a long benchmark
does?  For the prefill classes where bench_default measured the default path under the set's best, first use
decides (fresh cache, ``FMHA_DSL_TUNED_SHIPPED=0``), then its six fastest candidates are timed:

* ``burst``: first use's timer (three flushed launches per candidate per round, round-robin);
* ``warm W``: per candidate and round, W milliseconds of back-to-back flushed launches of that candidate, then five
  timed ones (two rounds);
* ``do_bench``: ``triton.testing.do_bench`` (25 ms warm-up, 100 ms), candidates in order, then in reverse order,
  the mean of the two medians -- what bench_default measures.

    python3 -P bench/probe_sustain.py [--warm-ms 2,10,30,80]
"""

from __future__ import annotations

import argparse
import os
import sys

CASES = (("bf16", 128, 4096, False), ("fp16", 128, 2048, False), ("fp16", 64, 2048, False),
         ("bf16", 64, 2048, False), ("bf16", 128, 2048, True))


def _sustained(torch, launch, plans, warm_us: dict, rounds=2, n=5):
    """{name: median us}: per round and plan, ``warm_us[name]`` worth of flushed back-to-back launches, then ``n``
    timed ones."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.int8, device="cuda")
    samples = {k: [] for k in plans}
    for _ in range(rounds):
        for name, plan in plans.items():
            for _ in range(warm_us[name]):
                flush.zero_()
                launch(plan)
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for t0, t1 in ev:
                flush.zero_()
                t0.record()
                launch(plan)
                t1.record()
            ev[-1][1].synchronize()
            samples[name] += [t0.elapsed_time(t1) * 1000.0 for t0, t1 in ev]
    return {k: sorted(v)[len(v) // 2] for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-ms", default="2,10,30,80", help="comma-separated settle windows in milliseconds")
    args = ap.parse_args()
    windows = [float(x) for x in args.warm_ms.split(",")]
    import torch
    from triton.testing import do_bench

    from fmha_dsl.api_dispatch import timer
    from fmha_dsl.runtime.race import fastest

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from probe_thermal import first_use_top

    for dname, d, s, causal in CASES:
        q, k, v, out, kw, _, _, med, _, plans = first_use_top(torch, dname, d, s, causal, 6)

        def launch(p):
            p.run(q, k, v, out, **kw)

        print(f"== {dname} d{d} s{s} causal={causal}", flush=True)
        cols = {}
        _, cols["burst"] = fastest(timer(0, launch), plans, rounds=4)
        for w in windows:
            cols[f"warm{w:g}"] = _sustained(torch, launch, plans,
                                            {n: max(1, int(w * 1000 / med[n])) for n in plans})
        fw = {n: do_bench(lambda: launch(plans[n]), warmup=25, rep=100) * 1000 for n in plans}
        bw = {n: do_bench(lambda: launch(plans[n]), warmup=25, rep=100) * 1000 for n in reversed(list(plans))}
        cols["do_bench"] = {n: 0.5 * (fw[n] + bw[n]) for n in plans}
        names = list(plans)
        print("   " + "".join(f"{c:>10}" for c in cols) + "  kernel")
        for n in names:
            print("   " + "".join(f"{cols[c][n]:10.1f}" for c in cols) + f"  {n[17:85]}")
        ref = cols["do_bench"]
        best = min(ref.values())
        for c, t in cols.items():
            pick = min(t, key=t.get)
            print(f"   {c:>10}: picks {pick[17:70]}  regret {ref[pick] / best - 1:6.1%}", flush=True)


if __name__ == "__main__":
    main()
