"""Backward calls for Nsight Compute: ``fmha_dsl.attention``'s and FlexAttention's, after a warm-up process.

    python3 -P bench/profile_bwd.py warm [SEQLEN]      # first use: compile, time and record the decisions
    ncu --clock-control none -k regex:"fmha_bwd_dq|triton_tem" --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \\
        python3 -P bench/profile_bwd.py one [SEQLEN]

Shape: bf16, d128, causal, 4 x 16 heads x SEQLEN (default 4096) -- default arguments, as a user calls them
(``torch.autograd.grad`` of a forward through the public API; FlexAttention through ``torch.compile`` with a causal
block mask).  A diagnostic (registers, occupancy, pipe utilisation per kernel), not a benchmark:
bench/results/2026-11-24_h200_ncu_bwd_s12run2.txt is its output.
"""

from __future__ import annotations

import sys


def main() -> None:
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in ("warm", "one"):
        sys.exit("usage: python3 -P bench/profile_bwd.py warm|one [SEQLEN]")
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import fmha_dsl

    b, h, s, d = 4, 16, int(sys.argv[2]) if len(sys.argv) == 3 else 4096, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    flex = torch.compile(flex_attention, dynamic=False)
    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, s, s)
    calls = (("fmha_dsl", lambda: fmha_dsl.attention(q, k, v, causal=True)),
             ("flex", lambda: flex(q, k, v, block_mask=mask)))
    for name, forward in calls:
        out = forward()
        for _ in range(3 if sys.argv[1] == "warm" else 1):
            torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        print(name, flush=True)


if __name__ == "__main__":
    main()
