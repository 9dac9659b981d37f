"""Backward calls to profile: ``fmha_dsl.attention``'s, FlexAttention's (and cuDNN's), after a warm-up.

    python3 -P bench/profile_bwd.py warm [SEQLEN]      # first use: compile, time and record the decisions
    ncu --clock-control none -k regex:"fmha_bwd_dq|triton_tem" --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \\
        python3 -P bench/profile_bwd.py one [SEQLEN]
    python3 -P bench/profile_bwd.py kernels            # every kernel's time per backward, by torch.profiler
    python3 -P bench/profile_bwd.py gap                # benchmark time against GPU-bound time, and host time

``warm`` / ``one`` (for Nsight Compute): bf16, d128, causal, 4 x 16 heads x SEQLEN (default 4096);
bench/results/2026-11-24_h200_ncu_bwd_s12run2.txt is their output.  ``kernels``: bf16, 16 heads, 16k tokens, the
small-S shapes where the 1-d stages (``bwd_dot_do_o``) weigh most (d128 S=512 non-causal, S=1024 causal and not,
d64 S=512), ours next to FlexAttention's and cuDNN's; warmed up, then five backwards profiled.  ``gap``: the same
shapes (and d128 S=4096), each backward timed three ways -- as bench_bwd.py times it (``do_bench``: the L2 flushed,
then the call, whose host work runs while the flush does), GPU-bound (the flush followed by a 0.5 ms
``torch.cuda._sleep`` before the start event, so the call's launches are queued before the GPU reaches them) and its
host time alone (``perf_counter`` around one call on an idle GPU, medians): what bench_bwd.py counts beyond the
GPU's own time is the host latency a call leaves exposed.  Every backward is
``torch.autograd.grad`` of a forward through the public API with default arguments (FlexAttention through
``torch.compile`` with a block mask).  Diagnostics, not benchmarks (bench_bwd.py is the benchmark).
"""

from __future__ import annotations

import sys

KERNEL_SHAPES = ((128, 512, False), (128, 1024, True), (128, 1024, False), (64, 512, False))


def _calls(flex, b: int, h: int, s: int, d: int, causal: bool, cudnn: bool):
    """The inputs of one shape and its ``[(name, forward)]``: ours, FlexAttention's (``flex``: the compiled
    ``flex_attention``) and, if asked, cuDNN's."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    import fmha_dsl

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    mask = create_block_mask((lambda b, h, i, j: i >= j) if causal else (lambda b, h, i, j: i >= 0), None, None, s, s)

    def sdpa_cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    calls = [("fmha_dsl", lambda: fmha_dsl.attention(q, k, v, causal=causal)),
             ("flex", lambda: flex(q, k, v, block_mask=mask))]
    if cudnn:
        calls.append(("cudnn", sdpa_cudnn))
    return (q, k, v, do), calls


def _kernel_times(flex) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for d, s, causal in KERNEL_SHAPES:
        (q, k, v, do), calls = _calls(flex, 16384 // s, 16, s, d, causal, cudnn=True)
        for name, forward in calls:
            out = forward()
            for _ in range(3):
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
                torch.cuda.synchronize()
            per = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    per[e.name] = per.get(e.name, 0.0) + e.device_time / 5
            print(f"d{d} S={s} causal={causal} {name}: {sum(per.values()):.1f} us of kernels per backward", flush=True)
            for kname, t in sorted(per.items(), key=lambda x: -x[1])[:6]:
                print(f"    {t:8.1f} us  {kname[:110]}", flush=True)


def _gap(flex) -> None:
    import statistics
    import time

    import torch
    from triton.testing import do_bench

    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for d, s, causal in KERNEL_SHAPES + ((128, 4096, False),):
        (q, k, v, do), calls = _calls(flex, 16384 // s, 16, s, d, causal, cudnn=True)
        for name, forward in calls:
            out = forward()

            def run():
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

            bench = do_bench(run, warmup=25, rep=100, return_mode="median") * 1e3
            gpu, host = [], []
            for _ in range(40):
                flush.zero_()
                torch.cuda._sleep(1_000_000)  # about 0.5 ms: the call's launches are queued before the GPU gets there
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                run()
                b.record()
                torch.cuda.synchronize()
                gpu.append(a.elapsed_time(b) * 1e3)
                t0 = time.perf_counter()
                run()
                host.append((time.perf_counter() - t0) * 1e6)
                torch.cuda.synchronize()
            g, h = statistics.median(gpu), statistics.median(host)
            print(f"d{d} S={s} causal={causal} {name:9s} bench {bench:8.1f} us  gpu-bound {g:8.1f} us  "
                  f"exposed {bench - g:7.1f} us ({(bench - g) / bench:6.1%})  host per call {h:7.1f} us", flush=True)


def main() -> None:
    args = sys.argv[1:]
    if not (args in (["kernels"], ["gap"]) or args[:1] in (["warm"], ["one"]) and len(args) <= 2
            and all(a.isdigit() and int(a) > 0 for a in args[1:])):
        print("usage: python3 -P bench/profile_bwd.py warm|one [SEQLEN] | kernels | gap  (SEQLEN: a positive integer)",
              file=sys.stderr)
        sys.exit(2)
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    if sys.argv[1] in ("kernels", "gap"):
        (_kernel_times if sys.argv[1] == "kernels" else _gap)(flex)
        return

    s = int(sys.argv[2]) if len(sys.argv) == 3 else 4096
    (q, k, v, do), calls = _calls(flex, 4, 16, s, 128, True, cudnn=False)
    for name, forward in calls:
        out = forward()
        for _ in range(3 if sys.argv[1] == "warm" else 1):
            torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        print(name, flush=True)


if __name__ == "__main__":
    main()
