"""The backward as a user gets it: ``fmha_dsl.attention(q, k, v)`` on tensors that require grad, then autograd.

    python bench/bench_bwd.py [--quick] [--peers flash,cudnn,efficient,flex] [--json OUT.json]

Matrix: bf16 and fp16, head dim 64 and 128, 16 heads, 16k tokens (batch = 16384 / seqlen), seqlen 512..16k, causal
and not.  Each shape times ``torch.autograd.grad(out, (q, k, v), dout)`` of a forward made through the public API
with default arguments (first use compiles, times and records its choice; the figure is the steady state after it),
next to SDPA's flash (FA2), cuDNN and efficient backends and FlexAttention (``torch.compile(flex_attention)``)
measured in the same run, on the same tensors.  Every gradient is checked against SDPA-flash's before it is timed.
Then the cost of ``deterministic=True`` and of group mode (equal-length varlen batches) through the explicit
``fmha_dsl.attention_backward``.

FLOPs (FlashAttention's convention): backward = 2.5 x forward = 2.5 x 4 B H Sq Sk D, halved under a causal mask.
Timing: triton.testing.do_bench (warm-up, L2 flushed, median).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
TOKENS, HEADS = 16384, 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="bf16 only, three lengths")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--costs", default="deterministic,group", help="the cost parts to run ('' for none)")
    ap.add_argument("--peers", default="flash,cudnn,efficient,flex")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    doc = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "python": platform.python_version(),
           "flops": "2.5 * 4*B*H*Sq*Sk*D, halved for causal", "rows": [], "deterministic": [], "group": []}

    def save():
        if args.json:
            from fmha_dsl.atomic_file import write_atomic

            write_atomic(args.json, json.dumps(doc, indent=1))

    peers = [p for p in args.peers.split(",") if p]
    dtypes = ("bf16",) if args.quick else tuple(args.dtypes.split(","))
    seqlens = (1024, 4096, 16384) if args.quick else SEQLENS
    for dt in dtypes:
        for d in (int(x) for x in args.hdims.split(",")):
            for causal in (False, True):
                for s in seqlens:
                    row = shape(dt, d, s, causal, peers)
                    doc["rows"].append(row)
                    print(_line(row), flush=True)
                    save()
    for kind in filter(None, args.costs.split(",")):
        doc[kind] = costs(kind, (2048, 8192))
        save()
    summarize(doc)
    save()


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def flops(b, h, sq, sk, d, causal) -> float:
    f = 2.5 * 4.0 * b * h * sq * sk * d
    return f / 2 if causal else f


def _tensors(dt, b, h, s, d, seed=0):
    import torch

    t = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(b, h, s, d, generator=g, device="cuda", dtype=t) for _ in range(4))
    return q, k, v, do


def _grads(forward, q, k, v, do):
    """``run()`` -> the gradients of ``forward(q, k, v)`` for ``do``, reusing one recorded graph."""
    import torch

    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = forward(q, k, v)

    def run():
        return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    return run


def _peer_forward(name, causal):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "flex":
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        # one compile per shape of the matrix: past dynamo's default recompile limit flex would silently fall back to
        # its unfused (materialising) implementation
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 1024)

        flex = torch.compile(flex_attention, dynamic=False)

        def fwd(q, k, v):
            bm = None
            if causal:
                bm = create_block_mask(lambda b, h, i, j: i >= j, None, None, q.shape[2], k.shape[2])
            return flex(q, k, v, block_mask=bm)
        return fwd
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]

    def fwd(q, k, v):
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fwd


def _rel(a, b) -> float:
    return max(((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)).item() for x, y in zip(a, b))


def shape(dt, d, s, causal, peers) -> dict:
    import torch

    import fmha_dsl

    b = TOKENS // s
    q, k, v, do = _tensors(dt, b, HEADS, s, d)
    f = flops(b, HEADS, s, s, d, causal)
    row = {"dtype": dt, "d": d, "seqlen": s, "batch": b, "heads": HEADS, "causal": causal, "flops": f}
    ref = _grads(_peer_forward("flash", causal), q, k, v, do)()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    run = _grads(lambda q, k, v: fmha_dsl.attention(q, k, v, causal=causal), q, k, v, do)
    got = run()
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.perf_counter() - t0, 3)
    row["rel_err"] = _rel(got, ref)
    if not math.isfinite(row["rel_err"]) or row["rel_err"] > 3e-2:
        row["default"] = {"error": f"wrong gradients (rel err {row['rel_err']:.3g})"}
    else:
        ms = _bench(run)
        row["default"] = {"ms": ms, "tflops": f / ms / 1e9, "kernel": _chosen(q, k, v, causal)}
    for name in peers:
        try:
            prun = _grads(_peer_forward(name, causal), q, k, v, do)
            prun()
            ms = _bench(prun)
            row[name] = {"ms": ms, "tflops": f / ms / 1e9}
        except Exception as exc:  # noqa: BLE001  (a peer without this shape is recorded, not fatal)
            row[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    return row


def _chosen(q, k, v, causal) -> str | None:
    """The main-stage kernel first use decided for the backward of ``attention(q, k, v, causal=causal)``: the
    decision of this call's class itself, not the last plan a dispatcher made (an earlier class may have made it)."""
    import fmha_dsl
    from fmha_dsl.attention_args import torch_dtype_names

    b, hq, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    p = fmha_dsl.Problem(family="bwd_dq_dk_dv", dtype=torch_dtype_names()[q.dtype], batch=b,
                         nhead_q=hq, nhead_k=hk, seqlen_q=sq, seqlen_k=sk, max_seqlen_q=sq, max_seqlen_k=sk, hdim_q=d,
                         hdim_v=dv, mask="top_left" if causal else "no")
    for disp in sys.modules["fmha_dsl.attention"]._JIT.values():
        name = disp.decided_kernel(p, True) or disp.decided_kernel(p, False)
        if name:
            return name
    return None


