"""Does a kernel's timing, and the order of near-tied kernels, depend on how hot the GPU is?  For three prefill
classes where bench_default measured the default path 3-6 % under the set's best: first use decides (fresh cache,
``FMHA_DSL_TUNED_SHIPPED=0``), then its four fastest candidates are timed by ``triton.testing.do_bench`` (plan.run,
in first use's order) and ``attention()`` itself, then by first use's own timer (``runtime.race.fastest``), each
after the GPU idled 3 s ("cool") or ran 8192^3 bf16 matmuls for 3 s ("hot"), twice each.

    python3 -P bench/probe_thermal.py
"""

from __future__ import annotations

import argparse
import time

CASES = (("bf16", 64, 2048, False), ("fp16", 128, 8192, False), ("bf16", 64, 4096, True))


def _settle(torch, state: str, seconds: float = 3.0) -> None:
    """Leave the GPU idle ("cool") or running 8192^3 bf16 matmuls ("hot") for ``seconds``."""
    if state == "cool":
        time.sleep(seconds)
        return
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = time.time()
    while time.time() - t < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def first_use_top(torch, dname: str, d: int, s: int, causal: bool, n: int) -> tuple:
    """A prefill class of bench_fwd's matrix (16 heads, 16k tokens) decided by first use, and the plans of its ``n``
    fastest candidates by first use's burst times: ``(q, k, v, out, kw, dispatcher, problem, times, top, plans)``."""
    import fmha_dsl
    from fmha_dsl import Problem
    from fmha_dsl.api_dispatch import _JIT

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dname]
    b, h = 16384 // s, 16
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dt) for _ in range(3))
    fmha_dsl.attention(q, k, v, causal=causal)
    disp = _JIT[0]
    if not disp.measured:
        raise SystemExit("first use measured nothing: this class is decided in the cache already; run with an empty "
                         "FMHA_DSL_CACHE_DIR and FMHA_DSL_TUNED_SHIPPED=0")
    _, med = list(disp.measured.items())[-1]  # the decision this call made: its candidates' first-use times
    prob = Problem(family="fwd", dtype=dname, arch=disp.arch, batch=b, nhead_q=h, nhead_k=h, seqlen_q=s, seqlen_k=s,
                   max_seqlen_q=s, max_seqlen_k=s, hdim_q=d, hdim_v=d, mask="top_left" if causal else "no")
    top = sorted(med, key=med.get)[:n]
    plans = {}
    for e in disp.candidates(prob):
        if e.name in top and e.name not in plans:
            plans[e.name] = disp.plan_for(e, prob)
    kw = {"window": (-1, 0), "bottom_right": False} if causal else {}
    return q, k, v, torch.empty_like(q), kw, disp, prob, med, top, plans


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    import torch
    from triton.testing import do_bench

    import fmha_dsl
    from fmha_dsl.api_dispatch import timer
    from fmha_dsl.runtime.race import fastest

    for dname, d, s, causal in CASES:
        q, k, v, out, kw, disp, prob, med, top, plans = first_use_top(torch, dname, d, s, causal, 4)
        fl = 4 * q.shape[0] * q.shape[1] * s * s * d / (2 if causal else 1)
        print(f"== {dname} d{d} s{s} causal={causal}; first use decided {disp.decided_kernel(prob, True)[17:80]}",
              flush=True)
        for n in top:
            print(f"   first use {med[n]:8.1f} us  {n[17:80]}")
        for state in ("cool", "hot", "cool", "hot"):
            _settle(torch, state)
            res = {}
            for n in top:
                res[n] = do_bench(lambda: plans[n].run(q, k, v, out, **kw), warmup=25, rep=100) * 1000
            api = do_bench(lambda: fmha_dsl.attention(q, k, v, causal=causal), warmup=25, rep=100) * 1000
            _settle(torch, state)
            _, tm = fastest(timer(0, lambda p: p.run(q, k, v, out, **kw)), plans, rounds=4)
            print(f"  {state}: attention() {api:8.1f} us ({fl/api/1e6:.0f} TFLOP/s)", flush=True)
            for n in top:
                print(f"     do_bench {res[n]:8.1f}  timer {tm[n]:8.1f}  {n[17:80]}", flush=True)


if __name__ == "__main__":
    main()
