"""What padding costs one kernel: each first-use candidate tile timed padded on a length off the tile, padded on the
aligned length, and unpadded on the aligned length (d128, bf16, 16 heads, 16k tokens, BHSD), next to cuDNN on both.

    python bench/probe_padcost.py [--cases 1000:1024:0,1000:1024:1,4095:4096:0] [--pipelines qr_async]
                                  [--tiles 64x64,128x64,128x128,64x128] [--json OUT.json]

A case is ``padded_len:aligned_len:causal``.  The padded kernels come from the first-use candidates of the padded
length (every sequence dim padded), the unpadded ones from the aligned length's; each is planned on both lengths
and timed with ``triton.testing.do_bench`` (L2 flushed, median).  A probe, not the user path: bench_default.py's
``padded`` part measures what ``fmha_dsl.attention`` gives.
"""

from __future__ import annotations

import argparse
import json

HEADS, TOKENS, HDIM = 16, 16384, 128


def cases(text: str) -> list[tuple[int, int, bool]]:
    """``--cases``: comma-separated ``padded_len:aligned_len:causal``, e.g. ``1000:1024:1``."""
    out = []
    for case in text.split(","):
        try:
            s_pad, s_al, causal = (int(x) for x in case.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{case!r} is not padded_len:aligned_len:causal (e.g. 1000:1024:1)")
        if min(s_pad, s_al) < 1 or s_al % 128 or causal not in (0, 1):
            raise argparse.ArgumentTypeError(f"{case!r}: lengths of at least 1, the aligned one a multiple of 128, "
                                             "causal 0 or 1")
        out.append((s_pad, s_al, bool(causal)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=cases, default="1000:1024:0,1000:1024:1,4095:4096:0")
    ap.add_argument("--pipelines", default="qr_async")
    ap.add_argument("--tiles", default="64x64,128x64,128x128,64x128")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from fmha_dsl import Problem
    from fmha_dsl.first_use import Builder
    from fmha_dsl.runtime.dispatch import Dispatcher, detect_arch

    arch = detect_arch()
    builder = Builder()
    disp = Dispatcher(None, arch, tuned_dir="")
    pipelines, tiles = set(args.pipelines.split(",")), set(args.tiles.split(","))

    def problem(s, causal):
        return Problem(family="fwd", dtype="bf16", arch=arch, batch=TOKENS // s, nhead_q=HEADS, nhead_k=HEADS,
                       seqlen_q=s, seqlen_k=s, max_seqlen_q=s, max_seqlen_k=s, hdim_q=HDIM, hdim_v=HDIM,
                       mask="top_left" if causal else "no")

    def picked(entries):
        return [e for e in entries if e.sig["family"] == "fwd" and e.alg["pipeline"] in pipelines
                and "x".join(map(str, e.alg["tile"][:2])) in tiles]

    rows = []
    for s_pad, s_al, causal in args.cases:
        case = f"{s_pad}:{s_al}:{int(causal)}"
        entries = picked(builder.candidates(problem(s_pad, causal), arch, True, 64))
        entries += picked(builder.candidates(problem(s_al, causal), arch, True, 64))
        built = [(e, b) for e, b in builder.compile(entries) if isinstance(b, dict)]
        disp.add_many(built)
        kw = {"window": (-1, 0), "bottom_right": False} if causal else {}
        for s in (s_pad, s_al):
            torch.manual_seed(0)
            q, k, v = (torch.randn(TOKENS // s, HEADS, s, HDIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out = torch.empty_like(q)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            row = {"case": case, "seqlen": s, "causal": causal, "us": {}}
            for e, _ in built:
                padded = bool(e.alg["pad_s"] or e.alg["pad_sk"])
                if not padded and s % 128:
                    continue
                plan = disp.plan_for(e, problem(s, causal))
                plan.run(q, k, v, out, **kw)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                if not err < 2e-2:
                    row["us"][e.name] = f"wrong result (rel err {err:.2g})"
                    continue
                row["us"][e.name] = 1000 * do_bench(lambda: plan.run(q, k, v, out, **kw), warmup=25, rep=100,
                                                    return_mode="median")
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                row["cudnn_us"] = 1000 * do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                                  warmup=25, rep=100, return_mode="median")
            for name, t in row["us"].items():
                print(f"{case} s{s} {name}: {t if isinstance(t, str) else f'{t:.1f} us'}", flush=True)
            print(f"{case} s{s} cudnn: {row['cudnn_us']:.1f} us", flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