def costs(kind: str, seqlens) -> list:
    """bf16 d128, causal and not: the explicit backward with ``deterministic`` (or in group mode) against the same
    call without it."""
    import torch

    import fmha_dsl

    rows = []
    for causal in (False, True):
        for s in seqlens:
            b = TOKENS // s
            q, k, v, do = _tensors("bf16", b, HEADS, s, 128, seed=1)
            out, lse = fmha_dsl.attention(q, k, v, causal=causal, return_lse=True)
            base = _bench_bwd(q, k, v, out, lse, do, causal=causal)
            if kind == "deterministic":
                other = _bench_bwd(q, k, v, out, lse, do, causal=causal, deterministic=True)
            else:
                tq = q.transpose(1, 2).reshape(b * s, HEADS, 128)
                tk = k.transpose(1, 2).reshape(b * s, HEADS, 128)
                tv = v.transpose(1, 2).reshape(b * s, HEADS, 128)
                tdo = do.transpose(1, 2).reshape(b * s, HEADS, 128)
                cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device="cuda")
                kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)
                gout, glse = fmha_dsl.attention(tq, tk, tv, causal=causal, return_lse=True, **kw)
                other = _bench_bwd(tq, tk, tv, gout, glse, tdo, causal=causal, **kw)
            f = flops(b, HEADS, s, s, 128, causal)
            row = {"seqlen": s, "causal": causal, "base_tflops": f / base / 1e9, kind + "_tflops": f / other / 1e9,
                   "ratio": base / other}
            rows.append(row)
            print(f"{kind:13s} S={s:5d} causal={causal!s:5s} base {row['base_tflops']:6.1f}  {kind} "
                  f"{row[kind + '_tflops']:6.1f} TFLOP/s  ({row['ratio']:.3f}x)", flush=True)
    return rows


def _bench_bwd(q, k, v, out, lse, do, **kw) -> float:
    import fmha_dsl

    fmha_dsl.attention_backward(q, k, v, out, lse, do, **kw)
    return _bench(lambda: fmha_dsl.attention_backward(q, k, v, out, lse, do, **kw))


def _line(row) -> str:
    def tf(name):
        x = row.get(name) or {}
        return f"{x['tflops']:6.1f}" if "tflops" in x else "   n/a"
    return (f"{row['dtype']} d{row['d']:3d} S={row['seqlen']:5d} causal={row['causal']!s:5s}  default {tf('default')}  "
            f"flash {tf('flash')}  cudnn {tf('cudnn')}  efficient {tf('efficient')}  flex {tf('flex')} TFLOP/s  "
            f"(first call {row['first_call_s']:.2f} s, err {row['rel_err']:.1e})")


def summarize(doc) -> None:
    rows = [r for r in doc["rows"] if "tflops" in r.get("default", {})]
    out = {}
    for peer in ("flash", "cudnn", "efficient", "flex"):
        ratios = [r["default"]["tflops"] / r[peer]["tflops"] for r in rows if "tflops" in r.get(peer, {})]
        if ratios:
            out[peer] = {"geomean": math.exp(sum(math.log(x) for x in ratios) / len(ratios)), "min": min(ratios),
                         "at_least_1": sum(x >= 1.0 for x in ratios), "n": len(ratios)}
    doc["summary"] = out
    for peer, s in out.items():
        print(f"default / {peer}: geomean {s['geomean']:.3f}, min {s['min']:.3f}, >= 1 on {s['at_least_1']}/{s['n']}")


if __name__ == "__main__":
    main()
