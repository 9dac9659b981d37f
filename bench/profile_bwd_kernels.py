"""Kernel by kernel, one backward of ``fmha_dsl.attention``, FlexAttention and cuDNN (torch.profiler, on the GPU).

    python3 -P bench/profile_bwd_kernels.py

Shapes: bf16, 16 heads, 16k tokens (batch = 16384 / seqlen): d128 S=512 non-causal, d128 S=1024 causal and
non-causal, d64 S=512 non-causal -- the small-S shapes where the 1-d stages (``bwd_dot_do_o``) weigh most.  Each
backward is ``torch.autograd.grad`` of a forward through the public API with default arguments, warmed up (first
use decides before the profile), then five are profiled; the device time of each kernel per backward is printed.
A diagnostic, not a benchmark (bench_bwd.py is the benchmark): docs/benchmarks.md quotes it in session 14.
"""

from __future__ import annotations

SHAPES = ((128, 512, False), (128, 1024, True), (128, 1024, False), (64, 512, False))


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torch.profiler import ProfilerActivity, profile

    import fmha_dsl

    flex = torch.compile(flex_attention, dynamic=False)
    for d, s, causal in SHAPES:
        b, h = 16384 // s, 16
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        mask = create_block_mask((lambda b, h, i, j: i >= j) if causal else (lambda b, h, i, j: i >= 0), None, None,
                                 s, s)

        def cudnn(q=q, k=k, v=v, causal=causal):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        calls = (("fmha_dsl", lambda: fmha_dsl.attention(q, k, v, causal=causal)),
                 ("flex", lambda: flex(q, k, v, block_mask=mask)), ("cudnn", cudnn))
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


if __name__ == "__main__":
    main()
