"""Sweep the backward template's launch configurations on this GPU: which tiles, warp counts and stage counts are
worth adding to ``fmha_dsl/data/triton_bwd.json``.

    python3 -P bench/sweep_bwd_configs.py [--configs 64x128w8s3,...] [--hdims 64,128] [--seqlens 1024,4096]
                                          [--causal 0,1] [--dtype bf16] [--deterministic] [--json PATH]

The product kernels (``fmha_dsl.kernels.triton_bwd``) run through Triton's JIT with the constexprs a build gives
them (batch mode, no padding), arguments from the ABI's packer; 16 heads, 16k tokens.  Each configuration's
gradients are checked against SDPA-flash's, then the three stages are timed together (do_bench, median), next to
SDPA's flash and cuDNN backward measured in the same run.  FLOPs = 2.5 x 4 B H S^2 D, halved for causal.
"""

from __future__ import annotations

import argparse
import json

# MxNwWsS[t]: BLOCK_M x BLOCK_N, W warps, S stages; a trailing t: Q/dO by TMA descriptors, dQ by TMA bulk reduction
CONFIGS = ("32x64w4s3,64x64w4s3,64x64w4s2,32x128w8s3,64x128w8s3,64x128w8s2,128x128w8s2,64x128w4s2,"
           "32x128w4s3,128x64w8s2,16x128w8s4")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    # on-device tensor descriptors (the t configs) need global scratch from an allocator under the JIT
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))

    from fmha_dsl.kernels import bwd_abi
    from fmha_dsl.kernels import triton_bwd as T

    t = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rows = []
    for d in (int(x) for x in args.hdims.split(",")):
        for causal in (bool(int(x)) for x in args.causal.split(",")):
            for s in (int(x) for x in args.seqlens.split(",")):
                b, h = 16384 // s, 16
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, do = (torch.randn(b, h, s, d, generator=g, device="cuda", dtype=t) for _ in range(4))
                flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
                peers = {}
                for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    with sdpa_kernel(be):
                        o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
                    ms = do_bench(lambda: torch.autograd.grad(o, (qr, kr, vr), do, retain_graph=True), warmup=25,
                                  rep=100, return_mode="median")
                    peers[name] = flops / ms / 1e9
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
                ref = torch.autograd.grad(o, (qr, kr, vr), do)
                import fmha_dsl

                out, lse = fmha_dsl.attention(q, k, v, causal=causal, return_lse=True)
                print(f"{args.dtype} d{d} S={s} causal={causal}: flash {peers['flash']:.1f} cudnn "
                      f"{peers['cudnn']:.1f} TFLOP/s", flush=True)
                for cfg in args.configs.split(","):
                    mn, rest = cfg.split("w")
                    m, n = (int(x) for x in mn.split("x"))
                    tma = rest.endswith("t")
                    w, st = (int(x) for x in rest.rstrip("t").split("s"))
                    row = {"d": d, "seqlen": s, "causal": causal, "config": cfg, **peers}
                    try:
                        run = _runner(T, bwd_abi, q, k, v, out, lse, do, m, n, w, st, causal, args.dtype,
                                      args.deterministic, tma)
                        got = run()
                        err = max(((x.float() - y.float()).norm() / y.float().norm()).item()
                                  for x, y in zip(got, ref))
                        ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                        row.update(tflops=flops / ms / 1e9, err=err)
                        print(f"  {cfg:14s} {row['tflops']:7.1f} TFLOP/s  ({row['tflops'] / peers['cudnn']:.3f}x cudnn,"
                              f" {row['tflops'] / peers['flash']:.3f}x flash)  err {err:.1e}", flush=True)
                    except Exception as exc:  # noqa: BLE001  (a config that does not compile is a result)
                        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
                        print(f"  {cfg:14s} {row['error']}", flush=True)
                    rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _runner(T, bwd_abi, q, k, v, out, lse, do, m, n, w, stages, causal, dtype, deterministic, tma=False):
    import torch

    b, h, s, d = q.shape
    sig = {"dtype": dtype, "mode": "batch", "hdim_q": d, "hdim_v": d, "mask": "top_left" if causal else "no",
           "bias": "no", "dbias": False, "dropout": False, "logits": False, "sink": False,
           "deterministic": deterministic}
    alg = {"tile": (m, n), "pad_s": 0, "pad_sk": 0, "pad_d": 0, "pad_dv": 0,
           "pipeline": "bwd_trload" if tma else "bwd_async"}
    consts = {f: T.constexprs(dict(sig, family=f), alg) for f in T.KERNELS}
    ws = bwd_abi.workspace(b, h, s, s, d, n, deterministic)
    buf = torch.empty(ws["numel"], device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ptrs = {"q": q, "k": k, "v": v, "out": out, "dout": do, "lse": lse, "dq": dq, "dk": dk, "dv": dv,
            **bwd_abi.workspace_parts(buf, ws)}
    dot, main, conv = bwd_abi.pack(ptrs, False, q.stride(), k.stride(), v.stride(), out.stride(), do.stride(),
                                   dq.stride(), dk.stride(), dv.stride(), lse.stride(), None, None, None, ws, nhq=h,
                                   nhk=h, dq=d, dv=d, sq=s, sk=s, msq=s, msk=s, scale=None, softcap=None,
                                   dropout_p=0.0, seed=0, offset=0, wl=-1, wr=0 if causal else -1, br=True, sink=0)
    for lst in (dot, main, conv):  # absent pointers (bias, cu_seqlens): any tensor, never read by these constexprs
        for i, x in enumerate(lst):
            if x is None:
                lst[i] = buf
    g1, g2, g3 = bwd_abi.grids(b, h, h, s, s, n, deterministic)
    acc = ptrs["acc"]

    def run():
        acc.zero_()
        T.fmha_bwd_dot_do_o[g1](*dot, **consts["bwd_dot_do_o"], num_warps=4)
        T.fmha_bwd_dq_dk_dv[g2](*main, **consts["bwd_dq_dk_dv"], num_warps=w, num_stages=stages)
        if bwd_abi.converts(deterministic):  # (the deterministic dQ programs store dQ themselves)
            T.fmha_bwd_convert_dq[g3](*conv, **consts["bwd_convert_dq"], num_warps=4)
        return dq, dk, dv
    return run


if __name__ == "__main__":
    main()
