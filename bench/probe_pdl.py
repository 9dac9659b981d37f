"""Probe: what programmatic dependent launch saves at a split -> combine kernel boundary on this GPU (sm90+).

    python3 -P bench/probe_pdl.py [--json PATH]

Two Triton kernels stand in for a split-KV decode: ``split`` (256 programs, each summing a slice of a bf16 buffer of
1-128 MB into one partial) and ``combine`` (one program summing the partials).  Each pair is launched 100 times back
to back in one stream behind a kernel that sleeps 20 ms, so the host's launch cost is hidden and the time per pair
is the GPU's, boundaries included; the same pairs are also timed in a CUDA graph.  Variants: plain launches; the
combine launched with programmatic stream serialization (``launch_pdl``) and waiting for the split kernel in the
kernel (``gdc_wait``); the same with the split kernel releasing its dependents at its start
(``gdc_launch_dependents``); and both kernels launched that way.  Every pair's result is checked against torch.
Not a product kernel: it sized the combine's overlapped launch (docs/benchmarks.md, "Decode", session 18).
"""

from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def split(x, part, n_per: tl.constexpr, RELEASE: tl.constexpr, WAIT: tl.constexpr):
        pid = tl.program_id(0)
        if WAIT:
            gdc_wait()
        if RELEASE:
            gdc_launch_dependents()
        offs = tl.arange(0, 1024)
        acc = tl.zeros([1024], tl.float32)
        for i in range(0, n_per, 1024):
            acc += tl.load(x + pid * n_per + i + offs).to(tl.float32)
        tl.store(part + pid, tl.sum(acc))

    @triton.jit
    def combine(part, out, P: tl.constexpr, WAIT: tl.constexpr):
        if WAIT:
            gdc_wait()
        tl.store(out + tl.program_id(0), tl.sum(tl.load(part + tl.arange(0, P))))

    variants = {"plain": (False, False, False), "combine_pdl": (False, True, False),
                "combine_pdl_release": (False, True, True), "both_pdl_release": (True, True, True)}
    programs, pairs = 256, 100
    rows = []
    for numel in (1 << 20, 1 << 21, 1 << 24, 1 << 26):
        x = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
        part = torch.empty(programs, device="cuda")
        out = torch.empty(1, device="cuda")
        want = x.float().sum().item()
        row = {"mbytes": 2 * numel / 2**20}
        for name, (pdl_split, pdl_combine, release) in variants.items():
            def pair():
                split[(programs,)](x, part, numel // programs, RELEASE=release, WAIT=pdl_split, launch_pdl=pdl_split)
                combine[(1,)](part, out, programs, WAIT=pdl_combine, launch_pdl=pdl_combine)

            pair()
            torch.cuda.synchronize()
            if abs(out.item() - want) > 1e-2 * max(1.0, abs(want)) + 1:
                raise SystemExit(f"{name}: wrong sum {out.item()} (want {want})")
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(2e9 * 0.02))
            t0.record()
            for _ in range(pairs):
                pair()
            t1.record()
            torch.cuda.synchronize()
            stream_us = t0.elapsed_time(t1) / pairs * 1e3
            graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            with torch.cuda.stream(side):
                pair()
                torch.cuda.synchronize()
                with torch.cuda.graph(graph, stream=side):
                    for _ in range(50):
                        pair()
            graph.replay()
            t0.record()
            for _ in range(20):
                graph.replay()
            t1.record()
            torch.cuda.synchronize()
            row[name] = {"stream_us": round(stream_us, 2), "graph_us": round(t0.elapsed_time(t1) / 1000 * 1e3, 2)}
            print(f"{row['mbytes']:6.0f} MB  {name:20s} stream {stream_us:7.2f} us/pair  graph "
                  f"{row[name]['graph_us']:7.2f} us/pair", flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                       "pairs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
