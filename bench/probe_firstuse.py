"""How close is first use's choice to the fastest candidate, timed by a path that shares no host code with it?

For each class below, a fresh process (``FMHA_DSL_TUNED_SHIPPED=0``, empty cache) calls the public API once, so
first use compiles and times its candidates (``fmha_dsl.api_dispatch.timer``: Python-path launches on the call's
tensors, an L2 flush and events around each, round-robin, medians).  Then every candidate it timed is timed again
two ways on the same tensors:

* ``timer``: first use's own timer, six more rounds (:func:`fmha_dsl.runtime.race.fastest`);
* ``graph``: the candidate's plan captured in a CUDA graph and replayed (one graph launch of host work), each replay
  after an L2 flush, every batch behind a GPU sleep longer than the host's enqueue: the GPU's time alone.

A row reports first use's decision, its ``graph`` time against the ``graph`` best (the regret), the timer's
largest deviation from ``graph`` over the candidates, and the host time of one Python-path launch (what the timer
would see if the GPU ran out of work: a kernel shorter than the host's enqueue).

    python3 -P bench/probe_firstuse.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

# (label, family, dtype, batch, nhead_q, nhead_k, seqlen_q, seqlen_k, head dim, causal)
CASES = (
    ("decode b1 8k", "fwd", "bf16", 1, 32, 4, 1, 8192, 128, False),
    ("decode b8 8k", "fwd", "bf16", 8, 32, 4, 1, 8192, 128, False),
    ("decode b32 8k", "fwd", "bf16", 32, 32, 4, 1, 8192, 128, False),
    ("decode b1 32k", "fwd", "bf16", 1, 32, 8, 1, 32768, 128, False),
    ("decode b64 2k sq4", "fwd", "bf16", 64, 32, 8, 4, 2048, 128, False),
    ("prefill d128 s512 causal", "fwd", "bf16", 32, 16, 16, 512, 512, 128, True),
    ("prefill d64 s1024", "fwd", "fp16", 16, 16, 16, 1024, 1024, 64, False),
    ("bwd d128 s512", "bwd", "bf16", 32, 16, 16, 512, 512, 128, False),
    ("bwd d128 s1024 causal", "bwd", "bf16", 16, 16, 16, 1024, 1024, 128, True),
    ("bwd d64 s4096", "bwd", "bf16", 4, 16, 16, 4096, 4096, 64, False),
)


def _sleep_rate(torch) -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep``."""
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    t0.record()
    torch.cuda._sleep(2_000_000)
    t1.record()
    t1.synchronize()
    return 2_000_000 / (t0.elapsed_time(t1) * 1000.0)


