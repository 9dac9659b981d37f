"""Host time of a training step's attention: forward + backward through autograd, as a training loop calls it.

    python3 -P bench/bench_train_step.py [--json PATH]

For a tiny problem (1x2x128x64, where the host decides the step time) and a small training shape (32x16x512x64,
causal), bf16: the host time per call (``time.perf_counter_ns`` around each call, GPU synchronised only before and
after the loop, median of 300 after 50 warm-up calls) and ``triton.testing.do_bench``'s time per call (L2 flushed,
median: the step time the GPU sees, host-bound when the host is slower), for

  fmha_fwd_bwd      ``out = fmha_dsl.attention(q, k, v, causal=...)`` then ``torch.autograd.grad(out, (q, k, v), do)``
  fmha_bwd_only     ``fmha_dsl.attention_backward(q, k, v, out, lse, do, causal=...)``
  fmha_fwd_nograd   ``fmha_dsl.attention(...)`` on tensors that do not require grad
  sdpa_fa2_fwd_bwd  the same step through SDPA's flash backend

Default arguments throughout (no registry); the torch fast path is built before timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time


def host_us(fn, torch, n: int = 300, warm: int = 50) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    gc.disable()
    try:
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    torch.cuda.synchronize()
    return statistics.median(ts) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    from triton.testing import do_bench

    import fmha_dsl
    from fmha_dsl.runtime import torch_fast

    doc = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "dtype": "bf16", "shapes": {}}
    for shape in ((1, 2, 128, 64), (32, 16, 512, 64)):
        B, H, S, D = shape
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        causal = S > 128
        out, lse = fmha_dsl.attention(q.detach(), k.detach(), v.detach(), causal=causal, return_lse=True)
        torch_fast.wait(600)

        def fmha_fwd_bwd():
            o = fmha_dsl.attention(q, k, v, causal=causal)
            return torch.autograd.grad(o, (q, k, v), do)

        def fmha_bwd_only():
            return fmha_dsl.attention_backward(q.detach(), k.detach(), v.detach(), out, lse, do, causal=causal)

        def fmha_fwd_nograd():
            return fmha_dsl.attention(q.detach(), k.detach(), v.detach(), causal=causal)

        def sdpa_fa2_fwd_bwd():
            with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.FLASH_ATTENTION]):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return torch.autograd.grad(o, (q, k, v), do)

        row = {}
        for fn in (fmha_fwd_bwd, fmha_bwd_only, fmha_fwd_nograd, sdpa_fa2_fwd_bwd):
            fn()
            row[fn.__name__] = {"host_us": round(host_us(fn, torch), 2),
                                "do_bench_ms": round(do_bench(fn, warmup=25, rep=100, return_mode="median"), 4)}
        doc["shapes"]["x".join(map(str, shape))] = row
        print(shape, json.dumps(row), flush=True)
    if args.json:
        from fmha_dsl.atomic_file import write_atomic

        write_atomic(args.json, json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
