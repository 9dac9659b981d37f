"""Forward attention throughput: every kernel of kernelsets/bench_fwd.fmha vs torch SDPA and FlexAttention.

    python bench/bench_fwd.py --build DIR [--peers sdpa,flex] [--json OUT.json] [--select-from EARLIER.json]

Shapes (the issue's matrix): bf16 and fp16, head dim 64 and 128, 16 heads, 16k tokens per batch
(batch = 16384 // seqlen), seqlen 512 ... 16k, causal and not.  Every kernel of the registry that serves the
problem is timed (CUDA events through triton.testing.do_bench: warm-up, L2 flushed between runs, median);
"best" is the fastest of the set.  Peers in the same run: SDPA's flash, cuDNN and efficient backends, and
FlexAttention (torch.compile).  FLOPs = 4 * B * H * S * S * D (halved for causal).  Every kernel's output is
checked against SDPA before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
TOKENS, HEADS = 16384, 16


def shapes(dtypes, hdims, seqlens, causals):
    for dtype in dtypes:
        for d in hdims:
            for causal in causals:
                for s in seqlens:
                    yield dtype, d, causal, s


def flops(b, h, s, d, causal):
    f = 4 * b * h * s * s * d
    return f / 2 if causal else f


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="build directory of kernelsets/bench_fwd.fmha")
    ap.add_argument("--peers", default="sdpa,flex")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--seqlens", default=",".join(map(str, SEQLENS)))
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--json", default=None)
    ap.add_argument("--flex-budget", type=float, default=240.0, help="seconds of FlexAttention compiles at most")
    ap.add_argument("--select-from", default=None, metavar="JSON",
                    help="time only each shape's --top fastest kernels of an earlier run's JSON (a peer run that "
                         "re-times the set's best next to the peer without timing every kernel again)")
    ap.add_argument("--top", type=int, default=3)
    args = ap.parse_args()
    keep = None
    if args.select_from:
        with open(args.select_from) as f:
            keep = {}
            for r in json.load(f)["rows"]:
                timed = sorted((x["ms"], n) for n, x in r["kernels"].items() if "ms" in x)
                keep[(r["dtype"], r["hdim"], r["causal"], r["seqlen"])] = {n for _, n in timed[: args.top]}

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from fmha_dsl import Problem, Registry
    from fmha_dsl.runtime.dispatch import Dispatcher

    reg = Registry.load(os.path.join(args.build, "registry.json"))
    disp = Dispatcher(reg)
    peers = [p for p in args.peers.split(",") if p]
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16}
    flex = None
    flex_spent = 0.0
    if "flex" in peers:
        import torch._dynamo
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        # one compiled kernel per shape (static shapes, FlexAttention's fastest mode); without a higher limit
        # dynamo stops recompiling after 8 shapes and falls back to the unfused implementation
        torch._dynamo.config.cache_size_limit = 1024
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 1024
        flex = torch.compile(flex_attention, dynamic=False)

    rows = []
    dev = torch.cuda.get_device_name()
    for dtype, d, causal, s in shapes(args.dtypes.split(","), [int(x) for x in args.hdims.split(",")],
                                      [int(x) for x in args.seqlens.split(",")],
                                      [bool(int(x)) for x in args.causal.split(",")]):
        b = TOKENS // s
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, HEADS, s, d, device="cuda", dtype=tdt[dtype]) for _ in range(3))
        out = torch.empty_like(q)
        f = flops(b, HEADS, s, d, causal)
        row = {"dtype": dtype, "hdim": d, "causal": causal, "seqlen": s, "batch": b, "kernels": {}}
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        prob = Problem(family="fwd", dtype=dtype, batch=b, nhead_q=HEADS, nhead_k=HEADS, seqlen_q=s, seqlen_k=s,
                       hdim_q=d, hdim_v=d, mask="top_left" if causal else "no")
        for e in disp.candidates(prob):
            if keep is not None and e.name not in keep.get((dtype, d, causal, s), ()):
                continue
            plan = disp.plan_for(e, prob)
            kw = {"window": (-1, 0), "bottom_right": False} if causal else {}

            def run(plan=plan, kw=kw):
                plan.run(q, k, v, out, **kw)

            run()
            torch.cuda.synchronize()
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            if not math.isfinite(err) or err > 2e-2:
                row["kernels"][e.name] = {"error": err}
                continue
            ms = do_bench(run, warmup=25, rep=100, return_mode="median")
            row["kernels"][e.name] = {"ms": ms, "tflops": f / ms / 1e9, "rel_err": err}
        timed = {n: r for n, r in row["kernels"].items() if "ms" in r}
        if timed:
            best = min(timed, key=lambda n: timed[n]["ms"])
            row["best"] = {"name": best, **timed[best]}
        if "sdpa" in peers:
            for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                             ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
                try:
                    with sdpa_kernel(be):
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        ms = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                      warmup=25, rep=100, return_mode="median")
                    row[f"sdpa_{name}"] = {"ms": ms, "tflops": f / ms / 1e9}
                except RuntimeError as exc:
                    row[f"sdpa_{name}"] = {"error": str(exc).splitlines()[0][:120]}
        if flex is not None:
            if flex_spent > args.flex_budget:
                row["flex"] = {"error": "not measured (compile budget spent)"}
            else:
                t0 = time.perf_counter()
                try:
                    bm = None
                    if causal:
                        bm = create_block_mask(lambda bb, hh, qi, ki: qi >= ki, None, None, s, s, device="cuda")
                    flex(q, k, v, block_mask=bm)
                    torch.cuda.synchronize()
                    flex_spent += time.perf_counter() - t0
                    ms = do_bench(lambda: flex(q, k, v, block_mask=bm), warmup=25, rep=100, return_mode="median")
                    row["flex"] = {"ms": ms, "tflops": f / ms / 1e9}
                except Exception as exc:  # noqa: BLE001  (a peer failing is a result)
                    flex_spent += time.perf_counter() - t0
                    row["flex"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
        rows.append(row)
        if args.json:  # after every shape, so that a run cut short keeps what it measured
            _dump(args.json, dev, rows)
        peer_txt = "  ".join(f"{p}={row[p]['tflops']:.0f}" for p in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient",
                                                                      "flex") if p in row and "tflops" in row[p])
        best_txt = f"best={row['best']['tflops']:.0f} ({len(timed)} kernels)" if timed else "best=none"
        print(f"{dtype} d{d} {'causal' if causal else 'full  '} s{s:>5} b{b:>2}: {best_txt}  {peer_txt}", flush=True)
        torch.cuda.empty_cache()

    print(f"device: {dev}; torch {torch.__version__}; triton {__import__('triton').__version__}", file=sys.stderr)


def _dump(path, dev, rows):
    import torch

    from fmha_dsl.atomic_file import write_atomic

    doc = {"device": dev, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "python": platform.python_version(), "rows": rows}
    write_atomic(path, json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
