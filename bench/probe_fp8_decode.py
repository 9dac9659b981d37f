"""Probe: every first-use candidate's time for decode over an FP8 cache and over the same cache in bf16.

    FMHA_DSL_TUNE_CANDIDATES=64 python3 -P bench/probe_fp8_decode.py [--fp8-only] [BxS ...]

bench_fp8_serving's shapes and call (GQA 8:1, d128, page 16 scattered); for each dtype the first call's race times
every candidate (``Dispatcher.measured``), printed fastest first with its registers and spills.  A diagnostic for
the FP8 decode path's speed (docs/benchmarks.md, "FP8 KV caches"); bench_fp8_serving.py is the benchmark.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "--fp8-only"]
    if any(len(a.split("x")) != 2 or not all(x.isdigit() for x in a.split("x")) for a in argv):
        print(f"usage: probe_fp8_decode.py [--fp8-only] [BxS ...] (e.g. 32x8192), got {' '.join(argv)}",
              file=sys.stderr)
        return 2
    shapes = [tuple(int(x) for x in a.split("x")) for a in argv] or [(32, 8192), (1, 8192), (128, 1024)]
    import torch

    import fmha_dsl
    from fmha_dsl.api_dispatch import dispatcher

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serving import paged_copy

    hq, hk, d = 32, 8, 128
    for b, s in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        k, v = (torch.randn(b, hk, s, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kc, vc, bt, _, _ = paged_copy(k, v, 16)
        del k, v
        q = torch.randn(b, hq, d, generator=g, device="cuda", dtype=torch.bfloat16)
        kw = dict(block_table=bt, seqlens_k=torch.full((b,), s, dtype=torch.int32, device="cuda"),
                  cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32, device="cuda"), max_seqlen_q=1, max_seqlen_k=s)
        ones = [torch.ones(1, device="cuda") for _ in range(3)]
        for name, args, extra in (("bf16", (q, kc, vc), {}),
                                  ("fp8", tuple(x.to(torch.float8_e4m3fn) for x in (q, kc, vc)),
                                   dict(q_descale=ones[0], k_descale=ones[1], v_descale=ones[2]))):
            if name == "bf16" and "--fp8-only" in sys.argv:
                continue
            disp = dispatcher(None, 0)
            before = set(disp.measured)
            fmha_dsl.paged_attention(*args, **kw, **extra)
            torch.cuda.synchronize()
            res = {e.name: (e.build or {}).get("resources") or {} for e in disp.entries}
            for tk in sorted(set(disp.measured) - before):
                print(f"== {name} B={b} Sk={s} {tk}", flush=True)
                for kname, us in sorted(disp.measured[tk].items(), key=lambda kv: kv[1])[:12]:
                    r = res.get(kname, {})
                    print(f"  {us:9.1f} us  {2 * b * s * hk * d * (1 if name == 'fp8' else 2) / us / 1e3:6.0f} GB/s"
                          f"  regs {r.get('regs')} spills {r.get('spills')}  {kname}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
