"""Where a batch-1 decode call's fixed cost goes: the launch floor, and each kernel's duration by ``torch.profiler``.

    python3 -P bench/probe_decode_latency.py

``fmha_dsl.paged_attention`` (pages of 1024 scattered) and cuDNN-SDPA on the same K/V contiguous, one sequence, GQA
8:1, 8 K/V heads, d128, bf16, contexts 1k / 8k / 32k: bench_serving's timing (read flush), then 20 calls under the
profiler: each kernel's mean duration, the time from the flush's end to the call's first kernel, and from that
kernel's start to the call's last kernel's end.  The floor: one and two one-element torch kernels, timed the same
way.  A diagnostic, not a benchmark (the profiler may serialise launches that programmatic dependent launch
overlaps).
"""

from __future__ import annotations

import os
import sys


def _spans(events) -> tuple[float, float]:
    """Mean (flush end -> first kernel start, first kernel start -> last kernel end) in us over the calls after the
    first five: a call is a run of kernels between the flush's (its memset and reduction)."""
    ks = sorted((e.time_range.start, e.time_range.end, e.name) for e in events)
    runs, cur, last_flush_end = [], [], None
    for start, end, name in ks:
        if "reduce_kernel" in name or "Memset" in name:
            if cur and last_flush_end is not None:
                runs.append((cur[0][0] - last_flush_end, cur[-1][1] - cur[0][0]))
            cur, last_flush_end = [], end
        else:
            cur.append((start, end))
    if cur and last_flush_end is not None:
        runs.append((cur[0][0] - last_flush_end, cur[-1][1] - cur[0][0]))
    runs = runs[5:] or [(0.0, 0.0)]
    return sum(r[0] for r in runs) / len(runs), sum(r[1] for r in runs) / len(runs)


def main() -> None:
    import torch

    import fmha_dsl

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import _bench, _flush, _sdpa, paged_copy

    x = torch.zeros(1, device="cuda")
    print(f"floor: one tiny kernel {1000 * _bench(lambda: x.add_(1)):.2f} us, two "
          f"{1000 * _bench(lambda: (x.add_(1), x.add_(1))):.2f} us", flush=True)
    hk, d = 8, 128
    for sk in (1024, 8192, 32768):
        torch.manual_seed(0)
        q = torch.randn(1, 8 * hk, 1, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, hk, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        q3 = q[:, :, 0].contiguous()
        cq = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
        lens = torch.tensor([sk], dtype=torch.int32, device="cuda")
        kc, vc, bt, _, _ = paged_copy(k, v, 1024)
        calls = {"paged1024": lambda: fmha_dsl.paged_attention(q3, kc, vc, block_table=bt, seqlens_k=lens,
                                                               cu_seqlens_q=cq, max_seqlen_q=1, max_seqlen_k=sk),
                 "cudnn": _sdpa(q, k, v, False, "cudnn")}
        for name, fn in calls.items():
            fn()
            us = 1000 * _bench(fn)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    _flush()
                    fn()
                torch.cuda.synchronize()
            evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            per = {}
            for e in evs:
                if "reduce_kernel" not in e.name and "Memset" not in e.name:
                    per.setdefault(e.name[:48], []).append(e.device_time)
            lead, span = _spans(evs)
            print(f"sk {sk:>6} {name}: {us:.2f} us timed; " + "; ".join(
                f"{n} {sum(t) / len(t):.2f} us" for n, t in per.items())
                + f"; flush end -> first kernel {lead:.2f} us, first kernel -> last end {span:.2f} us", flush=True)


if __name__ == "__main__":
    main()