def _graph_times(torch, launch, plans, reps=20):
    """{name: median us} of each plan replayed from a CUDA graph, each replay after an L2 flush."""
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.int8, device="cuda")
    rate = _sleep_rate(torch)
    out = {}
    for name, plan in plans.items():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            launch(plan)  # warm (allocations made outside the capture)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch(plan)
        ts = []
        for _ in range(2):
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            torch.cuda._sleep(int(rate * 3000))
            for t0, t1 in ev:
                flush.zero_()
                t0.record()
                g.replay()
                t1.record()
            ev[-1][1].synchronize()
            ts += [t0.elapsed_time(t1) * 1000.0 for t0, t1 in ev]
        ts.sort()
        out[name] = ts[len(ts) // 2]
        del g
    return out


def _case(torch, fmha_dsl, case):
    from fmha_dsl.api_dispatch import _JIT as jit  # device -> the compile-on-first-use dispatcher
    from fmha_dsl.api_dispatch import timer
    from fmha_dsl.runtime.race import fastest

    label, family, dtype, b, hq, hk, sq, sk, d, causal = case
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    torch.manual_seed(0)
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=tdt)
    k, v = (torch.randn(b, hk, sk, d, device="cuda", dtype=tdt) for _ in range(2))
    if family == "fwd":
        fmha_dsl.attention(q, k, v, causal=causal)
        disp = jit[0]
        out = torch.empty_like(q)
        kw = {"window": (-1, 0), "bottom_right": False} if causal else {}

        def launch(plan):
            plan.run(q, k, v, out, **kw)
    else:
        o, lse = fmha_dsl.attention(q, k, v, causal=causal, return_lse=True)
        do = torch.randn_like(o)
        fmha_dsl.attention_backward(q, k, v, o, lse, do, causal=causal)
        disp = jit[0]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kw = {"max_seqlen_q": sq, "max_seqlen_k": sk}
        if causal:
            kw.update(window=(-1, 0), bottom_right=False)
        tensors = (q, k, v, o, lse, do, dq, dk, dv)

        def launch(plan):
            plan.run(*tensors, **kw)
    _, med_first = list(disp.measured.items())[-1]  # the decision this call made: its candidates' first-use times
    prob = _problem_from(disp, case)
    by_name = {}
    for e in disp.candidates(prob):
        if e.name in med_first and e.name not in by_name:
            by_name[e.name] = e
    plans = {}
    for name, e in by_name.items():
        try:
            plans[name] = disp.plan_for(e, prob)
        except Exception as exc:  # noqa: BLE001  (a probe: report and go on)
            print(f"  {name}: no plan ({exc})", flush=True)
    torch.cuda.synchronize()
    host_only = {}
    for name, pl in plans.items():
        t = time.perf_counter()
        for _ in range(20):
            launch(pl)
        host_only[name] = (time.perf_counter() - t) * 1e6 / 20
        torch.cuda.synchronize()
    pick_timer, med_timer = fastest(timer(0, launch), plans, rounds=6)
    truth = _graph_times(torch, launch, plans)
    best = min(truth, key=truth.get)
    first = disp.decided_kernel(prob, True)
    dev = max(abs(med_timer[n] / truth[n] - 1) for n in truth if n in med_timer)
    row = {"case": label, "candidates": len(plans), "host_us_per_launch": host_only, "first_use": first,
           "first_use_us": med_first, "timer_us": med_timer, "graph_us": truth, "graph_best": best,
           "timer_pick": pick_timer, "regret_first_use": truth[first] / truth[best] if first in truth else None,
           "regret_timer": truth[pick_timer] / truth[best], "timer_max_deviation": dev}
    reg = row["regret_first_use"]
    print(f"{label}: {len(plans)} candidates, host {min(host_only.values()):.0f}-{max(host_only.values()):.0f} us a "
          f"launch; first use's regret {'-' if reg is None else f'{reg:.4f}'} (graph best {truth[best]:.1f} us, "
          f"{best[:64]}); timer within {100 * dev:.1f} % of graph on every candidate, its pick's regret "
          f"{row['regret_timer']:.4f}", flush=True)
    for name in sorted(plans, key=truth.get):
        print(f"    graph {truth[name]:8.1f}  timer {med_timer.get(name, 0):8.1f}  first use "
              f"{med_first.get(name, 0):8.1f}  host {host_only[name]:6.1f}  {name[:90]}", flush=True)
    return row


def _problem_from(disp, case):
    from fmha_dsl import Problem

    label, family, dtype, b, hq, hk, sq, sk, d, causal = case
    return Problem(family="fwd" if family == "fwd" else "bwd_dq_dk_dv", dtype=dtype, arch=disp.arch, batch=b,
                   nhead_q=hq, nhead_k=hk, seqlen_q=sq, seqlen_k=sk, max_seqlen_q=sq, max_seqlen_k=sk, hdim_q=d,
                   hdim_v=d, mask="top_left" if causal else "no")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    import fmha_dsl

    rows = []
    for case in CASES:
        try:
            rows.append(_case(torch, fmha_dsl, case))
        except Exception as exc:  # noqa: BLE001  (a probe: report and go on)
            print(f"{case[0]}: failed: {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache()
    doc = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
